"""OpenTelemetry traces (pgbroker.tracing), recorded by the SDK's own in-memory exporter: a span per
send, read and ack of the clients, a consumer span per handler run in a real worker, parented to
the producer's context that the message's headers carried (W3C traceparent and tracestate); and
nothing at all, not even a header, until tracing is instrumented."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from pgbroker import AsyncBroker, Broker, Message, Stream, StreamMessage, StreamWorker, Worker, tracing
from tests.support.worker import run_until


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into a provider of the test's own (the global one is left alone)."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing.instrument(tracer_provider=provider)
    try:
        yield exported
    finally:
        tracing.uninstrument()
        provider.shutdown()


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def ids(span: ReadableSpan) -> tuple[int, int]:
    """(trace_id, span_id) of a finished span."""
    context = span.get_span_context()
    assert context is not None
    return context.trace_id, context.span_id


def traceparent_of(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def test_send_read_and_ack_each_make_a_span_and_the_send_context_travels_in_the_headers(
    broker: Broker, exporter: InMemorySpanExporter
) -> None:
    orders = broker.create_queue("orders")
    msg_id = orders.send({"n": 1}, headers={"tenant": "a"})
    [message] = orders.read_many(10, vt=30)
    orders.ack(message)

    [send] = spans(exporter, "send orders")
    assert send.kind is SpanKind.PRODUCER
    assert send.attributes == {
        "messaging.system": "pgbroker",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "orders",
        "messaging.message.id": str(msg_id),
    }
    assert message.headers == {"tenant": "a", "traceparent": traceparent_of(send)}

    [receive] = spans(exporter, "receive orders")
    assert receive.kind is SpanKind.CONSUMER
    assert receive.attributes is not None
    assert receive.attributes["messaging.operation.type"] == "receive"
    assert receive.attributes["messaging.message.id"] == str(msg_id)
    assert [(link.context.trace_id, link.context.span_id) for link in receive.links] == [ids(send)]

    [ack] = spans(exporter, "ack orders")
    assert ack.kind is SpanKind.CLIENT
    assert ack.attributes is not None
    assert (ack.attributes["messaging.operation.type"], ack.attributes["messaging.message.id"]) == (
        "settle",
        str(msg_id),
    )


def test_a_batch_send_carries_one_context_to_every_message_and_keeps_a_callers_own(
    broker: Broker, exporter: InMemorySpanExporter
) -> None:
    jobs = broker.create_queue("jobs")
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    jobs.send_many([1, 2, 3], headers=[None, {"traceparent": own}, {"k": 1}])
    [send] = spans(exporter, "send jobs")
    assert send.attributes is not None
    assert send.attributes["messaging.batch.message_count"] == 3
    ours = traceparent_of(send)
    assert [m.headers for m in jobs.read_many(3, vt=30)] == [
        {"traceparent": ours},
        {"traceparent": own},
        {"k": 1, "traceparent": ours},
    ]


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_handler_runs_in_a_consumer_span_whose_parent_is_the_producers_send(
    broker: Broker, dsn: str, exporter: InMemorySpanExporter, kind: str
) -> None:
    broker.create_queue("jobs")
    app_tracer = trace.get_tracer("the-app", tracer_provider=tracing_provider(exporter))
    with app_tracer.start_as_current_span("checkout") as checkout:
        broker.queue("jobs").send({"n": 1})
    seen: list[Any] = []

    def record() -> None:
        seen.append(trace.get_current_span().get_span_context())

    async def handle_async(message: Message) -> None:
        record()

    def handle_sync(message: Message) -> None:
        record()

    worker = Worker("jobs", handle_async if kind == "async" else handle_sync)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed == 1))

    [send] = spans(exporter, "send jobs")
    [process] = spans(exporter, "process jobs")
    assert send.parent is not None
    assert send.parent.span_id == checkout.get_span_context().span_id
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is not None
    assert (process.parent.trace_id, process.parent.span_id) == ids(send)
    assert [(link.context.trace_id, link.context.span_id) for link in process.links] == [ids(send)]
    assert process.attributes is not None
    assert process.attributes["messaging.operation.type"] == "process"
    # The handler's own spans nest under the consumer span, in a thread as on the event loop.
    assert [(c.trace_id, c.span_id) for c in seen] == [ids(process)]
    # The worker's round trips that read it and acked it (empty polls make no span).
    [receive] = spans(exporter, "receive jobs")
    assert [(link.context.trace_id, link.context.span_id) for link in receive.links] == [ids(send)]
    [settle] = spans(exporter, "settle jobs")
    assert settle.attributes is not None
    assert settle.attributes["messaging.batch.message_count"] == 1


def test_a_failing_handler_leaves_an_error_on_its_span(
    broker: Broker, dsn: str, exporter: InMemorySpanExporter
) -> None:
    broker.create_queue("jobs").send({"n": 1})

    async def fail(message: Message) -> None:
        raise ValueError("no stock")

    worker = Worker("jobs", fail)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.retried + worker.stats.dead_lettered >= 1))
    [process] = spans(exporter, "process jobs")
    assert process.status.status_code is StatusCode.ERROR
    assert process.attributes is not None
    assert process.attributes["error.type"] == "ValueError"
    assert [event.name for event in process.events] == ["exception"]


def test_the_asyncio_client_is_traced_too(dsn: str, exporter: InMemorySpanExporter) -> None:
    async def main() -> dict[str, Any] | None:
        async with AsyncBroker(dsn) as broker:
            jobs = await broker.create_queue("jobs")
            await jobs.send({"n": 1})
            [message] = await jobs.read_many(1, vt=30)
            await jobs.ack_many([message])
            return message.headers

    headers = asyncio.run(main())
    [send] = spans(exporter, "send jobs")
    assert headers == {"traceparent": traceparent_of(send)}
    assert [len(spans(exporter, name)) for name in ("receive jobs", "ack jobs")] == [1, 1]


def test_nothing_is_traced_nor_carried_until_instrumented(broker: Broker) -> None:
    jobs = broker.create_queue("jobs")
    provider = TracerProvider()
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    with trace.get_tracer("the-app", tracer_provider=provider).start_as_current_span("checkout"):
        jobs.send({"n": 1})
    [message] = jobs.read_many(1, vt=30)
    assert message.headers is None
    assert [span.name for span in exported.get_finished_spans()] == ["checkout"]


def tracing_provider(exporter: InMemorySpanExporter) -> TracerProvider:
    """A provider of the app's own spans, exporting to the same exporter."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_a_stream_send_and_its_stream_worker_handler_are_traced_alike(
    broker: Broker, dsn: str, exporter: InMemorySpanExporter
) -> None:
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=2)
    clicks.create_group("g", start="start")
    sent = clicks.send({"n": 1}, key="user-1")
    seen: list[Any] = []

    async def handle(message: StreamMessage) -> None:
        seen.append(trace.get_current_span().get_span_context())

    worker = StreamWorker("clicks", "g", handle)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed == 1))

    [send] = spans(exporter, "send clicks")
    assert send.kind is SpanKind.PRODUCER
    assert send.attributes is not None
    assert send.attributes["messaging.message.id"] == str(sent)
    [process] = spans(exporter, "process clicks")
    assert process.parent is not None
    assert (process.parent.trace_id, process.parent.span_id) == ids(send)
    assert process.attributes is not None
    assert process.attributes["messaging.consumer.group.name"] == "g"
    assert [(c.trace_id, c.span_id) for c in seen] == [ids(process)]


def test_a_traced_send_retried_with_its_idempotency_key_is_the_same_request(
    broker: Broker, exporter: InMemorySpanExporter
) -> None:
    """Each try carries a new traceparent; the key still finds the first try, not another request."""
    orders = broker.create_queue("orders")
    first = orders.send_many([{"n": 1}, {"n": 2}], headers=[{"tenant": "a"}, None], idempotency_key="k-1")
    again = orders.send_many([{"n": 1}, {"n": 2}], headers=[{"tenant": "a"}, None], idempotency_key="k-1")
    assert again == first
    assert [m.msg_id for m in orders.read_many(10, vt=30)] == first
    first_send, second_send = spans(exporter, "send orders")
    assert traceparent_of(first_send) != traceparent_of(second_send)
    stream = Stream(broker, "clicks")
    stream.create(partitions=1)
    sent = stream.send_many([{"n": 1}], keys=["u"], idempotency_key="k-2")
    assert stream.send_many([{"n": 1}], keys=["u"], idempotency_key="k-2") == sent
