"""Finding a pooled connection the server has closed, before a call is lost on it.

When Postgres restarts (or fails over, or a session is terminated), every idle pooled connection
is dead, and the first call made on each would fail. psycopg_pool's ``check`` callback finds them
with a round trip per checkout, which doubles the round trips of a one-query call, and after each
failed check it backs off (1 s, 2 s, 4 s, ...): with ten dead connections a call waits for many
seconds.

An idle connection has nothing to read unless the server wrote to it: a server that ends a
session sends its FATAL message and closes the socket. So the clients ask the socket of each
connection they take from a pool, without a round trip, whether anything is waiting; if so they
close that connection (the pool replaces a closed connection when it comes back) and take the
next one, at once (pgbroker.queues._client_async's ``_live_connection``). A connection
cut without a word (a network partition), a hung server or a stuck pooler is not found this
way, nor by a round trip before the TCP timeout: ``answered_within`` bounds the wait for an
answer instead (``cut_if_unanswered`` on a blocking connection). ``is_transient`` tells such a
lost connection from other errors, for the workers' retries; a connection to a server that has
become read-only counts as lost: the clients close it (the pool replaces it) when a call fails
on it.

A loop of a long-running process runs its calls under ``stops_with(its stop event)``: once it is
stopping, answered_within gives a call STOP_PATIENCE more seconds at most, so that a stop is prompt
whatever the database does (a pool that has no connection to give, a hung server); and a
long poll's wait ends at the stop (unless_stopping, wakeups.Waiting), answering with what it has.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import threading
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import psycopg

from pgbroker.errors import DatabaseError, PgbrokerError, connection_lost

T = TypeVar("T")


def server_has_written(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the idle connection is closed or has input waiting, found without reading."""
    if conn.closed or conn.broken:
        return True
    return ready_within(conn.fileno(), 0)


def ready_within(fd: int, seconds: float, *, for_writing: bool = False) -> bool:
    """Whether ``fd`` can be read (or written, ``for_writing``) within ``seconds``. With poll, not
    select: select refuses a descriptor numbered 1024 or above (ValueError), which a busy process
    with a raised limit has (a server's client sockets), and every checkout of a connection failed."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if for_writing else select.POLLIN)
    return bool(poller.poll(max(0, round(seconds * 1000))))


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a lost or refused connection, or one to a read-only server (the same
    call may succeed soon, on a new connection).

    psycopg reports the first, and pool timeouts, as OperationalError; the clients wrap errors
    raised by a query in pgbroker's types, with the psycopg error as the cause.
    """
    return isinstance(_psycopg_error(exc), psycopg.OperationalError) or is_read_only_server(exc)


def is_lost_connection(exc: BaseException) -> bool:
    """Whether ``exc`` is a lost or refused connection (no connection from the pool in time
    included), or one to a read-only server: what is_transient counts, less the calls the server
    refused on a live connection (a lock or statement timeout, a deadlock)."""
    cause = _psycopg_error(exc)
    return (isinstance(cause, psycopg.Error) and connection_lost(cause)) or is_read_only_server(exc)


def is_denied(exc: BaseException) -> bool:
    """Whether ``exc`` says the role may not do that (42501): trying again changes nothing."""
    if isinstance(exc, PgbrokerError):
        return exc.sqlstate == _INSUFFICIENT_PRIVILEGE
    return isinstance(exc, psycopg.errors.InsufficientPrivilege)


_INSUFFICIENT_PRIVILEGE = "42501"


def is_read_only_server(exc: BaseException) -> bool:
    """Whether ``exc`` says the server takes no writes (25006: a standby, "cannot execute ...
    during recovery", or a primary demoted by a switchover): the connection is to the wrong
    server, and a new one, made from the DSN as given (target_session_attrs=read-write), finds
    the primary."""
    return isinstance(_psycopg_error(exc), psycopg.errors.ReadOnlySqlTransaction)


def _psycopg_error(exc: BaseException) -> BaseException | None:
    return exc.__cause__ if isinstance(exc, DatabaseError) else exc


class NoAnswer(psycopg.OperationalError):
    """What answered_within raises: the server did not answer within ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer from the server within {seconds:g} s")
        self.seconds = seconds


class StopCut(NoAnswer):
    """What answered_within raises when the loop stopping gave up waiting for the answer."""

    def __init__(self) -> None:
        psycopg.OperationalError.__init__(
            self, f"given up at the stop: no answer from the server within {STOP_PATIENCE:g} s"
        )
        self.seconds = STOP_PATIENCE


# Once a loop is stopping, how long a call of it may still wait for its answer. A healthy server
# answers within milliseconds; a pool with no connection to give (the server down, a login
# refused, no free slot) or a hung server would hold the stop for a pool timeout or a lease (30 s
# each), past a process manager's patience (Kubernetes kills 30 s after SIGTERM).
STOP_PATIENCE = 3.0

# The stop event of the loop the current task works for (stops_with), inherited by the tasks it starts.
_stopping: ContextVar[asyncio.Event | None] = ContextVar("pgbroker_stopping", default=None)


@contextmanager
def stops_with(stopping: asyncio.Event) -> Iterator[None]:
    """In this block, and in the tasks started from it, answered_within cuts its calls short
    STOP_PATIENCE seconds after ``stopping`` is set (at once for a call made after that), raising
    StopCut: what those calls held comes back as after a lost connection (leases run out)."""
    token = _stopping.set(stopping)
    try:
        yield
    finally:
        _stopping.reset(token)


def stop_requested() -> bool:
    """Whether the loop the current task works for is stopping (stops_with): a call that failed
    is then not tried again."""
    stopping = _stopping.get()
    return stopping is not None and stopping.is_set()


async def unless_stopping(wait: Awaitable[object]) -> None:
    """``wait`` (a sleep, a wait for news: nothing that changes anything), ended at once (cancelled)
    when the loop the current task works for is stopping (stops_with): a long poll then answers
    with what it has, at the stop rather than at the end of its wait."""
    task = asyncio.ensure_future(wait)
    stopping = _stopping.get()
    if stopping is None:
        await task
        return
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
    if not task.cancelled():
        task.result()


async def answered_within(seconds: float, call: Awaitable[T]) -> T:
    """``call``, failed as a lost connection (NoAnswer, a psycopg.OperationalError: is_transient)
    when the server has not answered within ``seconds`` (the workers pass a lease: past it the
    answer is of no use, the leases it acts on or hands out having run out), since a hung server,
    a stuck pooler or a connection cut without a word may never answer; or, under stops_with,
    within STOP_PATIENCE seconds of the stop (StopCut).

    The call given up is cancelled and left to end on its own (_abandon): psycopg asks the server
    to cancel the query and, with no answer to that within 5 s either, closes the connection (the
    pool replaces it, and it is never used again). Waiting for that here delayed the NoAnswer by
    those 5 s. A caller that is cancelled itself cancels the call, waits for it, and raises
    CancelledError even when the call swallowed its own: psycopg_pool waits for a connection with
    asyncio.wait_for, which on Python 3.11 returns a result that comes together with a cancellation
    (CPython gh-86296), so a loop awaiting a pooled connection directly went on after the stop
    cancelled it; through answered_within, it ends."""
    task = asyncio.ensure_future(call)
    stopping = _stopping.get()
    try:
        answered = await _answer(task, seconds, stopping)
    except BaseException:
        task.cancel()
        await asyncio.wait([task])
        raise
    if not answered:
        _abandon(task)
        raise StopCut() if stopping is not None and stopping.is_set() else NoAnswer(seconds)
    return task.result()


async def _answer(task: asyncio.Future[Any], seconds: float, stopping: asyncio.Event | None) -> bool:
    """Wait for ``task`` up to ``seconds``, and no longer than STOP_PATIENCE once ``stopping`` is set."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    if stopping is not None and not stopping.is_set():
        stopped = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait([task, stopped], timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
    left = deadline - loop.time()
    if stopping is not None and stopping.is_set():
        left = min(left, STOP_PATIENCE)
    if not task.done() and left > 0:
        await asyncio.wait([task], timeout=left)
    return task.done()


# The calls given up and still ending: held here, since the event loop keeps only weak references.
_abandoned: set[asyncio.Future[Any]] = set()


def _abandon(task: asyncio.Future[Any]) -> None:
    task.cancel()
    _abandoned.add(task)
    task.add_done_callback(_ended)


def _ended(task: asyncio.Future[Any]) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: it failed after it was given up, which NoAnswer said already


@contextmanager
def cut_if_unanswered(conn: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """answered_within for a blocking connection: a call on ``conn`` inside fails with NoAnswer
    once ``seconds`` have passed without the block ending. The connection's socket is shut down
    then, which wakes the call at once (statement_timeout cannot, nor can TCP keepalives: a
    stopped backend's kernel still answers them); the connection is cut for good (a pool
    discards it)."""
    cut = _Cut(conn)
    timer = threading.Timer(seconds, cut.fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception as exc:
        if cut.fired:  # whatever the call made of the cut (the clients wrap psycopg's error)
            raise NoAnswer(seconds) from exc
        raise
    finally:
        timer.cancel()
        cut.disarm()


class _Cut:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._armed = True
        self.fired = False

    def fire(self) -> None:
        with self._lock:
            if not self._armed:
                return  # the call ended meanwhile
            self.fired = True
        try:
            sock = socket.socket(fileno=os.dup(self._conn.fileno()))
        except (OSError, psycopg.Error):
            return  # closed already: nothing waits on it
        with sock:
            # On a copy of the descriptor: the shutdown reaches the socket itself, and the call
            # waiting on it reads the end of the stream.
            sock.shutdown(socket.SHUT_RDWR)

    def disarm(self) -> None:
        with self._lock:
            self._armed = False
