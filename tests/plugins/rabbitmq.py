"""The shared RabbitMQ the bridge tests use (a test fails, never skips, without one).

The server is $PGBROKER_TEST_AMQP, else amqp://guest:guest@127.0.0.1:5672/; ``make test`` runs
scripts/ensure-rabbitmq first, which makes sure one is there. A test that asks for ``amqp`` is
marked ``rabbitmq`` (tests/plugins/services.py).
"""

from __future__ import annotations

import asyncio

import aiormq
import pytest

from tests.support.rabbit import amqp_url


@pytest.fixture(scope="session")
def amqp() -> str:
    """The AMQP URL of a RabbitMQ that accepted a connection."""
    url = amqp_url()

    async def probe() -> None:
        async with asyncio.timeout(10):
            connection = await aiormq.connect(url)
        await connection.close()

    try:
        asyncio.run(probe())
    except Exception as exc:
        pytest.fail(
            f"the bridge tests need RabbitMQ at {url} and cannot connect: {type(exc).__name__}: {exc}\n"
            "Run scripts/ensure-rabbitmq (make test does), or point PGBROKER_TEST_AMQP at a RabbitMQ.",
            pytrace=False,
        )
    return url
