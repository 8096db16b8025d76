"""Rows as the client's records: messages (their bodies decoded by codec, or left as stored),
ids, scalars, metrics and queue listings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pgbroker import codecs
from pgbroker.codecs import CodecError
from pgbroker.queues._query import Row
from pgbroker.queues._records import Message, Metrics, QueueInfo, Receipt, build_message


def message(row: Row) -> Message:
    stored = stored_message(row)
    if stored.codec == codecs.JsonCodec.name:  # not an envelope: the JSON fast path
        return stored
    try:
        body = codecs.from_stored(stored.message)
    except CodecError as exc:
        # Not an error of the read: the message is leased all the same, and the caller decides
        # (the worker fails it, so that it is retried and, in the end, dead-lettered).
        return replace(stored, codec_error=exc)
    return replace(stored, message=body.value, codec=body.codec)


def stored_message(row: Row) -> Message:
    """A message with its body as stored, undecoded (a binary body stays its JSON envelope) and
    its codec named: what a bridge forwards as it is, without the codec's schema or class."""
    receipt = Receipt.issued(row[7]) if len(row) > 7 and row[7] is not None else None
    msg_id, read_ct, enqueued_at, last_read_at, vt, stored, headers = row[:7]
    codec = codecs.envelope_codec(stored) if codecs.is_envelope(stored) else codecs.JsonCodec.name
    return build_message(
        msg_id, read_ct, enqueued_at, last_read_at, vt, stored, headers, receipt, codec, None
    )


def as_made(records: list[Message]) -> list[Message]:
    """The messages a Query's ``row`` made of its rows, as they are."""
    return records


def ids(rows: list[Row]) -> list[int]:
    return [row[0] for row in rows]


def scalar(rows: list[Row]) -> Any:
    return rows[0][0]


def nothing(rows: list[Row]) -> None:
    return None


def metrics(rows: list[Row]) -> list[Metrics]:
    return [Metrics(*row) for row in rows]


def queue_infos(rows: list[Row]) -> list[QueueInfo]:
    return [QueueInfo(*row) for row in rows]
