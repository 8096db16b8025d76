"""Streams: the stream clients and the records they return.

AsyncStream and AsyncStreamConsumer (_client_async.py) are the one written copy; Stream and
StreamConsumer (_client.py) are generated from them by scripts/async_to_sync.py. The queries
(_queries.py) and the records (_records.py) are private modules: import from here.
"""

from pgbroker.streams._client import Stream, StreamConsumer
from pgbroker.streams._client_async import AsyncStream, AsyncStreamConsumer
from pgbroker.streams._records import PartitionLag, StreamBatch, StreamGroupInfo, StreamInfo, StreamMessage

__all__ = [
    "AsyncStream",
    "AsyncStreamConsumer",
    "PartitionLag",
    "Stream",
    "StreamBatch",
    "StreamConsumer",
    "StreamGroupInfo",
    "StreamInfo",
    "StreamMessage",
]
