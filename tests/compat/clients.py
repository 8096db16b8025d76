"""The two official pgmq clients on a pgbroker database, and what differs in using them.

The clients are built from the pgbroker DSN with their ``CREATE EXTENSION pgmq`` step switched off
(``init_extension=False``): pgbroker is plain SQL, not an extension, and the client must work
against it unchanged. A ``Flavour`` is one of the two: ``PGMQueue`` (psycopg) and
``AsyncPGMQueue`` (asyncpg), the async one driven through ``Blocking`` so that one written test
serves both; the few calls whose form differs go through the flavour.
"""

from __future__ import annotations

import asyncio
import inspect
import urllib.parse
from collections.abc import Awaitable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypedDict, TypeVar, cast

import asyncpg  # type: ignore[import-untyped]
import psycopg
from pgmq import AsyncPGMQueue, PGMQueue
from psycopg.conninfo import conninfo_to_dict


class ConnectionFields(TypedDict):
    """The connection keyword arguments of the pgmq clients."""

    host: str
    port: str
    database: str
    username: str
    password: str


def client_connection_fields(dsn: str, *, for_asyncpg: bool = False) -> ConnectionFields:
    """The pgmq client's connection keyword arguments for a libpq DSN.

    The client builds its own connection string from host/port/database/username/password. For
    psycopg (sync client) a Unix-socket directory works as ``host`` as it is. The async client
    builds a URI (``postgresql://user:pw@host:port/db``) for asyncpg, where a path would break the
    URI; asyncpg percent-decodes the host, so the directory is passed percent-encoded.
    """
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "localhost")
    if for_asyncpg and host.startswith("/"):
        host = urllib.parse.quote(host, safe="")
    return {
        "host": host,
        "port": str(params.get("port") or "5432"),
        "database": str(params["dbname"]),
        "username": str(params.get("user") or "postgres"),
        # The client insists on a non-empty password; a trust-auth server ignores it.
        "password": str(params.get("password") or "postgres"),
    }


def make_sync_client(dsn: str, **options: Any) -> PGMQueue:
    """The official sync client on ``dsn``, without its extension-install step."""
    return PGMQueue(**client_connection_fields(dsn), init_extension=False, pool_size=4, **options)


async def make_async_client(dsn: str, **options: Any) -> AsyncPGMQueue:
    """The official asyncio client (asyncpg) on ``dsn``, initialised, without the extension step."""
    client = AsyncPGMQueue(
        **client_connection_fields(dsn, for_asyncpg=True), init_extension=False, pool_size=4, **options
    )
    await client.init()
    return client


T = TypeVar("T")


class Blocking:
    """The asyncio client called like the sync one: a coroutine a method returns is run to its end.

    Every call runs on one private event loop (the asyncpg pool is bound to it); attributes that
    are not methods (``pool``) are the async client's own.
    """

    def __init__(self, runner: asyncio.Runner, client: AsyncPGMQueue) -> None:
        self._runner = runner
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            return self._runner.run(result) if inspect.iscoroutine(result) else result

        return call


class Flavour:
    """One of the two official clients, and what differs in using it: errors, caller transactions."""

    name: str
    client_class: type
    # What the client raises for a server error; both carry the SQLSTATE as ``sqlstate``.
    error: type[Exception]
    # What it raises for pgmq's two usual failures: a missing queue's table (42P01) and one of
    # pgmq's RAISE EXCEPTIONs (P0001).
    undefined_table: type[Exception]
    raise_exception: type[Exception]

    def connect(self, dsn: str, **options: Any) -> PGMQueue:
        """A client on ``dsn``; the caller closes it."""
        raise NotImplementedError

    def caller_transaction(self, client: PGMQueue) -> AbstractContextManager[Any]:
        """A pooled connection in a transaction of the caller's, for ``conn=``: committed at the end,
        rolled back when the block raises."""
        raise NotImplementedError

    def pool_is_closed(self, pool: Any) -> bool:
        raise NotImplementedError


class SyncFlavour(Flavour):
    name = "sync"
    client_class = PGMQueue
    error = psycopg.Error
    undefined_table = psycopg.errors.UndefinedTable
    raise_exception = psycopg.errors.RaiseException

    def connect(self, dsn: str, **options: Any) -> PGMQueue:
        return make_sync_client(dsn, **options)

    @contextmanager
    def caller_transaction(self, client: PGMQueue) -> Iterator[Any]:
        assert client.pool is not None
        with client.pool.connection() as conn, conn.transaction():
            yield conn

    def pool_is_closed(self, pool: Any) -> bool:
        return bool(pool.closed)


class AsyncFlavour(Flavour):
    name = "async"
    client_class = AsyncPGMQueue
    error = asyncpg.PostgresError
    undefined_table = asyncpg.exceptions.UndefinedTableError
    raise_exception = asyncpg.exceptions.RaiseError

    def __init__(self, runner: asyncio.Runner) -> None:
        self._runner = runner

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run on the clients' event loop."""

        async def wait() -> T:
            return await awaitable

        return self._runner.run(wait())

    def connect(self, dsn: str, **options: Any) -> PGMQueue:
        # Blocking has PGMQueue's methods with the same signatures: the tests are typed against those.
        return cast(PGMQueue, Blocking(self._runner, self.run(make_async_client(dsn, **options))))

    @contextmanager
    def caller_transaction(self, client: PGMQueue) -> Iterator[Any]:
        pool: Any = client.pool
        conn = self.run(pool.acquire())
        try:
            transaction = conn.transaction()
            self.run(transaction.start())
            try:
                yield conn
            except BaseException:
                self.run(transaction.rollback())
                raise
            self.run(transaction.commit())
        finally:
            self.run(pool.release(conn))

    def pool_is_closed(self, pool: Any) -> bool:
        return bool(pool.is_closing())


@contextmanager
def flavour_of(name: str) -> Iterator[Flavour]:
    if name == "sync":
        yield SyncFlavour()
        return
    with asyncio.Runner() as runner:
        yield AsyncFlavour(runner)


def public_methods(cls: type) -> set[str]:
    """Every public callable attribute of a client class (methods, not dataclass field defaults)."""
    return {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name))}
