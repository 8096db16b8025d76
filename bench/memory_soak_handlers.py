"""The handlers of bench.memory_soak's worker processes, in a module of their own so that those
processes import pgbroker and nothing of the bench (whose imports would count in their memory)."""

from __future__ import annotations

from pgbroker import App, Message, StreamMessage

STREAM = "soak_stream"
GROUP = "soak"


async def queue_handler(message: Message) -> None:
    """The queue worker's handler: reads the payload and does nothing more."""
    _ = message.message["n"]


stream_app = App()


@stream_app.stream_handler(STREAM, GROUP, concurrency=16, batch_size=500)
async def stream_handler(message: StreamMessage) -> None:
    _ = message.message["n"]
