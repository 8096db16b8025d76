"""The W3C trace context crosses the bridges (pgbroker.tracing): a message sent into pgbroker with
tracing on, bridged out to each broker and back in, reaches the inbound queue with the
traceparent and tracestate of its send, so that its consumers continue the producer's trace."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pgbroker import Broker, tracing
from pgbroker.bridge import InboundBridge, InboundSettings, OutboundBridge, OutboundSettings
from pgbroker.queues._client_async import AsyncBroker

STATE = "vendor=opaque"


def test_the_trace_context_of_a_send_comes_back_through_each_broker(
    dsn: str, broker_urls: Callable[[], Any]
) -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing.instrument(tracer_provider=provider)
    try:
        with Broker(dsn) as broker:
            outbox = broker.create_queue("outbox")
            broker.create_queue("inbox")
            outbox.send({"n": 1}, headers={"tracestate": STATE})
    finally:
        tracing.uninstrument()
    [send] = [span for span in exported.get_finished_spans() if span.name == "send outbox"]
    context = send.get_span_context()
    assert context is not None
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"

    async def scenario() -> None:
        async with broker_urls() as (out_url, in_url), AsyncBroker(dsn) as abroker:
            inbound = InboundBridge(abroker, None, "inbox", in_url, InboundSettings(declare=True, ack_wait=5))
            outbound = OutboundBridge(abroker, "outbox", out_url, OutboundSettings(declare=True))
            tasks = [asyncio.create_task(inbound.run())]
            try:
                async with asyncio.timeout(20):
                    await inbound.receiving.wait()  # MQTT and a new Redis group keep only what follows
                tasks.append(asyncio.create_task(outbound.run()))
                async with asyncio.timeout(60):
                    while inbound.stats.received < 1:
                        for task in tasks:
                            if task.done():
                                task.result()
                        await asyncio.sleep(0.05)
            finally:
                outbound.stop()
                inbound.stop()
                await asyncio.gather(*tasks)

    asyncio.run(scenario())
    with Broker(dsn) as broker:
        [message] = broker.queue("inbox").read_many(1, vt=30)
    assert message.headers is not None
    assert (message.headers.get("traceparent"), message.headers.get("tracestate")) == (traceparent, STATE)
    assert trace.get_current_span().get_span_context().is_valid is False  # nothing leaked into the test
