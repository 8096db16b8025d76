"""The official pgmq clients on a queue with binary bodies (pgbroker.codecs): each reads valid
JSON, the documented envelope, whose base64 ``data`` are the codec's bytes; what they send is read
by pgbroker as JSON, whatever the queue's default codec (docs/codecs.md)."""

from __future__ import annotations

import base64

from pgmq import PGMQueue

from pgbroker import Broker, codecs
from tests.support.codec_types import samples


def test_a_pgmq_client_reads_binary_bodies_as_the_documented_envelope(client: PGMQueue, dsn: str) -> None:
    with Broker(dsn) as broker:
        queue = broker.create_queue("orders")
        for name, value in samples(9).items():
            queue.send(value, codec=name)
        read = client.read("orders", vt=30, qty=10)
        assert isinstance(read, list)
        assert len(read) == len(samples())
        for message, (name, value) in zip(read, samples(9).items(), strict=True):
            data, content_type = codecs.encode(value, name)
            if name == "json":
                assert message.message == value
                continue
            envelope = {"codec": name, "content_type": content_type, "data": base64.b64encode(data).decode()}
            assert message.message == {"$pgbroker": envelope}
            inner = message.message["$pgbroker"]
            assert codecs.decode(base64.b64decode(inner["data"]), inner["content_type"]) == value
        assert client.archive_batch("orders", [m.msg_id for m in read])

        queue.set_policy(codec="msgpack")  # a pgmq client's send stays JSON
        client.send("orders", {"from": "pgmq"})
        [mine] = queue.read_many(10)
        assert (mine.codec, mine.message) == ("json", {"from": "pgmq"})
