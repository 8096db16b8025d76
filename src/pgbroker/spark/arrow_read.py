"""Rows out of Postgres as Arrow record batches: COPY ... TO STDOUT in CSV, parsed by pyarrow.

Why CSV and not fetched tuples: pyarrow's CSV parser is C++ and builds the columns directly,
where a cursor would make a Python object per value (a datetime per timestamp) only to turn it
back into Arrow. The server's cost is the same either way (jsonb to text dominates). CSV rows
from COPY never contain a raw newline outside quotes, and jsonb text never contains one at all,
so the stream can be cut into blocks at any newline.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from typing import Any

from psycopg import sql

from pgbroker.spark.connect import Connection
from pgbroker.spark.schema import arrow_types

# Parse at least this much at a time: large enough that pyarrow's per-call overhead vanishes,
# small enough that a worker's memory does not grow with the partition.
BLOCK_BYTES = 8 * 1024 * 1024


def copy_batches(conn: Connection, select: sql.Composable, columns: Sequence[str]) -> Iterator[Any]:
    """Run ``COPY (select) TO STDOUT`` and yield pyarrow RecordBatches of ``columns``.

    ``select`` must return exactly ``columns``, in that order.
    """
    import pyarrow as pa
    from pyarrow import csv

    types = arrow_types(columns)
    read_options = csv.ReadOptions(column_names=list(columns), block_size=BLOCK_BYTES * 2)
    convert_options = csv.ConvertOptions(
        column_types=types,
        # COPY's CSV writes NULL as an unquoted empty field and an empty string as "".
        null_values=[""],
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )
    parse_options = csv.ParseOptions(newlines_in_values=False)
    schema = pa.schema([(name, types[name]) for name in columns])

    def parse(block: bytes) -> Iterator[Any]:
        table = csv.read_csv(
            io.BytesIO(block),
            read_options=read_options,
            parse_options=parse_options,
            convert_options=convert_options,
        )
        yield from table.cast(schema).to_batches()

    statement = sql.SQL("COPY ({}) TO STDOUT (FORMAT csv)").format(select)
    pending = bytearray()
    with conn.cursor() as cur, cur.copy(statement) as copy:
        for chunk in copy:
            pending += chunk
            if len(pending) >= BLOCK_BYTES:
                cut = pending.rfind(b"\n") + 1
                if cut:
                    yield from parse(bytes(pending[:cut]))
                    del pending[:cut]
    if pending:
        yield from parse(bytes(pending))
