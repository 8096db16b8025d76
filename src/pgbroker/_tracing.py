"""The spans and trace headers of pgbroker.tracing (see there), for the clients and the worker.

Every function here returns at once, or a shared no-op context manager, while tracing is off
(pgbroker.tracing.instrument() not called): opentelemetry is imported only once it is on.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

from pgbroker.errors import PgbrokerError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanKind, Tracer, TracerProvider

__all__ = [
    "carry",
    "clock",
    "exchanged",
    "instrument",
    "processing",
    "received",
    "sent",
    "settled",
    "span",
    "uninstrument",
]

SYSTEM = "pgbroker"
TRACEPARENT = "traceparent"

# Each operation's span kind and messaging.operation.type.
_OPERATIONS = {
    "send": ("PRODUCER", "send"),
    "receive": ("CONSUMER", "receive"),
    "process": ("CONSUMER", "process"),
    "ack": ("CLIENT", "settle"),
    "nack": ("CLIENT", "settle"),
    "settle": ("CLIENT", "settle"),
}


class Delivered(Protocol):
    """What a span needs of a message read: its id and headers (a queue's Message)."""

    @property
    def msg_id(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, Any] | None: ...


_tracer: Tracer | None = None
_OFF: AbstractContextManager[None] = nullcontext()


def instrument(tracer_provider: TracerProvider | None = None) -> None:
    """Trace pgbroker's sends, reads, acks and handler runs with ``tracer_provider`` (default:
    the global one, as the OpenTelemetry SDK or its auto-configuration set it)."""
    global _tracer
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise PgbrokerError(
            "tracing needs the OpenTelemetry API, which is not installed",
            hint="pip install 'pgbroker[otel]', plus an SDK and exporter (opentelemetry-sdk).",
        ) from exc
    _tracer = trace.get_tracer("pgbroker", tracer_provider=tracer_provider)


def uninstrument() -> None:
    """Stop tracing: the calls after this one make no span and add no header."""
    global _tracer
    _tracer = None


def span(operation: str, queue: str) -> AbstractContextManager[Span | None]:
    """The span of one client call on ``queue``, current inside the block; None when tracing is
    off. ``operation``: send, receive, ack or nack."""
    if _tracer is None:
        return _OFF
    return _started(_tracer, operation, queue)


def processing(
    queue: str, headers: Mapping[str, Any] | None, msg_id: int, *, group: str | None = None
) -> AbstractContextManager[Any]:
    """The span of a handler's run on one message of a queue (or of a stream, read by consumer
    ``group``): a child of the creation context in ``headers`` (a new trace when they carry none)."""
    if _tracer is None:
        return _OFF
    from opentelemetry import propagate

    creation = propagate.extract(headers or {})
    return _started(_tracer, "process", queue, creation, _links([creation]), msg_id, group)


def carry(
    current: Span | None, messages: Iterable[Any], headers: Sequence[Mapping[str, Any] | None] | None
) -> tuple[Iterable[Any], Sequence[Mapping[str, Any] | None] | None]:
    """The messages of a send and their headers, with the send span's context written into the
    headers of each message that does not carry a traceparent of its own."""
    if current is None or not current.get_span_context().is_valid:
        return messages, headers
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)  # the current context: the send span
    listed = list(messages)
    if len(listed) != 1:  # the conventions keep the count for batches
        current.set_attribute("messaging.batch.message_count", len(listed))
    given = list(headers) if headers is not None else [None] * len(listed)
    return listed, [h if h and TRACEPARENT in h else {**(h or {}), **carrier} for h in given]


def sent(current: Span | None, msg_ids: Sequence[int]) -> None:
    """What a send returned: the message's id when it sent one."""
    if current is not None and len(msg_ids) == 1:
        current.set_attribute("messaging.message.id", str(msg_ids[0]))


def received(current: Span | None, messages: Sequence[Delivered]) -> None:
    """What a read returned: which messages, and a link to each one's creation context."""
    if current is None or not current.is_recording():
        return
    from opentelemetry import propagate

    settled(current, [message.msg_id for message in messages])
    for link in _links(propagate.extract(message.headers or {}) for message in messages):
        current.add_link(link.context)


def clock() -> int | None:
    """The start of a worker's round trip, for exchanged(); None when tracing is off."""
    return None if _tracer is None else time.time_ns()


def exchanged(queue: str, started: int | None, read: Sequence[Delivered], outcomes: int) -> None:
    """A worker's round trip since ``started``, that recorded ``outcomes`` (acks and failures)
    and read ``read``, as a span made after the fact: ``receive <queue>`` when it read messages
    (with messaging.pgbroker.settled_count when it also recorded outcomes), ``settle <queue>``
    when it only recorded outcomes, and none for an empty poll (an idle worker polls often)."""
    if _tracer is None or started is None or not (read or outcomes):
        return
    operation = "receive" if read else "settle"
    kind, _ = _OPERATIONS[operation]
    current = _tracer.start_span(
        f"{operation} {queue}", kind=_kind(kind), attributes=_attributes(operation, queue), start_time=started
    )
    if read:
        received(current, read)
        if outcomes:
            current.set_attribute("messaging.pgbroker.settled_count", outcomes)
    else:
        current.set_attribute("messaging.batch.message_count", outcomes)
    current.end()


def settled(current: Span | None, msg_ids: Sequence[int]) -> None:
    """The messages of a read, ack or nack: one's id, or how many (the conventions' batch count)."""
    if current is None:
        return
    if len(msg_ids) == 1:
        current.set_attribute("messaging.message.id", str(msg_ids[0]))
    else:
        current.set_attribute("messaging.batch.message_count", len(msg_ids))


@contextmanager
def _started(
    tracer: Tracer,
    operation: str,
    queue: str,
    parent: Context | None = None,
    links: Sequence[Link] = (),
    msg_id: int | None = None,
    group: str | None = None,
) -> Iterator[Span]:
    kind, _ = _OPERATIONS[operation]
    attributes = _attributes(operation, queue)
    if msg_id is not None:
        attributes["messaging.message.id"] = str(msg_id)
    if group is not None:
        attributes["messaging.consumer.group.name"] = group
    with tracer.start_as_current_span(
        f"{operation} {queue}", context=parent, kind=_kind(kind), attributes=attributes, links=links
    ) as current:
        try:
            yield current
        except Exception as exc:
            current.set_attribute("error.type", type(exc).__qualname__)
            raise


def _attributes(operation: str, queue: str) -> dict[str, str]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": _OPERATIONS[operation][1],
        "messaging.destination.name": queue,
    }


def _kind(name: str) -> SpanKind:
    from opentelemetry.trace import SpanKind

    return SpanKind[name]


def _links(contexts: Iterable[Context]) -> list[Link]:
    """A link to each creation context that names a span."""
    from opentelemetry.trace import Link, get_current_span

    found = (get_current_span(context).get_span_context() for context in contexts)
    return [Link(span_context) for span_context in found if span_context.is_valid]
