"""The markers of the external services, and a guard that every test starting one carries its.

A test is marked with a service when it asks for that service's fixture (``FIXTURE_SERVICES``,
applied at collection, so the hundreds of tests using them need no decorator), by a module-level
``pytestmark`` where a whole file needs the service, or per parameter (tests/support/services.py)
where a test runs over several brokers.

The guard is an audit hook (PEP 578) on the pytest process: when a test starts a service's
program (a broker, a JVM, chromedriver, pgbouncer) or connects to the shared RabbitMQ without
that service's marker, the call raises and the test fails naming the marker it lacks. So
``-m 'not rabbitmq and ...'`` really means "without RabbitMQ", and a new test cannot quietly
need a service the quick run does not have.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
from collections.abc import Generator, Sequence
from typing import Any

import pytest

from tests.support.rabbit import amqp_url
from tests.support.services import SERVICES

# A test that asks for one of these fixtures (directly or through another) needs the service.
FIXTURE_SERVICES = {
    "amqp": "rabbitmq",
    "private_rabbit": "rabbitmq",
    "redis_server": "redis",
    "spark": "spark",
    "browser": "browser",
    "pooler": "pgbouncer",
}

# The programs that are a service, by the name the test process runs (the basename of an
# argument: an executable, or the module of ``python -m``).
PROGRAM_SERVICES = {
    "rabbitmq-server": "rabbitmq",
    "redis-server": "redis",
    "nats-server": "nats",
    "mosquitto": "mqtt",
    "moto.server": "sqs",
    "spark-submit": "spark",
    "spark-class": "spark",
    "java": "spark",
    "pgbroker.spark.jobs": "spark",
    "chromedriver": "browser",
    "chromium": "browser",
    "pgbouncer": "pgbouncer",
}

_running: pytest.Item | None = None


def pytest_configure(config: pytest.Config) -> None:
    registered = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    missing = [service for service in SERVICES if service not in registered]
    if missing:
        raise pytest.UsageError(f"service markers not registered in pyproject.toml: {missing}")
    sys.addaudithook(_guard)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            service = FIXTURE_SERVICES.get(fixture)
            if service is not None:
                item.add_marker(service)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    global _running
    _running = item
    try:
        return (yield)
    finally:
        _running = None


def _guard(event: str, args: tuple[Any, ...]) -> None:
    """Refuse a service to the running test unless it carries the service's marker."""
    if _running is None:
        return
    if event == "subprocess.Popen":
        executable, argv = args[0], args[1]
        service = _service_of(_words(executable, argv))
        what = f"starts {service} ({_program(executable, argv)})"
    elif event == "socket.connect":
        service = "rabbitmq" if _is_shared_rabbitmq(args[1]) else None
        what = "connects to the shared RabbitMQ"
    else:
        return
    if service is not None and _running.get_closest_marker(service) is None:
        raise RuntimeError(
            f"{_running.nodeid} {what} but is not marked '{service}': give it the marker "
            f"(a fixture in tests/plugins/services.py FIXTURE_SERVICES, pytestmark, or "
            f"tests/support/services.py service_params) so that runs without {service} deselect it"
        )


def _words(executable: Any, argv: Any) -> list[str]:
    """The basenames of what a Popen runs: its executable and each word of its command."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = os.fsdecode(argv).split()  # one string: a shell command line, or a bare program
    parts = [executable, *argv] if executable is not None else list(argv)
    return [os.path.basename(os.fsdecode(part)) for part in parts]


def _service_of(words: Sequence[str]) -> str | None:
    return next((PROGRAM_SERVICES[word] for word in words if word in PROGRAM_SERVICES), None)


def _program(executable: object, argv: object) -> str:
    return " ".join(_words(executable, argv)[:4])


def _is_shared_rabbitmq(address: object) -> bool:
    url = urllib.parse.urlsplit(amqp_url())
    shared = (url.hostname or "127.0.0.1", url.port or 5672)
    return isinstance(address, tuple) and len(address) >= 2 and tuple(address[:2]) == shared
