"""Brokers for bridge round trips: ``broker_urls``, once per broker kind (RabbitMQ, a private Redis,
NATS, MQTT server, moto's SQS), a factory of (out URL, in URL) contexts on it; and ``redis_server``,
a private Redis for a module's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.support.postgres import scratch_dir
from tests.support.probes import probe, unique
from tests.support.rabbit import Rabbit
from tests.support.servers import KINDS, PrivateServer, private_server
from tests.support.services import service_params

# (out URL, in URL) for one broker, made by a context that also cleans up after the test.
Urls = tuple[str, str]


@asynccontextmanager
async def rabbit_urls(amqp: str) -> AsyncIterator[Urls]:
    async with Rabbit(amqp) as rabbit:
        name = await rabbit.queue()
        yield f"{amqp}?routing_key={name}", f"{amqp}?queue={name}"


@pytest.fixture(params=service_params("rabbitmq", "redis", "nats", "mqtt", "sqs"))
def broker_urls(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[], Any]]:
    """A factory of (out URL, in URL) contexts on one broker (a private server but RabbitMQ's)."""
    if request.param == "rabbitmq":
        amqp: str = request.getfixturevalue("amqp")
        yield lambda: rabbit_urls(amqp)
        return
    node = PrivateServer(KINDS[request.param], scratch_dir(f"pgbroker-{request.param}-"))
    node.start()
    try:
        found = probe(request.param, node.port)
        for key, value in found.env.items():
            monkeypatch.setenv(key, value)

        @asynccontextmanager
        async def urls() -> AsyncIterator[Urls]:
            name = unique("bridged")
            await found.prepare_in(name)
            yield found.url(name), found.url(name)

        yield urls
    finally:
        node.close()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[PrivateServer]:
    """A private Redis, shared by the tests of a module."""
    with private_server("redis") as node:
        yield node
