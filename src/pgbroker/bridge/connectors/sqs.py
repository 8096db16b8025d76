"""The Amazon SQS connector (sqs://): SendMessageBatch out, ReceiveMessage and
DeleteMessageBatch in (boto3).

URL: ``sqs://REGION/QUEUE_NAME`` (``sqs:///QUEUE_NAME``: the region of the AWS configuration;
no queue name: the bridge's source, else the pgbroker queue's name) with the option
  endpoint  another endpoint than AWS's, e.g. http://127.0.0.1:5000 for an SQS-compatible server.
Credentials come from boto3's usual chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a
profile, an instance role); never from the URL.

Out, a window is sent as SendMessageBatch calls of up to 10 messages (and 256 KiB), several at
once; a message listed as Successful is confirmed (SQS stored it), one listed as Failed is
refused with SQS's code and text. The message id (the message identity, msg_id@enqueued_at)
travels as the message attribute pgbroker-message-id, the content type as content-type, other
headers as pgbroker-headers (JSON); a body that is not text SQS accepts is sent as base64 with
body-encoding: base64. To a FIFO queue (a name ending in .fifo) the message id is also the
MessageDeduplicationId, so SQS itself drops a copy sent within 5 minutes, and the message's FIFO
group (x-pgmq-group) is its MessageGroupId (else "pgbroker"): order per key, with calls sent one
after the other (and one window, ``--windows 1``, since windows run side by side; a message that
failed and is retried comes after those sent behind it).

In, ReceiveMessage long-polls (then more calls at once while the queue has more) with a
visibility timeout of ack_wait; messages are deleted (DeleteMessageBatch) only after the commit.
One not deleted within ack_wait becomes visible again and comes back. The de-duplication key is
pgbroker-message-id, else SQS's MessageId (the same on every receive of one message). A message
pgbroker refuses is deleted and logged (give the queue a redrive policy to keep such messages:
SQS moves a message to the dead-letter queue after maxReceiveCount receives).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from pgbroker.bridge.connector import (
    Confirmed,
    Outcome,
    OutMessage,
    Received,
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
from pgbroker.bridge.urls import BrokerUrl, parse
from pgbroker.errors import InvalidArgument

PREFIX = "x-sqs-"
_HINT = "Write it as sqs://REGION/QUEUE_NAME (sqs:///QUEUE_NAME: the configured region), ?endpoint=http://host:port."
_BATCH = 10  # SQS's limit per SendMessageBatch and DeleteMessageBatch
_BATCH_BYTES = 262_144
_CALLS_AT_ONCE = 8
_NOT_FOUND = ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")
_DENIED = (
    "InvalidClientTokenId",
    "AccessDenied",
    "AccessDeniedException",
    "SignatureDoesNotMatch",
    "UnrecognizedClientException",
)
_UNREACHABLE = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
)
_LOST = "not sent: SQS could not be reached"
T = TypeVar("T")
# Receives long-poll for up to 20 s: their read timeout is longer than that.
_RECEIVE_TIMEOUT = 30.0
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def outbound(url: str, queue: str, settings: OutboundSettings) -> _Endpoint:
    return _Endpoint(
        url, None, queue, settings.connect_timeout, settings.confirm_timeout, settings.declare, 0
    )


def inbound(url: str, source: str | None, queue: str, settings: InboundSettings) -> _Endpoint:
    ack_wait = max(1, round(settings.ack_wait))
    return _Endpoint(
        url, source, queue, settings.connect_timeout, _RECEIVE_TIMEOUT, settings.declare, ack_wait
    )


class _Endpoint:
    """One SQS queue; opens a _Queue, which is both a Publisher and a Receiver."""

    def __init__(
        self,
        url: str,
        source: str | None,
        queue: str,
        connect_timeout: float,
        read_timeout: float,
        declare: bool,
        ack_wait: int,
    ) -> None:
        parsed: BrokerUrl = parse(
            url, schemes=("sqs",), default_port=0, options=("endpoint",), hint=_HINT, default_host=""
        )
        endpoint = parsed.options.get("endpoint")
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise InvalidArgument(
                f"the SQS endpoint must be an http:// or https:// URL, got {endpoint!r}", hint=_HINT
            )
        if "/" in parsed.path:
            raise InvalidArgument(f"an SQS queue name has no '/', got {parsed.path!r}", hint=_HINT)
        self._region = parsed.host or None
        self._endpoint = endpoint
        self._name = source or parsed.path or queue
        self._config = botocore.config.Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": 2, "mode": "standard"},
            max_pool_connections=_CALLS_AT_ONCE + 2,
        )
        self._declare = declare
        self._ack_wait = ack_wait
        self.where = f"{endpoint or 'AWS'} ({self._region or 'configured region'}) queue {self._name!r}"

    async def open(self) -> _Queue:  # a Publisher and a Receiver
        pool = ThreadPoolExecutor(_CALLS_AT_ONCE, thread_name_prefix="pgbroker-sqs")
        loop = asyncio.get_running_loop()
        try:
            client = await loop.run_in_executor(pool, self._client)
            queue_url = await loop.run_in_executor(pool, self._queue_url, client)
        except BaseException:
            pool.shutdown(wait=False)
            raise
        return _Queue(client, queue_url, self._name, pool, self._ack_wait)

    def _client(self) -> Any:
        return boto3.session.Session().client(
            "sqs", region_name=self._region, endpoint_url=self._endpoint, config=self._config
        )

    def _queue_url(self, client: Any) -> str:
        try:
            try:
                url: str = client.get_queue_url(QueueName=self._name)["QueueUrl"]
                return url
            except botocore.exceptions.ClientError as exc:
                if _code(exc) not in _NOT_FOUND or not self._declare:
                    raise
            attributes = {"FifoQueue": "true"} if self._name.endswith(".fifo") else {}
            url = client.create_queue(QueueName=self._name, Attributes=attributes)["QueueUrl"]
            return url
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                raise BrokerNotFound(
                    f"SQS at {self.where} has no such queue",
                    hint="Create it, or run the bridge with --declare (declare=True).",
                ) from None
            if _code(exc) in _DENIED:
                raise BrokerAccessRefused(
                    f"SQS at {self.where} refused the credentials: {exc}",
                    hint="Check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the profile)"
                    " and the queue's policy.",
                ) from None
            raise BrokerUnreachable(f"SQS at {self.where}: {exc}") from None
        except botocore.exceptions.NoCredentialsError:
            raise BrokerAccessRefused(
                f"no AWS credentials for SQS at {self.where}",
                hint="Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or configure a profile.",
            ) from None
        except (*_UNREACHABLE, botocore.exceptions.NoRegionError) as exc:
            raise BrokerUnreachable(
                f"cannot reach SQS at {self.where}: {exc} ({_cause(exc)})",
                hint="Check the region and the endpoint of the URL (and AWS_REGION).",
            ) from None


def _cause(exc: BaseException) -> str:
    """What is under botocore's error (a refused or reset connection, say)."""
    inner = getattr(exc, "kwargs", {}).get("error") or exc.__context__
    return f"{type(inner).__name__}: {inner}" if inner is not None else type(exc).__name__


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class _Queue:
    header_prefix = PREFIX

    def __init__(self, client: Any, url: str, name: str, pool: ThreadPoolExecutor, ack_wait: int) -> None:
        self._client = client
        self._url = url
        self._name = name
        self._pool = pool
        self._fifo = name.endswith(".fifo")
        self._ack_wait = ack_wait

    async def _call(self, function: Callable[..., T], **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: function(**kwargs))

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- out ----------------------------------------------------------------------------------------

    async def publish(self, messages: Sequence[OutMessage], timeout: float) -> list[Outcome]:
        del timeout  # the client's read timeout is the confirm timeout
        chunks = _chunks([self._entry(n, m) for n, m in enumerate(messages)])
        replies: list[Any]
        if self._fifo:  # one call after the other: order per message group holds across calls
            replies = [await self._send(c) for c in chunks]
        else:
            replies = await asyncio.gather(*(self._send(c) for c in chunks))
        outcomes: dict[str, Outcome] = {}
        for chunk, reply in zip(chunks, replies, strict=True):
            if isinstance(reply, BaseException):
                lost = isinstance(reply, _UNREACHABLE)
                why = (
                    f"{_LOST}: {reply}" if lost else f"SQS refused the batch: {type(reply).__name__}: {reply}"
                )
                outcomes.update({e["Id"]: Refused(why, lost=lost) for e in chunk})
                continue
            for ok in reply.get("Successful", []):
                outcomes[ok["Id"]] = Confirmed({"queue": self._name, "message_id": ok["MessageId"]})
            for bad in reply.get("Failed", []):
                outcomes[bad["Id"]] = Refused(
                    f"SQS refused the message: {bad.get('Code')} {bad.get('Message', '')}"
                )
        return [
            outcomes.get(str(n), Refused("SQS did not answer for this message")) for n in range(len(messages))
        ]

    async def _send(self, entries: list[dict[str, Any]]) -> Any:
        """SendMessageBatch's reply, or the exception it raised."""
        try:
            return await self._call(self._client.send_message_batch, QueueUrl=self._url, Entries=entries)
        except Exception as exc:
            return exc

    def _entry(self, n: int, message: OutMessage) -> dict[str, Any]:
        attributes = {
            "pgbroker-message-id": {"DataType": "String", "StringValue": message.message_id},
            "content-type": {"DataType": "String", "StringValue": message.content_type},
        }
        headers = carried_headers(message.headers, PREFIX)
        if headers:
            attributes["pgbroker-headers"] = {
                "DataType": "String",
                "StringValue": json.dumps(headers, separators=(",", ":")),
            }
        text = _sqs_text(message.body)
        if text is None:
            text = base64.b64encode(message.body).decode()
            attributes["body-encoding"] = {"DataType": "String", "StringValue": "base64"}
        entry: dict[str, Any] = {"Id": str(n), "MessageBody": text, "MessageAttributes": attributes}
        if self._fifo:
            entry["MessageGroupId"] = message.key or "pgbroker"
            entry["MessageDeduplicationId"] = message.message_id
        return entry

    # -- in -----------------------------------------------------------------------------------------

    async def receive(self, limit: int, wait: float) -> list[Received]:
        first = await self._receive(min(limit, _BATCH), max(1, min(20, round(wait))))
        got = list(first)
        # The queue has more: fetch the rest of the batch with several calls at once.
        while len(first) == _BATCH and len(got) < limit:
            calls = min(_CALLS_AT_ONCE, -(-(limit - len(got)) // _BATCH))
            more = await asyncio.gather(*(self._receive(_BATCH, 0) for _ in range(calls)))
            first = [m for reply in more for m in reply]
            got.extend(first)
            if any(len(reply) < _BATCH for reply in more):
                break
        return [self._received(m) for m in got]

    async def _receive(self, count: int, wait_seconds: int) -> list[dict[str, Any]]:
        try:
            reply = await self._call(
                self._client.receive_message,
                QueueUrl=self._url,
                MaxNumberOfMessages=count,
                WaitTimeSeconds=wait_seconds,
                VisibilityTimeout=self._ack_wait,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp", "MessageGroupId"],
            )
        except (*_UNREACHABLE, botocore.exceptions.ClientError) as exc:
            raise BrokerConnectionLost(f"SQS receive failed ({self._name!r}): {exc}") from exc
        messages: list[dict[str, Any]] = reply.get("Messages", [])
        return messages

    def _received(self, message: dict[str, Any]) -> Received:
        attributes = {k: v.get("StringValue") for k, v in message.get("MessageAttributes", {}).items()}
        system = message.get("Attributes", {})
        headers: dict[str, Any] = {
            f"{PREFIX}received": {
                "queue": self._name,
                "message_id": message["MessageId"],
                "receive_count": int(system.get("ApproximateReceiveCount", 1)),
            }
        }
        message_id = attributes.pop("pgbroker-message-id", None) or message["MessageId"]
        content_type = attributes.pop("content-type", None)
        carried = attributes.pop("pgbroker-headers", None)
        if carried is not None:
            try:
                headers[f"{PREFIX}headers"] = json.loads(carried)
            except ValueError:
                headers[f"{PREFIX}headers"] = carried
            headers.update(trace_context(headers[f"{PREFIX}headers"]))
        body = message["Body"].encode()
        if attributes.pop("body-encoding", None) == "base64":
            body = base64.b64decode(body)
        if attributes:
            headers[f"{PREFIX}attributes"] = attributes
        key = system.get("MessageGroupId")  # a FIFO queue's group
        return Received(message_id, body, content_type, headers, message["ReceiptHandle"], key)

    async def ack(self, messages: Sequence[Received]) -> None:
        handles = [m.token for m in messages]
        batches = [handles[i : i + _BATCH] for i in range(0, len(handles), _BATCH)]
        try:
            await asyncio.gather(
                *(
                    self._call(
                        self._client.delete_message_batch,
                        QueueUrl=self._url,
                        Entries=[{"Id": str(n), "ReceiptHandle": h} for n, h in enumerate(batch)],
                    )
                    for batch in batches
                )
            )
        except (*_UNREACHABLE, botocore.exceptions.ClientError) as exc:
            # Committed but not deleted: they come back after ack_wait, and are recognised.
            raise BrokerConnectionLost(f"SQS delete failed ({self._name!r}): {exc}") from exc

    async def reject(self, message: Received) -> None:
        await self.ack([message])


def _chunks(entries: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """SendMessageBatch calls: at most 10 entries and 256 KiB of bodies and attributes each."""
    chunks: list[list[dict[str, Any]]] = []
    size = 0
    for entry in entries:
        entry_size = len(entry["MessageBody"].encode()) + len(json.dumps(entry["MessageAttributes"]))
        if not chunks or len(chunks[-1]) == _BATCH or size + entry_size > _BATCH_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += entry_size
    return chunks


def _sqs_text(body: bytes) -> str | None:
    """The body as SQS message text, or None if SQS would refuse it: not UTF-8, or characters
    outside XML's (SQS allows tab, newline, carriage return and U+0020 on, without surrogates,
    U+FFFE and U+FFFF)."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    return None if _NOT_XML.search(text) else text
