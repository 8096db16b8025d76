"""The client judges its arguments before any query: a wrong type or value is a typed error naming
the argument. The broker here has no database (its pool never opens), so an argument that got as
far as a query would fail with PoolClosed instead."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pgbroker.errors import InvalidArgument, InvalidMessage, InvalidQueueName, PgbrokerError
from pgbroker.queues._client_async import AsyncBroker, AsyncQueue

Call = Callable[[AsyncBroker, AsyncQueue], Awaitable[Any]]


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def refused(call: Call) -> PgbrokerError:
    async def attempt() -> PgbrokerError:
        broker = AsyncBroker("host=127.0.0.1 port=1")  # never opened: no query can run
        with pytest.raises((InvalidArgument, InvalidQueueName)) as info:
            await call(broker, broker.queue("jobs"))
        return info.value

    return asyncio.run(attempt())


# (call, the error, words its message must hold)
CASES: list[tuple[str, Call, type[Exception], str]] = [
    ("create_queue(123)", lambda b, q: b.create_queue(123), InvalidArgument, "queue name must be a string"),  # type: ignore[arg-type]
    ("create_queue(None)", lambda b, q: b.create_queue(None), InvalidArgument, "queue name"),  # type: ignore[arg-type]
    ("metrics(None)", lambda b, q: b.metrics(None), InvalidArgument, "queue name"),  # type: ignore[arg-type]
    ("drop_queue(1)", lambda b, q: b.drop_queue(1), InvalidArgument, "queue name"),  # type: ignore[arg-type]
    ("unlogged", lambda b, q: b.create_queue("x", unlogged="yes"), InvalidArgument, "unlogged"),  # type: ignore[arg-type]
    ("notify", lambda b, q: b.create_queue("x", notify=1), InvalidArgument, "notify"),  # type: ignore[arg-type]
    ("deep message", lambda b, q: q.send(nested(100_000), codec="json"), InvalidMessage, "nested too deeply"),
    (
        "deep headers",
        lambda b, q: q.send(1, headers={"a": nested(100_000)}, codec="json"),
        InvalidMessage,
        "nested",
    ),
    ("deep msgpack", lambda b, q: q.send(nested(100_000), codec="msgpack"), InvalidMessage, ""),
    (
        "messages str",
        lambda b, q: q.send_many("abc", codec="json"),
        InvalidArgument,
        "messages must be a list",
    ),
    ("messages int", lambda b, q: q.send_many(5, codec="json"), InvalidArgument, "messages"),  # type: ignore[arg-type]
    (
        "one headers mapping for a batch",
        lambda b, q: q.send_many([1], headers={"a": 1}, codec="json"),  # type: ignore[arg-type]
        InvalidArgument,
        "one mapping (or None) per message, got a single mapping",
    ),
    ("headers str", lambda b, q: q.send_many([1, 2], headers="ab", codec="json"), InvalidArgument, "headers"),  # type: ignore[arg-type]
    (
        "conditional str",
        lambda b, q: q.read(conditional="x"),  # type: ignore[arg-type]
        InvalidArgument,
        "conditional must be a mapping",
    ),
    ("conditional list", lambda b, q: q.read(conditional=[1]), InvalidArgument, "conditional"),  # type: ignore[arg-type]
    ("decode", lambda b, q: q.read_many(1, decode="no"), InvalidArgument, "decode"),  # type: ignore[arg-type]
    ("archive flag", lambda b, q: q.ack("1:1:1", archive="no"), InvalidArgument, "archive"),  # type: ignore[arg-type]
    ("receipts str", lambda b, q: q.ack_many("1:1:1"), InvalidArgument, "items must be a list"),
    ("msg_ids int", lambda b, q: q.delete_many(5), InvalidArgument, "msg_ids"),  # type: ignore[arg-type]
    ("replay ids int", lambda b, q: q.replay_dead_letters(5), InvalidArgument, "msg_ids"),  # type: ignore[arg-type]
    ("listen timeout", lambda b, q: q.listen(timeout="x"), InvalidArgument, "timeout"),  # type: ignore[arg-type]
    ("qty bool", lambda b, q: q.read_many(True), InvalidArgument, "qty"),
    ("vt str", lambda b, q: q.read(vt="x"), InvalidArgument, "vt"),  # type: ignore[arg-type]
    ("queue with a space", lambda b, q: b.create_queue("a b"), InvalidQueueName, "whitespace"),
]


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_arguments_are_refused_before_any_query(call: Call, error: type[Exception], words: str) -> None:
    found = refused(call)
    assert isinstance(found, error), found
    assert words in str(found)


def test_a_dsn_libpq_cannot_parse_is_an_invalid_argument_without_its_password() -> None:
    # An unencoded % in the password: psycopg's own error, raised as it was, quoted the password.
    with pytest.raises(InvalidArgument) as info:
        AsyncBroker("postgresql://app:Xy7Q%zzZr8W@127.0.0.1:1/db")
    assert "invalid DSN" in str(info.value)
    assert "Xy7Q" not in str(info.value)
    assert info.value.__cause__ is None
