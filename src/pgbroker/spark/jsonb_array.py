"""An Arrow column of JSON text as one Postgres jsonb[] parameter, in the binary wire format.

Built with pyarrow and numpy (no Python object per row), so the array goes from Spark's Arrow
batches to pgmq.send_batch without a staging table: the server parses each element's JSON once,
in array_recv, as COPY would have, and skips writing, scanning and aggregating a temporary table.

The format (array_send): ndim, has-nulls flag, element type oid, then per dimension its length
and lower bound; then per element its byte length (-1 for NULL) and bytes. A jsonb element's
bytes are a version byte (1) and the JSON text.
"""

from __future__ import annotations

import struct
from typing import Any

from psycopg.adapt import Buffer, Dumper
from psycopg.pq import Format

JSONB_OID = 3802
JSONB_ARRAY_OID = 3807
_JSONB_VERSION = 1


class JsonbArray:
    """A jsonb[] value already in binary wire format; bind it with a %b placeholder."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class JsonbArrayDumper(Dumper):
    format = Format.BINARY
    oid = JSONB_ARRAY_OID

    def dump(self, obj: Any) -> Buffer:
        assert isinstance(obj, JsonbArray)
        return obj.data


def jsonb_array(column: Any) -> JsonbArray:
    """A pyarrow string Array or ChunkedArray (nulls allowed) as a one-dimensional jsonb[].

    The JSON is not checked here: the server's jsonb input does, as for any send.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    values = values.cast(pa.large_binary())  # one offset width, whatever Spark sent
    n = len(values)
    nulls = values.null_count
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.binary_length(values), 0).to_numpy()
    # Each element's header: its length (including the version byte) and the version byte.
    head = np.empty(n, dtype=[("length", ">i4"), ("version", "u1")])
    head["length"] = np.where(valid, lengths + 1, -1)
    head["version"] = _JSONB_VERSION
    head_bytes = head.view(np.uint8).reshape(-1)
    sizes = np.full(n, 5, dtype=np.int64)
    if nulls:
        # A NULL element is its length (-1) alone.
        keep = np.ones(5 * n, dtype=bool)
        keep[np.flatnonzero(~valid) * 5 + 4] = False
        head_bytes = head_bytes[keep]
        sizes[~valid] = 4
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    heads = pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(head_bytes)]
    )
    # Header then JSON, element after element: the joined array's data buffer is the body.
    empty = pa.scalar(b"", pa.large_binary())
    joined = pc.binary_join_element_wise(heads, pc.fill_null(values, empty), empty)
    bounds = np.frombuffer(joined.buffers()[1], dtype=np.int64, count=n + 1, offset=joined.offset * 8)
    body = joined.buffers()[2][int(bounds[0]) : int(bounds[n])]
    header = struct.pack(">iiiii", 1, 1 if nulls else 0, JSONB_OID, n, 1)
    return JsonbArray(header + body.to_pybytes())
