# The one written copy of the client. Its synchronous twin, _client.py, is generated from this
# file by scripts/async_to_sync.py (`make generate`) and committed; `make lint` fails while it is
# stale. Where the twins really differ: `if ASYNC:` blocks are left out of the sync twin, and a
# line ending in `# sync: <code>` becomes <code> there.
"""The asyncio client: AsyncBroker (connections, install, queue management) and AsyncQueue.

Every method builds a Query in pgbroker.queues._queries and hands it to an executor:
a pool (each call borrows a connection in autocommit), or one connection
that the caller owns, for example inside ``async with broker.transaction() as tx``
so that sends and acks commit or roll back with the caller's own writes.
A read that waits sleeps on the broker's AsyncListener (pgbroker._db.listen) between
reads, holding no connection meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar, Unpack

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool

from pgbroker import _tracing as tracing
from pgbroker import codecs
from pgbroker._credentials import hide_passwords, safe_cause
from pgbroker._db import session
from pgbroker._db.backoff import SEND_RETRY, Patience
from pgbroker._db.dsn import PoolerMode, listen_dsn, pooler_mode, resolve_dsn
from pgbroker._db.fetch import fetch_rows  # sync: from pgbroker._db.fetch import fetch_all
from pgbroker._db.install_async import install_async
from pgbroker._db.install_rules import InstallResult
from pgbroker._db.listen_async import AsyncListener, AsyncSubscription
from pgbroker._db.liveness import cut_if_unanswered, is_read_only_server, server_has_written
from pgbroker._db.pools import DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_TIMEOUT, RECONNECT_CEILING, PoolTimeouts
from pgbroker._db.wakeups import DEFAULT_POLL_INTERVAL, Waiting, conninfo_of, listen_conninfo
from pgbroker.codecs import Codec, CodecLike
from pgbroker.codecs.queue_defaults import DefaultCodecs
from pgbroker.errors import (
    DatabaseError,
    InvalidArgument,
    QueueFull,
    connection_lost,
    from_postgres,
    outcome_unknown,
)
from pgbroker.queues import _arguments as arg
from pgbroker.queues import _queries as q
from pgbroker.queues._arguments import Delay, Receivable
from pgbroker.queues._job_headers import with_job_headers
from pgbroker.queues._query import Query
from pgbroker.queues._records import (
    BlockingSession,
    Message,
    Metrics,
    PeekedMessage,
    Policy,
    PolicyChanges,
    QueueInfo,
    Receipt,
    Schedule,
    ScheduleTick,
)

T = TypeVar("T")

# The listener's key for the schedules channel: not a queue name (those cannot hold a space).
_SCHEDULES_KEY = " schedules"

# True here; the generator drops this line and every `if ASYNC:` block (mypy: always_true).
ASYNC = True

if ASYNC:
    from pgbroker._db.liveness import answered_within


class AsyncExecutor(Protocol):
    async def run(self, query: Query[T]) -> T: ...

    async def run_within(self, seconds: float, query: Query[T]) -> T:
        """run(), failed with NoAnswer (pgbroker._db.liveness) when the server has not answered
        within ``seconds`` (a hung server, a stuck pooler): given up (asyncio), or its connection
        cut (the sync twin); a pooled connection is then replaced by the pool."""
        ...

    async def run_in_savepoint(self, query: Query[T]) -> T:
        """Run in a savepoint when the caller's transaction is open: a failure leaves it usable."""
        ...


async def _run_on(conn: psycopg.AsyncConnection[Any], query: Query[T]) -> T:
    # In autocommit outside a transaction the statement commits itself: a send whose connection
    # breaks may have committed. Inside the caller's transaction it certainly rolled back.
    commits_itself = conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE
    try:
        cursor = await conn.execute(query.sql, query.params)
        rows = await fetch_rows(cursor, query.row)  # sync: rows = fetch_all(cursor, query.row)
    except psycopg.Error as exc:
        if query.sends and commits_itself and connection_lost(exc):
            raise outcome_unknown(exc) from exc
        raise from_postgres(exc) from exc
    return query.decode(rows)


@asynccontextmanager
async def _live_connection(pool: AsyncConnectionPool[Any]) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """``pool.connection()``, passing over connections the server has closed (a restart of
    Postgres leaves every idle one dead): each is closed, which makes the pool replace it, and
    the next is taken at once. No round trip is spent on the check (pgbroker._db.liveness)."""
    for _ in range(pool.max_size + 1):  # every idle one may be dead; one more is a new one
        async with pool.connection() as conn:
            if not server_has_written(conn):
                async with _closed_if_read_only(conn):
                    yield conn
                return
            await conn.close()
    # Let the call fail on it, as it would have.
    async with pool.connection() as conn, _closed_if_read_only(conn):
        yield conn


@asynccontextmanager
async def _closed_if_read_only(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """Close the connection when a call fails on it because the server takes no writes (a
    standby after a switchover): the pool replaces it with one to the primary."""
    try:
        yield
    except Exception as exc:
        if is_read_only_server(exc):
            await conn.close()
        raise


class AsyncPoolExecutor:
    """Runs each query on a pooled connection in autocommit: one call, one transaction."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    async def run(self, query: Query[T]) -> T:
        async with _live_connection(self.pool) as conn:
            return await _run_on(conn, query)

    async def run_within(self, seconds: float, query: Query[T]) -> T:
        if ASYNC:
            return await answered_within(seconds, self.run(query))  # the wait for a connection too
        else:
            with _live_connection(self.pool) as conn, cut_if_unanswered(conn, seconds):
                return _run_on(conn, query)

    run_in_savepoint = run  # each call is its own transaction: nothing to protect


class AsyncConnectionExecutor:
    """Runs queries on one connection the caller owns, in whatever transaction it is in."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def run(self, query: Query[T]) -> T:
        return await _run_on(self.conn, query)

    async def run_within(self, seconds: float, query: Query[T]) -> T:
        if ASYNC:
            return await answered_within(seconds, self.run(query))
        else:
            with cut_if_unanswered(self.conn, seconds):
                return _run_on(self.conn, query)

    async def run_in_savepoint(self, query: Query[T]) -> T:
        if self.conn.info.transaction_status != pq.TransactionStatus.INTRANS:
            return await _run_on(self.conn, query)
        async with self.conn.transaction():  # a savepoint: an error rolls back to it, not the caller's work
            return await _run_on(self.conn, query)


class AsyncQueue:
    """One queue, bound to an executor. Get it from AsyncBroker.queue() or AsyncTransaction.queue()."""

    def __init__(
        self,
        name: str,
        executor: AsyncExecutor,
        listener: AsyncListener,
        default_codecs: DefaultCodecs | None = None,
    ) -> None:
        self.name = name
        self._executor = executor
        self._listener = listener
        self._default_codecs = default_codecs or DefaultCodecs()

    def __repr__(self) -> str:
        return f"AsyncQueue({self.name!r})"

    # sending

    async def send(
        self,
        message: Any,
        *,
        headers: Mapping[str, Any] | None = None,
        delay: Delay | None = None,
        wait: float | timedelta = 0,
        codec: CodecLike | None = None,
        priority: int | None = None,
        dedup_key: str | None = None,
        concurrency_key: str | None = None,
    ) -> int:
        """Send one message; returns its msg_id. ``wait`` and ``codec``: see send_many.

        ``priority``: higher is read first (default 0). ``dedup_key``: while the key is taken
        (the queue's dedup window or mode) nothing is stored and the first message's msg_id is
        returned. ``concurrency_key``: the queue's max_in_flight_per_key counts per key. They
        travel as the x-pgbroker-* headers (pgbroker.queues._job_headers).
        """
        headers = with_job_headers(
            headers, priority=priority, dedup_key=dedup_key, concurrency_key=concurrency_key
        )
        sent = await self.send_many(
            [message], headers=None if headers is None else [headers], delay=delay, wait=wait, codec=codec
        )
        return sent[0]

    async def send_many(
        self,
        messages: Iterable[Any],
        *,
        headers: Sequence[Mapping[str, Any] | None] | None = None,
        delay: Delay | None = None,
        wait: float | timedelta = 0,
        codec: CodecLike | None = None,
        idempotency_key: str | None = None,
        idempotency_scope: str | None = None,
    ) -> list[int]:
        """Send messages in one statement; returns their msg_ids in order.

        ``codec`` (a name such as "msgpack" or "avro:shop.Order", or a pgbroker.codecs.Codec)
        encodes the bodies; None uses the queue's policy's codec (JSON unless set).

        ``delay``: seconds, or a timedelta, kept in whole seconds as pgmq.send keeps them (a
        fraction rounded up: nothing is visible sooner than asked); or a timezone-aware datetime,
        the moment the messages become visible.

        A queue at its policy's max_depth refuses the send with QueueFull at once; with
        ``wait`` > 0 the send is tried again, less and less often, for up to that many
        seconds (inside a transaction, each try in a savepoint).

        ``idempotency_key`` (1 to 255 characters): the same call again within 24 hours returns
        the first call's msg_ids and sends nothing; the key with other messages, headers or
        delay raises IdempotencyKeyReused. The retry for OutcomeUnknown (``delay`` in seconds).
        ``idempotency_scope`` (up to 255 characters): whose keys they are; the same key in
        another scope is another key (the HTTP API gives each API key its own).
        """
        chosen = await self._codec(codec)
        with tracing.span("send", self.name) as span:
            messages, headers = tracing.carry(span, messages, headers)
            query = q.message_send_many(
                self.name,
                messages,
                headers=headers,
                delay=delay,
                codec=chosen,
                idempotency_key=idempotency_key,
                idempotency_scope=idempotency_scope,
            )
            retry = Patience(*SEND_RETRY, within=arg.duration(wait, "wait"))
            run = self._executor.run_in_savepoint if wait else self._executor.run
            while True:
                try:
                    sent = await run(query)
                except QueueFull:
                    pause = retry.next()
                    if pause is None:
                        raise
                    await asyncio.sleep(pause)
                else:
                    tracing.sent(span, sent)
                    return sent

    async def _codec(self, codec: CodecLike | None) -> Codec | None:
        """The codec of a send: the one given, else the queue's default; None for plain JSON."""
        if codec is None:
            codec = self._default_codecs.cached(self.name)
            if codec is None:
                codec = await self._executor.run(q.queue_codec(self.name))
                self._default_codecs.remember(self.name, codec)
        chosen = codecs.get(codec)
        return None if chosen.name == "json" else chosen

    # reading

    async def read(
        self,
        *,
        vt: int | timedelta = 30,
        wait: float | timedelta = 0,
        conditional: Mapping[str, Any] | None = None,
    ) -> Message | None:
        """Lease the oldest visible message for vt seconds, waiting up to ``wait`` seconds for one."""
        found = await self.read_many(1, vt=vt, wait=wait, conditional=conditional)
        return found[0] if found else None

    async def read_many(
        self,
        qty: int,
        *,
        vt: int | timedelta = 30,
        wait: float | timedelta = 0,
        conditional: Mapping[str, Any] | None = None,
        decode: bool = True,
    ) -> list[Message]:
        """Lease up to qty visible messages, oldest first; each carries a receipt.

        With ``wait`` > 0 and nothing to read, wait up to that many seconds for
        messages: woken by a notification when notify is enabled on the queue
        (see enable_notify), else by polling every poll interval of the broker.
        The first such wait of a queue on a broker asks the server for the queue's
        channel (listen()): a server that leaves that unanswered for the broker's
        ``connect_timeout`` (a hung server, a stuck pooler) raises ConnectionLost.
        ``decode=False`` leaves bodies as stored (a binary codec's JSON envelope; ``codec``
        still names it): what a bridge forwards unread.
        """
        with tracing.span("receive", self.name) as span:
            found = await self._read_waiting(
                q.message_read_many(self.name, qty, vt=vt, conditional=conditional, decode=decode), wait
            )
            tracing.received(span, found)
            return found

    async def _read_waiting(self, query: Query[list[Message]], wait: float | timedelta) -> list[Message]:
        waiting = Waiting(arg.duration(wait, "wait"), self._listener.poll_interval)
        found = await self._executor.run(query)
        if waiting.done(found):
            return found
        subscription = await self.listen(waiting.timeout())
        while not waiting.done(found := await self._executor.run(query)):
            await subscription.wait(waiting.timeout())
        return found

    async def listen(self, timeout: float = 5.0) -> AsyncSubscription:
        """Wake-ups for this queue: ``wait(seconds)`` returns early when a send was announced.

        Waits up to ``timeout`` seconds for the LISTEN to be in place. A wake-up is a hint
        (see pgbroker._db.listen): read after it, and read now and then without one. The
        queue's channel is asked of the server once per broker: ConnectionLost when the server
        has not answered within the broker's ``connect_timeout`` (10 s by default), where the
        call waited for good.
        """
        channel_of = q.notify_channel(self.name)
        wait = arg.duration(timeout, "timeout")
        return await self._listener.subscribe(
            self.name, lambda within: self._executor.run_within(within, channel_of), wait
        )

    if ASYNC:

        async def consume(
            self,
            *,
            batch_size: int = 10,
            vt: int | timedelta = 30,
            idle_wait: float = 1.0,
        ) -> AsyncIterator[Message]:
            """Yield messages forever: read batches, and wait up to idle_wait seconds when empty.

            An empty queue is waited on like read_many(wait=...): woken by a
            notification, else polled (ConnectionLost as there, when the server leaves the
            look-up of the queue's channel unanswered). The caller acks (or nacks) each message;
            one left alone becomes visible again when its lease of vt seconds runs out.
            """
            while True:
                for message in await self.read_many(batch_size, vt=vt, wait=idle_wait):
                    yield message

    async def peek(
        self,
        qty: int = 10,
        *,
        after: int = 0,
        state: str | None = None,
        before: int | None = None,
        header: str | None = None,
        header_value: str | None = None,
        enqueued_after: datetime | None = None,
        enqueued_before: datetime | None = None,
        contains: Mapping[str, Any] | None = None,
    ) -> list[PeekedMessage]:
        """Up to qty messages with msg_id > ``after`` (and <= ``before``), oldest first, without
        leasing or changing them, each with its state; filters as in
        pgbroker.queues._queries.message_peek_many. The next page: ``after=`` the last msg_id of this one."""
        query = q.message_peek_many(
            self.name,
            qty,
            after=after,
            state=state,
            before=before,
            header=header,
            header_value=header_value,
            enqueued_after=enqueued_after,
            enqueued_before=enqueued_before,
            contains=contains,
        )
        return await self._executor.run(query)

    async def pop(self) -> Message | None:
        """Delete and return the oldest visible message (at-most-once delivery)."""
        found = await self.pop_many(1)
        return found[0] if found else None

    async def pop_many(self, qty: int) -> list[Message]:
        return await self._executor.run(q.message_pop_many(self.name, qty))

    # fenced acknowledgement

    async def ack(self, item: Receivable, *, archive: bool = True) -> None:
        """Archive (or delete) a read message; StaleReceipt if its lease no longer holds."""
        with tracing.span("ack", self.name) as span:
            query = q.message_ack(self.name, item, archive=archive)
            if span is not None:
                tracing.settled(span, [arg.receipt_of(item).msg_id])
            await self._executor.run(query)

    async def ack_many(self, items: Iterable[Receivable], *, archive: bool = True) -> list[int]:
        """Ack every message whose receipt still holds; returns their msg_ids (stale ones are left)."""
        with tracing.span("ack", self.name) as span:
            acked = await self._executor.run(q.message_ack_many(self.name, items, archive=archive))
            tracing.settled(span, acked)
            return acked

    async def nack(self, item: Receivable, *, delay: int | timedelta = 0) -> None:
        """Give a message back: visible again after ``delay`` seconds; StaleReceipt if stale."""
        with tracing.span("nack", self.name) as span:
            query = q.message_nack(self.name, item, delay=delay)
            if span is not None:
                tracing.settled(span, [arg.receipt_of(item).msg_id])
            await self._executor.run(query)

    async def nack_many(self, items: Iterable[Receivable], *, delay: int | timedelta = 0) -> list[int]:
        with tracing.span("nack", self.name) as span:
            nacked = await self._executor.run(q.message_nack_many(self.name, items, delay=delay))
            tracing.settled(span, nacked)
            return nacked

    async def extend(self, item: Receivable, *, vt: int | timedelta) -> Receipt:
        """Make the lease end vt seconds from now; returns the new receipt (the old one is spent)."""
        return await self._executor.run(q.message_extend(self.name, item, vt=vt))

    async def extend_many(self, items: Iterable[Receivable], *, vt: int | timedelta) -> dict[int, Receipt]:
        return await self._executor.run(q.message_extend_many(self.name, items, vt=vt))

    # outcomes by the queue's policy

    async def complete_many(self, items: Iterable[Receivable]) -> list[int]:
        """Ack as the queue's policy says (archive or delete); returns the msg_ids whose receipts held."""
        return await self._executor.run(q.message_complete_many(self.name, items))

    async def fail(self, item: Receivable, *, error: str | None = None, traceback: str | None = None) -> str:
        """Report a failed delivery: 'retry' (visible again after the policy's back-off) or
        'dead_lettered' (that was its last allowed delivery); StaleReceipt if stale. The error
        and traceback are kept with the message (header x-pgbroker-attempts, the latest ten)."""
        return await self._executor.run(q.message_fail(self.name, item, error=error, traceback=traceback))

    async def fail_many(
        self, items: Iterable[Receivable], *, error: str | None = None, traceback: str | None = None
    ) -> dict[int, str]:
        """fail() for many receipts with one error: {msg_id: 'retry' | 'dead_lettered'} for those
        whose receipts held; stale ones are left out and change nothing."""
        query = q.message_fail_many(self.name, items, error=error, traceback=traceback)
        return await self._executor.run(query)

    if ASYNC:
        # The RabbitMQ bridge's calls (pgbroker.bridge runs on asyncio only).

        async def ack_published_many(
            self, items: Sequence[Receivable], published: Sequence[Mapping[str, Any]]
        ) -> list[int]:
            """Ack by policy messages a broker confirmed, archived ones with their publish records
            (header x-pgbroker-published); returns the msg_ids whose receipts held."""
            return await self._executor.run(q.message_ack_published_many(self.name, items, published))

        async def receive_many(
            self,
            message_ids: Sequence[str | None],
            messages: Sequence[Any],
            headers: Sequence[Mapping[str, Any] | None],
            *,
            seen_within: float,
        ) -> list[tuple[str | None, int]]:
            """Send messages from another broker, skipping ids seen within ``seen_within`` seconds
            (see pgbroker.queues._queries.message_receive_many)."""
            query = q.message_receive_many(self.name, message_ids, messages, headers, seen_within=seen_within)
            return await self._executor.run(query)

    async def policy(self) -> Policy:
        """The queue's policy (the defaults when none was set)."""
        return await self._executor.run(q.policy_get(self.name))

    async def set_policy(self, **changes: Unpack[PolicyChanges]) -> Policy:
        """Change the settings given (see PolicyChanges); returns the policy now in force."""
        self._default_codecs.forget(self.name)
        return await self._executor.run(q.policy_set(self.name, changes))

    async def pause(self) -> bool:
        """Stop every read of the queue (sends go on); False if it was paused already."""
        return await self._executor.run(q.queue_pause(self.name))

    async def resume(self) -> bool:
        """Let reads take messages again; False if the queue was not paused."""
        return await self._executor.run(q.queue_resume(self.name))

    async def dead_letters(self, qty: int = 100, *, after: int = 0) -> list[Message]:
        """This queue's dead letters, oldest first, each with the msg_id it had here; their headers
        say why (x-pgbroker-dead-letter) and what each failed attempt raised (x-pgbroker-attempts)."""
        return await self._executor.run(q.dead_letter_list(self.name, qty, after=after))

    async def dead_letter(self, msg_id: int) -> Message | None:
        """One dead letter of this queue, by the msg_id it had here (the one its consumers saw),
        with its failed attempts (header x-pgbroker-attempts); None when there is none."""
        return await self._executor.run(q.dead_letter_get(self.name, msg_id))

    async def replay_dead_letters(self, msg_ids: Iterable[int] | None = None) -> dict[int, int]:
        """Send dead letters back to this queue (all, or those given by the msg_ids they had here):
        {that msg_id: new msg_id}."""
        return await self._executor.run(q.dead_letter_replay_many(self.name, msg_ids))

    async def purge_dead_letters(self, msg_ids: Iterable[int] | None = None) -> int:
        """Delete dead letters (all, or those given); returns how many."""
        return await self._executor.run(q.dead_letter_purge_many(self.name, msg_ids))

    async def trim_archive(self, batch_size: int = q.DEFAULT_TRIM_BATCH) -> int:
        """Apply the archive retention to at most batch_size rows; returns how many went (repeat until 0)."""
        return await self._executor.run(q.archive_trim(self.name, batch_size))

    async def trim_dedup_keys(self, batch_size: int = q.DEFAULT_TRIM_BATCH) -> int:
        """Forget at most batch_size dedup keys whose time is over; returns how many (repeat until 0)."""
        return await self._executor.run(q.dedup_keys_trim(self.name, batch_size))

    # unfenced, by msg_id (pgmq's semantics)

    async def archive(self, msg_id: int) -> bool:
        return bool(await self.archive_many([msg_id]))

    async def archive_many(self, msg_ids: Iterable[int]) -> list[int]:
        return await self._executor.run(q.message_archive_many(self.name, msg_ids))

    async def delete(self, msg_id: int) -> bool:
        return bool(await self.delete_many([msg_id]))

    async def delete_many(self, msg_ids: Iterable[int]) -> list[int]:
        return await self._executor.run(q.message_delete_many(self.name, msg_ids))

    async def set_vt(self, msg_id: int, vt: int | timedelta | datetime) -> Message | None:
        found = await self._executor.run(q.message_set_vt_many(self.name, [msg_id], vt))
        return found[0] if found else None

    # the queue as a whole

    async def enable_notify(
        self, throttle_ms: int = q.DEFAULT_NOTIFY_THROTTLE_MS, *, keep_existing: bool = False
    ) -> None:
        """Notify waiting readers of sends, at most once per ``throttle_ms`` milliseconds (idempotent).

        A message sent within throttle_ms of a notified one is not announced:
        waiting readers find it at their next poll. 0 announces every send
        (concurrent ones share a notification). Notifying transactions commit
        one at a time (Postgres' notify lock), so keep a throttle on queues
        with many concurrent senders. keep_existing=True leaves a queue that
        already notifies with the throttle it has.
        """
        builder = q.notify_enable_if_disabled if keep_existing else q.notify_enable
        await self._executor.run(builder(self.name, throttle_ms))

    async def disable_notify(self) -> None:
        await self._executor.run(q.notify_disable(self.name))

    async def purge(self) -> int:
        """Delete every message (not the archive); returns how many there were."""
        return await self._executor.run(q.queue_purge(self.name))

    async def metrics(self) -> Metrics:
        return await self._executor.run(q.queue_metrics(self.name))


class AsyncTransaction:
    """A transaction on one connection, shared by the caller's own SQL and pgbroker's."""

    def __init__(
        self, conn: psycopg.AsyncConnection[Any], listener: AsyncListener, default_codecs: DefaultCodecs
    ) -> None:
        self.connection = conn
        self._executor = AsyncConnectionExecutor(conn)
        self._listener = listener
        self._default_codecs = default_codecs

    def queue(self, name: str) -> AsyncQueue:
        return AsyncQueue(name, self._executor, self._listener, self._default_codecs)


class AsyncBroker:
    """Entry point: a DSN (pooled), a pool, or a single connection; ``async with AsyncBroker(dsn)``.

    With none of them the DSN comes from DATABASE_URL, else the embedded
    cluster is started (see pgbroker._db.dsn). A read that waits and finds nothing
    reads again every ``poll_interval`` seconds, or sooner when notified.

    ``pooler``: what stands between the broker and Postgres, "transaction" (pgbouncer's
    pool_mode = transaction, RDS Proxy, Supavisor), "session" or "none"; by default
    $PGBROKER_POOLER, else "none". Behind a transaction pooler the connections the broker
    opens run their statements unprepared, and waiting reads poll instead of listening
    unless $PGBROKER_LISTEN_DSN names a direct connection (a pool or connection passed in
    keeps its own settings: give it ``prepare_threshold=None``).

    A pool made from a DSN keeps ``min_connections`` open and opens up to ``max_connections``.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        connection: psycopg.AsyncConnection[Any] | None = None,
        max_connections: int = 10,
        min_connections: int = 1,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
        pooler: PoolerMode | None = None,
    ) -> None:
        if sum(x is not None for x in (dsn, pool, connection)) > 1:
            raise ValueError("pass at most one of dsn, pool and connection")
        timeouts = PoolTimeouts(connect_timeout, pool_timeout)
        mode = pooler_mode(pooler)
        if not (isinstance(min_connections, int) and 1 <= min_connections <= max_connections):
            raise InvalidArgument(
                f"min_connections must be an integer from 1 to max_connections ({max_connections}), "
                f"got {min_connections!r}"
            )
        self._listener = AsyncListener(self._listen_conninfo, poll_interval, mode, timeouts.connect)
        self._default_codecs = DefaultCodecs()  # each queue's send codec, shared by its AsyncQueues
        self._owned_pool: AsyncConnectionPool | None = None
        self._connection = connection
        if connection is None and pool is None:
            conninfo = resolve_dsn(dsn)
            pool = AsyncConnectionPool(
                conninfo,
                min_size=min_connections,
                max_size=max_connections,
                kwargs=timeouts.connection_kwargs(conninfo, mode),
                open=False,
                name="pgbroker-async",  # sync: name="pgbroker",
                timeout=timeouts.pool,
                reconnect_timeout=RECONNECT_CEILING,
                configure=session.configure_async,  # sync: configure=session.configure,
            )
            self._owned_pool = pool
        self._pool = pool
        if self._owned_pool is not None:
            if ASYNC:
                pass  # an async pool opens in open(), on a running event loop
            else:
                self._open_owned_pool()
        self._executor: AsyncExecutor = (
            AsyncConnectionExecutor(connection) if connection is not None else AsyncPoolExecutor(pool)  # type: ignore[arg-type]
        )

    if ASYNC:

        async def open(self) -> AsyncBroker:
            """Open the pool this broker made from a DSN (``async with`` does it): an async pool
            cannot open in the constructor, outside a running event loop."""
            if self._owned_pool is not None:
                await self._open_owned_pool()
            return self

    async def _open_owned_pool(self) -> None:
        """Open the pool made from a DSN once the server has answered one connection: a server
        that cannot be reached fails here, with libpq's own words (refused, unknown host, bad
        password), not with a PoolTimeout that hides them on the first call."""
        pool = self._owned_pool
        assert pool is not None
        refused = await self.connect_error()
        if refused is not None:
            assert isinstance(pool.conninfo, str)
            raise DatabaseError(
                f"cannot connect to the database: {hide_passwords(str(refused).strip(), pool.conninfo)}",
                hint="Is the server running, and the DSN right (host, port, user, password)?",
            ) from safe_cause(refused, pool.conninfo)
        await pool.open()

    async def connect_error(self) -> psycopg.OperationalError | None:
        """Why a new connection to the broker's database fails now, in libpq's words (None when
        one can be made, or the broker was given a single connection): a pool that found no
        connection in time says only that (PoolTimeout), not that the server refused its login."""
        if self._pool is None:
            return None
        # A pool made without kwargs keeps None (psycopg_pool 3.3): the watch died on it. Made
        # with callables instead (3.3 too), a pool resolves them at each connection: not here.
        conninfo, kwargs = self._pool.conninfo, self._pool.kwargs or {}
        assert isinstance(conninfo, str)
        assert isinstance(kwargs, dict)
        try:
            probe = await psycopg.AsyncConnection.connect(conninfo, **kwargs)
        except psycopg.OperationalError as exc:
            return exc
        await probe.close()
        return None

    def failed_connections(self) -> int:
        """How many of its pool's connection attempts have failed since it opened (0 without a pool)."""
        return 0 if self._pool is None else self._pool.get_stats().get("connections_errors", 0)

    async def __aenter__(self) -> AsyncBroker:
        return await self.open()  # sync: return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the listener and the pool this broker opened (a pool or connection passed in stays open)."""
        await self._listener.close()
        if self._owned_pool is not None:
            await self._owned_pool.close()

    @property
    def single_connection(self) -> bool:
        """Whether every call shares the one connection passed in (not a pool's)."""
        return self._connection is not None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._connection is not None:
            yield self._connection
        else:
            assert self._pool is not None
            async with _live_connection(self._pool) as conn:
                yield conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncTransaction]:
        """A transaction whose queue operations commit or roll back with the caller's own SQL."""
        async with self.connection() as conn, conn.transaction():
            yield AsyncTransaction(conn, self._listener, self._default_codecs)

    async def _listen_conninfo(self) -> str:
        direct = listen_dsn()  # behind a transaction pooler, LISTEN needs a connection of its own
        if direct:
            return direct
        pool = self._pool
        if pool is not None and isinstance(pool.conninfo, str) and not callable(pool.kwargs):
            # As the pool was given it (every host of a list), not the server that answered.
            return listen_conninfo(pool.conninfo, pool.kwargs)
        async with self.connection() as conn:
            return conninfo_of(conn.info)

    async def install(self) -> InstallResult:
        """Install or upgrade the schema (idempotent)."""
        async with self.connection() as conn:
            return await install_async(conn)

    def queue(self, name: str) -> AsyncQueue:
        return AsyncQueue(name, self._executor, self._listener, self._default_codecs)

    async def create_queue(self, name: str, *, unlogged: bool = False, notify: bool = False) -> AsyncQueue:
        """Create a queue if it does not exist (idempotent) and return it.

        notify=True also enables notify with the default throttle (AsyncQueue.enable_notify).
        """
        with_notify = arg.flag(notify, "notify")  # judged before anything is made
        await self._executor.run(q.queue_create(name, unlogged=unlogged))
        queue = self.queue(name)
        if with_notify:
            await queue.enable_notify()
        return queue

    async def drop_queue(self, name: str) -> bool:
        """Drop a queue and its archive; False when there was no such queue."""
        return await self._executor.run(q.queue_drop(name))

    async def list_queues(self) -> list[QueueInfo]:
        return await self._executor.run(q.queue_list())

    async def metrics(self, name: str) -> Metrics:
        return await self._executor.run(q.queue_metrics(name))

    async def metrics_all(self) -> list[Metrics]:
        return await self._executor.run(q.queue_metrics_all())

    if ASYNC:

        async def prune_inbound_seen(
            self, seen_within: float, batch_size: int = q.DEFAULT_TRIM_BATCH, *, queue: str | None = None
        ) -> int:
            """Forget inbound message ids older than ``seen_within`` seconds, of ``queue`` or (None) of
            every queue, one batch; returns how many."""
            return await self._executor.run(q.inbound_seen_prune(seen_within, batch_size, queue))

    async def policies(self) -> list[Policy]:
        """Every queue's policy, by queue name."""
        return await self._executor.run(q.policy_list())

    async def trim_dedup_keys(self, queue: str | None = None, batch_size: int = q.DEFAULT_TRIM_BATCH) -> int:
        """Forget at most batch_size expired dedup keys of every queue (or of one); repeat until 0."""
        return await self._executor.run(q.dedup_keys_trim(queue, batch_size))

    # schedules (sql/functions/78_schedules.sql): the engine decides what is sent and when

    async def add_schedule(
        self,
        name: str,
        queue: str,
        cron: str,
        message: Any,
        *,
        headers: Mapping[str, Any] | None = None,
        timezone: str = "UTC",
        replace: bool = False,
    ) -> Schedule:
        """Send ``message`` to ``queue`` at every tick of ``cron`` (5 fields) in ``timezone`` (IANA).

        A schedule of that name is refused (InvalidArgument) unless ``replace``. Ticks are sent by
        schedulers: every worker runs one (pgbroker.runtime._app.serve), ``pgbroker scheduler`` runs one
        alone, or call run_due_schedules().
        """
        query = q.schedule_add(
            name, queue, cron, message, headers=headers, timezone=timezone, replace=replace
        )
        return await self._executor.run(query)

    async def schedules(self) -> list[Schedule]:
        return await self._executor.run(q.schedule_list())

    async def remove_schedule(self, name: str) -> bool:
        """Remove a schedule; False when there was none of that name."""
        return await self._executor.run(q.schedule_remove(name))

    async def pause_schedule(self, name: str) -> Schedule:
        return await self._executor.run(q.schedule_pause(name))

    async def resume_schedule(self, name: str) -> Schedule:
        """Run a paused schedule again from its next tick after now (a pause is not caught up)."""
        return await self._executor.run(q.schedule_resume(name))

    async def run_due_schedules(self, as_of: datetime | None = None) -> list[ScheduleTick]:
        """Send every due tick once (however many schedulers call this); see pgbroker.schedule_tick."""
        return await self._executor.run(q.schedule_tick(as_of))

    async def schedule_next_wake(self) -> float | None:
        """Seconds until the next tick of any running schedule (0: one is due); None without one."""
        return await self._executor.run(q.schedule_next_wake())

    async def listen_schedules(self, timeout: float = 5.0) -> AsyncSubscription:
        """Wake-ups when schedules are added, changed, paused, resumed or removed."""
        return await self._listener.subscribe(
            _SCHEDULES_KEY, lambda within: self._executor.run_within(within, q.schedules_channel()), timeout
        )


async def blocking_sessions(
    owner: Any, older_than: float = 60.0, stream: str | None = None
) -> list[BlockingSession]:
    """The sessions whose transaction has been open longer than ``older_than`` seconds and that
    hold the engine's tables or the xmin horizon, the oldest first (pgbroker.blocking_sessions);
    with ``stream``, those that hold its log's tables or the ring of positions, which its
    retention and the ring's rotation cannot then empty. ``owner``: an AsyncBroker, or a
    transaction of one."""
    executor: AsyncExecutor = owner._executor
    return await executor.run(q.blocking_sessions(older_than, stream))
