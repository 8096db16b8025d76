"""The options of the ``pgbroker`` Spark data source: names, defaults, and validation.

Pure Python (no Spark, no database), so that a bad option fails on the driver with a message that
names it, before any task runs. Spark hands options over as a case-insensitive mapping of strings.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from pgbroker.errors import InvalidArgument

QUEUE_COLUMNS = ("msg_id", "read_ct", "enqueued_at", "last_read_at", "vt", "message", "headers")
ARCHIVE_COLUMNS = (*QUEUE_COLUMNS, "archived_at")

Mode = Literal["log", "claim"]
Release = Literal["archive", "delete", "none"]
Start = Literal["earliest", "latest"]

# The spelling users see in messages; Spark lower-cases keys before we get them.
_BODY_OPTIONS = ("codec", "avroSchema", "protobufClass")
_READ_OPTIONS = (
    "queue",
    "dsn",
    "numPartitions",
    "archive",
    "columns",
    "mode",
    "maxRowsPerBatch",
    "release",
    "consumer",
    "leaseSeconds",
    "startingOffset",
    "watermarkWaitMs",
    *_BODY_OPTIONS,
)
_WRITE_OPTIONS = ("queue", "dsn", *_BODY_OPTIONS)
CODECS = ("json", "msgpack", "avro", "protobuf")
# Options Spark itself adds to what the user gave.
_SPARK_OPTIONS = frozenset({"path", "paths", "checkpointlocation", "queryname"})

DEFAULT_LEASE_SECONDS = 300
DEFAULT_WATERMARK_WAIT_MS = 2000
# A claim reads at most this many messages when Spark asks for everything available.
MAX_CLAIM = 100_000


class OptionError(InvalidArgument):
    """A data source option is missing, unknown, or has a value it cannot take."""


@dataclass(frozen=True)
class BodyOptions:
    """How message bodies are read or written (pgbroker.spark.bodies; docs/codecs.md)."""

    codec: str  # one of CODECS
    avro_schema: str | None = None  # the schema's JSON text (codec avro)
    protobuf_class: str | None = None  # "module:Class", importable on the executors (codec protobuf)


@dataclass(frozen=True)
class ReadOptions:
    queue: str
    dsn: str
    num_partitions: int
    archive: bool
    columns: tuple[str, ...]
    mode: Mode
    max_rows_per_batch: int | None
    release: Release
    consumer: str | None
    lease_seconds: int
    starting_offset: Start
    watermark_wait_ms: int
    body: BodyOptions | None = None  # None: message is the stored JSON text, as it always was


@dataclass(frozen=True)
class WriteOptions:
    queue: str
    dsn: str
    body: BodyOptions | None = None


def parse_read(options: Mapping[str, str]) -> ReadOptions:
    """Validated read options (batch and streaming share them)."""
    opts = _Options(options, _READ_OPTIONS)
    archive = opts.boolean("archive", False)
    available = ARCHIVE_COLUMNS if archive else QUEUE_COLUMNS
    mode = cast(Mode, opts.choice("mode", ("log", "claim"), "log"))
    release_default = "none" if archive else "archive"
    release = cast(Release, opts.choice("release", ("archive", "delete", "none"), release_default))
    if archive and release != "none":
        raise OptionError(
            f"release={release} cannot apply to the archive: a stream of the archive never releases",
            hint="Drop the release option, or read the queue itself (archive=false).",
        )
    if archive and mode == "claim":
        raise OptionError(
            "mode=claim reads the queue with leases; the archive has none",
            hint="Read the archive in log mode (the default).",
        )
    consumer = opts.text("consumer")
    if mode == "claim" and not consumer:
        raise OptionError(
            "mode=claim needs option consumer: a name for this streaming query's claims",
            hint="For example .option('consumer', 'orders-to-lake'); keep it across restarts, "
            "and give every query its own.",
        )
    if mode == "claim" and release == "none":
        raise OptionError(
            "mode=claim needs release=archive or release=delete: an unacknowledged claim would be "
            "delivered again to the queue's other consumers once its lease ran out",
            hint="Drop the release option (archive is the default).",
        )
    if mode == "log" and consumer:
        raise OptionError("option consumer applies to mode=claim only", hint="Add .option('mode', 'claim').")
    return ReadOptions(
        queue=opts.queue(),
        dsn=opts.dsn(),
        num_partitions=opts.integer("numPartitions", default_partitions(), minimum=1),
        archive=archive,
        columns=opts.columns(available),
        mode=mode,
        max_rows_per_batch=opts.optional_integer("maxRowsPerBatch", minimum=1),
        release=release,
        consumer=consumer,
        lease_seconds=opts.integer("leaseSeconds", DEFAULT_LEASE_SECONDS, minimum=3),
        starting_offset=cast(Start, opts.choice("startingOffset", ("earliest", "latest"), "earliest")),
        watermark_wait_ms=opts.integer("watermarkWaitMs", DEFAULT_WATERMARK_WAIT_MS, minimum=0),
        body=opts.body(),
    )


def parse_write(options: Mapping[str, str]) -> WriteOptions:
    opts = _Options(options, _WRITE_OPTIONS)
    return WriteOptions(queue=opts.queue(), dsn=opts.dsn(), body=opts.body())


def default_partitions() -> int:
    """One partition per core of the driver's machine: what local[*] runs in parallel."""
    return max(1, os.cpu_count() or 1)


class _Options:
    """Typed access to Spark's string options, refusing names the source does not know."""

    def __init__(self, options: Mapping[str, str], known: tuple[str, ...]) -> None:
        self.values = {key.lower(): value for key, value in options.items()}
        self.spelling = {name.lower(): name for name in known}
        for key in self.values:
            if key in self.spelling or key in _SPARK_OPTIONS or key.startswith("spark."):
                continue
            close = difflib.get_close_matches(key, list(self.spelling), n=1)
            guess = f" (did you mean {self.spelling[close[0]]!r}?)" if close else ""
            raise OptionError(
                f"unknown option {key!r} for the pgbroker data source{guess}",
                hint="Options here: " + ", ".join(known) + ".",
            )

    def text(self, name: str) -> str | None:
        value = self.values.get(name.lower())
        return value.strip() if value is not None and value.strip() else None

    def queue(self) -> str:
        queue = self.text("queue")
        if queue is None:
            raise OptionError("option queue is required", hint="For example .option('queue', 'orders').")
        return queue

    def dsn(self) -> str:
        # The driver resolves it; the executors get it inside the pickled reader or writer, so
        # they need no environment of their own.
        dsn = self.text("dsn") or os.environ.get("DATABASE_URL", "").strip()
        if not dsn:
            raise OptionError(
                "no database: set option dsn or DATABASE_URL",
                hint="For example .option('dsn', 'postgresql://user@host:5432/db').",
            )
        return dsn

    def boolean(self, name: str, default: bool) -> bool:
        value = self.text(name)
        if value is None:
            return default
        if value.lower() in ("true", "1", "yes"):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
        raise OptionError(f"option {name} must be true or false, got {value!r}")

    def optional_integer(self, name: str, *, minimum: int) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            number = int(value.replace("_", ""))
        except ValueError:
            raise OptionError(f"option {name} must be a whole number, got {value!r}") from None
        if number < minimum:
            raise OptionError(f"option {name} must be at least {minimum}, got {number}")
        return number

    def integer(self, name: str, default: int, *, minimum: int) -> int:
        number = self.optional_integer(name, minimum=minimum)
        return default if number is None else number

    def choice(self, name: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.text(name)
        if value is None:
            return default
        if value.lower() not in allowed:
            raise OptionError(f"option {name} must be one of {', '.join(allowed)}, got {value!r}")
        return value.lower()

    def body(self) -> BodyOptions | None:
        codec = self.text("codec")
        avro_schema, protobuf_class = self.text("avroSchema"), self.text("protobufClass")
        if codec is None and avro_schema is None and protobuf_class is None:
            return None
        codec = self.choice("codec", CODECS, "")
        if (codec == "avro") != (avro_schema is not None):
            raise OptionError(
                "option avroSchema goes with codec=avro, and codec=avro needs it",
                hint="For example .option('codec', 'avro').option('avroSchema', json.dumps(schema)).",
            )
        if (codec == "protobuf") != (protobuf_class is not None):
            raise OptionError(
                "option protobufClass goes with codec=protobuf, and codec=protobuf needs it",
                hint="For example .option('protobufClass', 'shop.orders_pb2:Order') "
                "(a module the executors can import).",
            )
        return BodyOptions(codec, avro_schema, protobuf_class)

    def columns(self, available: tuple[str, ...]) -> tuple[str, ...]:
        value = self.text("columns")
        if value is None:
            return available
        wanted = [c.strip().lower() for c in value.split(",") if c.strip()]
        unknown = [c for c in wanted if c not in available]
        if unknown or not wanted:
            raise OptionError(
                f"option columns: {', '.join(map(repr, unknown)) or 'no column'} "
                f"{'is' if len(unknown) == 1 else 'are'} not a column here",
                hint="Choose among " + ", ".join(available) + ".",
            )
        if len(set(wanted)) != len(wanted):
            raise OptionError(f"option columns names a column twice: {value!r}")
        # In table order, whatever order they were given in: one schema per selection.
        return tuple(c for c in available if c in wanted)
