"""The Redis Streams connector (redis://, rediss://): XADD out, a consumer group in (redis-py).

URL: ``redis://[user:password@]host:6379[/db]`` with options
  stream    the stream (default: the bridge's source, else the pgbroker queue's name);
  maxlen    out: trim the stream to about this many entries on every XADD (MAXLEN ~; default:
            no trimming);
  group     in: the consumer group (default pgbroker);
  consumer  in: this bridge's name in the group (default pgbroker-bridge; bridges running in
            parallel on one stream need names of their own).

Out, a window is one pipeline of XADDs; an entry id in the reply is the confirm (Redis has the
entry in memory; it survives a Redis restart as far as its persistence settings say: appendonly
with appendfsync always or everysec). An entry has the fields body, content_type, message_id
(the message identity, msg_id@enqueued_at), key (the message's FIFO group, when it has one) and
headers (JSON), so consumers de-duplicate by message_id.

In, entries are read with XREADGROUP (first this consumer's own pending entries, left unacked by
a bridge that was killed, then new ones) and XACKed after the commit. Entries pending longer than
ack_wait with another consumer (one that is gone) are claimed (XAUTOCLAIM). The de-duplication
key is the entry's message_id field, else stream:entry-id (unique in the stream). An entry
without a body field is received as the JSON object of its fields. A message pgbroker refuses is
acked (dropped: a stream has no dead-letter) and logged. With declare, a missing group is created
reading from the start of the stream (MKSTREAM).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from pgbroker.bridge.connector import (
    Confirmed,
    Outcome,
    OutMessage,
    Publisher,
    Received,
    Receiver,
    Refused,
    carried_headers,
    trace_context,
)
from pgbroker.bridge.errors import (
    BrokerAccessRefused,
    BrokerConnectionLost,
    BrokerNotFound,
    BrokerUnreachable,
)
from pgbroker.bridge.settings import InboundSettings, OutboundSettings
from pgbroker.bridge.urls import BrokerUrl, number, parse

PREFIX = "x-redis-"
_HINT = "Write it as redis://[user:password@]host:6379[/db]?stream=NAME (group=, consumer=, maxlen=)."
_OPTIONS = ("stream", "maxlen", "group", "consumer")
_LOST = "not published: the Redis connection was lost"


def outbound(url: str, queue: str, settings: OutboundSettings) -> _OutEndpoint:
    return _OutEndpoint(parse_url(url), queue, settings)


def inbound(url: str, source: str | None, queue: str, settings: InboundSettings) -> _InEndpoint:
    return _InEndpoint(parse_url(url), source, queue, settings)


def parse_url(url: str) -> BrokerUrl:
    return parse(url, schemes=("redis", "rediss"), default_port=6379, options=_OPTIONS, hint=_HINT)


async def _connect(url: BrokerUrl, timeout: float, reply_timeout: float) -> Any:
    """A client that answered PING, or BrokerUnreachable / BrokerAccessRefused.

    A reply that does not come within ``reply_timeout`` seconds fails its call as a lost
    connection: a Redis that hangs, or a network that drops packets without a word, held it for
    as long as that lasted (for good without keepalives; a minute with redis-py 6+'s defaults).
    The client does not try again on its own: the bridge reconnects itself, and a pipeline the
    client sent again would be written twice."""
    db = number(url.path or None, "database (the URL's path)", _HINT, default=0)
    client = redis.asyncio.Redis(
        host=url.host,
        port=url.port,
        db=db,
        username=url.username,
        password=url.password,
        ssl=url.scheme == "rediss",
        socket_connect_timeout=timeout,
        socket_timeout=reply_timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=30,
    )
    try:
        await client.ping()
    except redis.exceptions.AuthenticationError as exc:
        await client.aclose()
        raise BrokerAccessRefused(
            f"Redis at {url.hostport()} refused the login: {exc}",
            hint="Check the user and password in the URL.",
        ) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        await client.aclose()
        raise BrokerUnreachable(
            f"cannot reach Redis at {url.hostport()}: {exc}",
            hint="Is Redis running there? Check the host and port of the URL.",
        ) from None
    return client


def _lost(exc: BaseException, doing: str) -> BrokerConnectionLost:
    return BrokerConnectionLost(f"Redis connection lost while {doing}: {exc}")


class _OutEndpoint:
    def __init__(self, url: BrokerUrl, queue: str, settings: OutboundSettings) -> None:
        self._url = url
        self._stream = url.options.get("stream") or queue
        self._maxlen = number(url.options.get("maxlen"), "maxlen", _HINT, default=0) or None
        self._settings = settings
        self.where = f"{url.hostport()} stream {self._stream!r}"

    async def open(self) -> Publisher:
        # A window's replies come within the confirm timeout, or it fails (as other brokers' confirms).
        client = await _connect(self._url, self._settings.connect_timeout, self._settings.confirm_timeout)
        return _Publisher(client, self._stream, self._maxlen)


class _Publisher:
    def __init__(self, client: Any, stream: str, maxlen: int | None) -> None:
        self._client = client
        self._stream = stream
        self._maxlen = maxlen

    async def close(self) -> None:
        await self._client.aclose()

    async def publish(self, messages: Sequence[OutMessage], timeout: float) -> list[Outcome]:
        pipe = self._client.pipeline(transaction=False)
        for message in messages:
            fields: dict[str, str | bytes] = {
                "body": message.body,
                "content_type": message.content_type,
                "message_id": message.message_id,
            }
            if message.key is not None:
                fields["key"] = message.key
            headers = carried_headers(message.headers, PREFIX)
            if headers:
                fields["headers"] = json.dumps(headers, separators=(",", ":"))
            pipe.xadd(self._stream, fields, maxlen=self._maxlen, approximate=True)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            return [Refused(f"{_LOST}: {exc}", lost=True) for _ in messages]
        outcomes: list[Outcome] = []
        for reply in replies:
            if isinstance(reply, Exception):
                outcomes.append(Refused(f"Redis refused XADD to stream {self._stream!r}: {reply}"))
            else:
                entry = reply.decode() if isinstance(reply, bytes) else str(reply)
                outcomes.append(Confirmed({"stream": self._stream, "id": entry}))
        return outcomes


class _InEndpoint:
    def __init__(self, url: BrokerUrl, source: str | None, queue: str, settings: InboundSettings) -> None:
        self._url = url
        self._stream = source or url.options.get("stream") or queue
        self._group = url.options.get("group") or "pgbroker"
        self._consumer = url.options.get("consumer") or "pgbroker-bridge"
        self._settings = settings
        self.where = f"{url.hostport()} stream {self._stream!r} group {self._group!r}"

    async def open(self) -> Receiver:
        timeout = self._settings.connect_timeout
        client = await _connect(self._url, timeout, timeout)
        try:
            await self._check_group(client)
        except BaseException:
            await client.aclose()
            raise
        return _Receiver(client, self._stream, self._group, self._consumer, self._settings.ack_wait, timeout)

    async def _check_group(self, client: Any) -> None:
        try:
            groups = await client.xinfo_groups(self._stream)
        except redis.exceptions.ResponseError:
            groups = []  # no such stream
        if any(_text(g["name"]) == self._group for g in groups):
            return
        if not self._settings.declare:
            raise BrokerNotFound(
                f"Redis at {self._url.hostport()} has no consumer group {self._group!r}"
                f" on stream {self._stream!r}",
                hint=f"Create it (XGROUP CREATE {self._stream} {self._group} 0 MKSTREAM), or run the bridge"
                " with --declare (declare=True).",
            )
        try:
            await client.xgroup_create(self._stream, self._group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):  # another bridge made it just now
                raise


class _Receiver:
    header_prefix = PREFIX

    def __init__(
        self, client: Any, stream: str, group: str, consumer: str, ack_wait: float, reply_timeout: float
    ) -> None:
        self._client = client
        # A blocking read's reply comes within the client's reply timeout: it blocks half as long at most.
        self._longest_block = reply_timeout / 2
        self._stream = stream
        self._group = group
        self._consumer = consumer
        self._claim_idle_ms = max(1, int(ack_wait * 1000))
        # This consumer's own pending entries come first (a killed bridge of the same name left
        # them unacked); "0" reads them, ">" reads new ones.
        self._position = "0"
        self._next_claim = 0.0

    async def close(self) -> None:
        await self._client.aclose()

    async def receive(self, limit: int, wait: float) -> list[Received]:
        try:
            claimed = await self._claim(limit)
            if claimed:
                return claimed
            block = None if self._position == "0" else max(1, int(min(wait, self._longest_block) * 1000))
            reply = await self._client.xreadgroup(
                self._group, self._consumer, {self._stream: self._position}, count=limit, block=block
            )
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise _lost(exc, "reading the stream") from exc
        except redis.exceptions.ResponseError as exc:
            if "NOGROUP" in str(exc):
                raise BrokerNotFound(
                    f"the consumer group {self._group!r} on {self._stream!r} is gone: {exc}"
                ) from None
            raise
        entries = reply[0][1] if reply else []
        # A pending entry deleted from the stream (XDEL, trimming) comes back without fields:
        # nothing to receive, so it is acked, or the pending ones would never end.
        gone = [entry_id for entry_id, fields in entries if fields is None]
        if gone:
            await self._client.xack(self._stream, self._group, *gone)
        found = [self._received(entry_id, fields) for entry_id, fields in entries if fields is not None]
        if self._position == "0" and not found:
            self._position = ">"  # the pending ones are all back in hand
        return found

    async def _claim(self, limit: int) -> list[Received]:
        """Entries left pending longer than ack_wait by other consumers (bridges that are gone),
        looked for every ack_wait/2 seconds."""
        now = time.monotonic()
        if now < self._next_claim:
            return []
        self._next_claim = now + self._claim_idle_ms / 2000
        reply = await self._client.xautoclaim(
            self._stream, self._group, self._consumer, self._claim_idle_ms, "0-0", count=limit
        )
        return [self._received(entry_id, fields) for entry_id, fields in reply[1] if fields]

    def _received(self, entry_id: bytes, raw: dict[bytes, bytes]) -> Received:
        fields = {_text(k): v for k, v in raw.items()}
        entry = _text(entry_id)
        headers: dict[str, Any] = {
            f"{PREFIX}received": {"stream": self._stream, "id": entry, "group": self._group}
        }
        carried = fields.pop("headers", None)
        if carried is not None:
            try:
                headers[f"{PREFIX}headers"] = json.loads(carried)
            except ValueError:
                headers[f"{PREFIX}headers"] = _text(carried)
            headers.update(trace_context(headers[f"{PREFIX}headers"]))
        message_id = fields.pop("message_id", None)
        content_type = fields.pop("content_type", None)
        key = fields.pop("key", None)
        if key is not None:
            headers[f"{PREFIX}key"] = _text(key)
        if "body" in fields:
            body = fields.pop("body")
            if fields:
                headers[f"{PREFIX}fields"] = {k: _text(v) for k, v in fields.items()}
        else:  # written by someone else: its fields are the message
            body = json.dumps({k: _text(v) for k, v in fields.items()}).encode()
        return Received(
            _text(message_id) if message_id is not None else f"{self._stream}:{entry}",
            body,
            _text(content_type) if content_type is not None else None,
            headers,
            entry,
            None if key is None else _text(key),
        )

    async def ack(self, messages: Sequence[Received]) -> None:
        try:
            await self._client.xack(self._stream, self._group, *[m.token for m in messages])
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise _lost(exc, "acking entries written to Postgres") from exc

    async def reject(self, message: Received) -> None:
        await self.ack([message])  # a stream has no dead-letter: acked, so it is not read again


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)
