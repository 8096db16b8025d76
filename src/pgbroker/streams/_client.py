# Generated from _client_async.py by scripts/async_to_sync.py; do not edit.
# Change src/pgbroker/streams/_client_async.py, then run `make generate` (python scripts/async_to_sync.py).
"""The asyncio stream client: Stream (create, send, groups, lag, retention) and
StreamConsumer (a consumer of a group: read batches, ack them as a whole). Every call is
awaited in the synchronous client:

    clicks = Stream(broker, "clicks")     # on a broker, or on a transaction of one
    clicks.create(partitions=4)
    clicks.send({"page": "/"}, key="user-1")   # only an INSERT
    clicks.create_group("billing", start="start")
    consumer = clicks.consumer("billing")
    batch = consumer.read(100, wait=5)
    for message in batch:
        ...                                     # batch.fail(message, "why") for a failure
    consumer.ack(batch)                         # the cursors move; failures go to the retry queue

See docs/streams.md for the model and its guarantees.
"""

from __future__ import annotations

import os
import secrets
import socket
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pgbroker import _tracing as tracing
from pgbroker._db.listen import Listener, Subscription
from pgbroker._db.wakeups import Waiting
from pgbroker.errors import StreamConsumerSuperseded
from pgbroker.queues._arguments import duration
from pgbroker.queues._client import Executor
from pgbroker.queues._query import Query
from pgbroker.streams import _queries as sq
from pgbroker.streams._records import PartitionLag, StreamBatch, StreamGroupInfo, StreamInfo


def consumer_name() -> str:
    """A name unique among a group's consumers: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _new_generation() -> int:
    """A consumer's generation: random, so that no two draws agree, whichever process made them."""
    return secrets.randbits(63)


class Stream:
    """One stream, bound to a broker (each call its own transaction) or to a transaction."""

    def __init__(self, owner: Any, name: str) -> None:
        self.name = name
        self._executor: Executor = owner._executor
        self._listener: Listener = owner._listener

    def __repr__(self) -> str:
        return f"Stream({self.name!r})"

    def create(
        self,
        *,
        partitions: int = 4,
        retention: int | float | timedelta | None = None,
        retention_bytes: int | None = None,
        truncate_consumed: bool = True,
        segment_rows: int = 1_000_000,
        segments: int = 4,
        notify: bool = False,
    ) -> StreamInfo:
        """Make the stream if it does not exist (idempotent for the same partitions and segments).

        retention: seconds (or a timedelta) after which messages may go even if a group has not
        read them; retention_bytes likewise for the log's size; truncate_consumed: free what
        every group has acknowledged. notify: announce sends, for consumers waiting on an idle
        stream (costs senders Postgres' notify lock at commit).
        """
        query = sq.stream_create(
            self.name,
            partitions=partitions,
            retention=retention,
            retention_bytes=retention_bytes,
            truncate_consumed=truncate_consumed,
            segment_rows=segment_rows,
            segments=segments,
            notify=notify,
        )
        return self._executor.run(query)

    def drop(self) -> bool:
        """Drop the stream, its groups and cursors, and each retry queue a group of it made (see
        drop_group); False when there was none."""
        return self._executor.run(sq.stream_drop(self.name))

    # sending

    def send(
        self, message: Any, *, key: str | None = None, headers: Mapping[str, Any] | None = None
    ) -> int:
        """Send one message; returns its id. Messages of one key keep their order."""
        sent = self.send_many([message], keys=[key], headers=None if headers is None else [headers])
        return sent[0]

    def send_many(
        self,
        messages: Iterable[Any],
        *,
        keys: Sequence[str | None] | None = None,
        headers: Sequence[Mapping[str, Any] | None] | None = None,
        idempotency_key: str | None = None,
        idempotency_scope: str | None = None,
    ) -> list[int]:
        """Send messages in one statement; returns their ids in order.

        ``idempotency_key`` (1 to 255 characters): the same call again within 24 hours returns
        the first call's ids and appends nothing; the key with other messages, keys or headers
        raises IdempotencyKeyReused. The retry for OutcomeUnknown. The trace context headers
        (traceparent, tracestate) are not part of what makes a retry the same call.
        ``idempotency_scope`` (up to 255 characters): whose keys they are; the same key in
        another scope is another key (the HTTP API gives each API key its own).
        """
        with tracing.span("send", self.name) as span:
            messages, headers = tracing.carry(span, messages, headers)
            query = sq.stream_send_many(
                self.name,
                messages,
                headers=headers,
                keys=keys,
                idempotency_key=idempotency_key,
                idempotency_scope=idempotency_scope,
            )
            sent = self._executor.run(query)
            tracing.sent(span, sent)
            return sent

    # groups

    def create_group(
        self, group: str, *, start: str | datetime = "end", retry_queue: str | None = None
    ) -> str:
        """Make a consumer group (idempotent) starting at 'start', 'end' or a time; returns the
        name of its retry queue (by default <stream>_<group>_retry)."""
        return self._executor.run(
            sq.stream_group_create(self.name, group, start=start, retry_queue=retry_queue)
        )

    def drop_group(self, group: str) -> bool:
        """Drop a group, its cursors and consumers, and its retry queue if the group made it (the
        queue did not exist when the group was made), failures and all: a group made again under the
        name starts with an empty one. A queue the group took over stays. False when there was no
        such group."""
        return self._executor.run(sq.stream_group_drop(self.name, group))

    def groups(self) -> list[StreamGroupInfo]:
        """Every group with its lag, its oldest unacknowledged message and its live consumers."""
        return self._executor.run(sq.stream_group_list(self.name))

    def lag(self) -> list[PartitionLag]:
        """Per group and partition: cursor, lag and owner."""
        return self._executor.run(sq.stream_lag(self.name))

    def consumer(
        self,
        group: str,
        *,
        name: str | None = None,
        lease: int | float | timedelta = 30,
        fenced: bool = True,
        lease_only: bool = False,
    ) -> StreamConsumer:
        """A consumer of ``group``; it owns a share of the partitions while it reads at least once
        a ``lease`` (seconds). ``name``: unique in the group (default: host:pid:random).
        ``fenced``: its reads name its generation, new at each rewind, so that a read sent before
        a rewind and run after it (a hung session going on) is refused and moves nothing
        (docs/streams.md, "Generations"); False for a consumer made anew for each call, as the
        HTTP API's are. ``lease_only``: live by its lease alone, with no liveness lock in the
        sessions it reads on (docs/streams.md, "Consumers share a group's partitions by lease"): for
        a server whose pooled sessions read for many consumers, as the HTTP API's do."""
        return StreamConsumer(
            self, group, name or consumer_name(), lease, fenced=fenced, lease_only=lease_only
        )

    def maintain(self) -> int:
        """Apply retention: empty the child tables whose messages may go; returns how many."""
        return self._executor.run(sq.stream_maintain(self.name))

    def listen(self, timeout: float = 5.0) -> Subscription:
        """Wake-ups for this stream (when it was made with notify=True); a hint, as for queues (and
        ConnectionLost as there, when the server leaves the look-up of the channel unanswered)."""
        channel_of = sq.stream_notify_channel(self.name)
        return self._listener.subscribe(
            f"stream {self.name}", lambda within: self._executor.run_within(within, channel_of), timeout
        )


class StreamConsumer:
    """A consumer of one group of one stream. Read a batch, handle it, ack it: the ack moves the
    group's cursors past the batch; a consumer that dies first leaves the batch to be delivered
    again to whoever takes its partitions over (at-least-once)."""

    def __init__(
        self,
        stream: Stream,
        group: str,
        name: str,
        lease: int | float | timedelta,
        *,
        fenced: bool = True,
        lease_only: bool = False,
    ) -> None:
        self.stream = stream
        self.group = group
        self.name = name
        self.lease = lease
        self.lease_only = lease_only
        # Its generation (docs/streams.md, "Generations"): drawn at random, and again at each rewind.
        self.generation: int | None = _new_generation() if fenced else None
        self._has_read = False

    def __repr__(self) -> str:
        return f"StreamConsumer({self.stream.name!r}, {self.group!r}, {self.name!r})"

    def read(self, qty: int = 100, *, wait: float | timedelta = 0) -> StreamBatch:
        """Up to qty messages from the partitions this consumer owns, waiting up to ``wait``
        seconds for some (woken by notifications when the stream has notify, else polling). The
        first wait asks the server for the stream's channel (listen()): ConnectionLost when the
        server has not answered that within the broker's ``connect_timeout``."""
        return self.ack_and_read(None, qty, wait=wait)

    def ack_and_read(
        self, acked: StreamBatch | None, qty: int = 100, *, wait: float | timedelta = 0
    ) -> StreamBatch:
        """Ack ``acked`` and read the next batch in one call (one transaction a batch)."""
        stream, executor = self.stream, self.stream._executor
        found = self._first_read(
            lambda: sq.stream_consume(
                stream.name, self.group, self.name, qty, self.lease, acked, self.generation, self.lease_only
            )
        )
        waiting = Waiting(duration(wait, "wait"), stream._listener.poll_interval)
        if waiting.done(found.messages):
            return found
        query = sq.stream_read(
            stream.name, self.group, self.name, qty, self.lease, self.generation, self.lease_only
        )
        subscription = stream.listen(waiting.timeout())
        while not waiting.done((found := executor.run(query)).messages):
            subscription.wait(waiting.timeout())
        return found

    def _first_read(self, query: Callable[[], Query[StreamBatch]]) -> StreamBatch:
        """``query()`` run; on this object's first read, a refusal (StreamConsumerSuperseded) says
        that a consumer of this name read under another generation before it (a process before
        this one, killed): what that one was handed and did not ack is handed out again (a
        rewind, under this object's generation), and the read is made again."""
        executor = self.stream._executor
        if self._has_read:
            return executor.run(query())
        try:
            found = executor.run_in_savepoint(query())
        except StreamConsumerSuperseded:
            self.rewind()
            found = executor.run(query())
        self._has_read = True
        return found

    def ack(self, batch: StreamBatch) -> dict[int, bool]:
        """Move the cursors past the batch, and send its failures to the retry queue. Returns
        {partition: held}; False where the partition changed hands (the batch goes to its new
        owner again)."""
        if not batch.messages:
            return {}
        return self.stream._executor.run(sq.stream_ack(self.stream.name, self.group, self.name, batch))

    def rewind(self) -> int:
        """Have what was read and not acknowledged handed out again (after a lost connection: a
        read may have committed without its rows arriving), under a new generation: a read of
        this consumer sent before and run after the rewind is refused. Returns the partitions
        rewound."""
        generation = None if self.generation is None else _new_generation()
        query = sq.stream_rewind(self.stream.name, self.group, self.name, generation)
        rewound = self.stream._executor.run(query)
        self.generation = generation
        return rewound

    def heartbeat(self) -> dict[int, int]:
        """Renew this consumer's lease without reading, for a batch that takes longer to handle
        than the lease. Returns {partition: epoch} of the partitions it owns. Messages read
        before the beat under an epoch it does not name (their partition was taken while the
        lease was over) cannot be acked: they are delivered again to the new owner."""
        return self.stream._executor.run(
            sq.stream_heartbeat(self.stream.name, self.group, self.name, self.lease, self.lease_only)
        )

    def release(self) -> int:
        """Leave the group: the partitions are free at once; returns how many were held."""
        return self.stream._executor.run(sq.stream_release(self.stream.name, self.group, self.name))


def list_streams(owner: Any) -> list[StreamInfo]:
    """Every stream of the database of ``owner`` (an Broker or a transaction of one)."""
    executor: Executor = owner._executor
    return executor.run(sq.stream_list())
