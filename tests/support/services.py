"""The external services some tests need beyond Postgres, each a pytest marker of the same name
(registered in pyproject.toml; tests/README.md lists them)."""

from __future__ import annotations

import pytest

SERVICES = ("rabbitmq", "redis", "nats", "mqtt", "sqs", "spark", "browser", "pgbouncer")


def service_params(*services: str) -> list[pytest.ParameterSet]:
    """Parameters that are service names, each marked with its service: for a fixture or a test
    parametrized over brokers, so that deselecting a service deselects its cases."""
    unknown = set(services) - set(SERVICES)
    assert not unknown, f"not a service marker: {sorted(unknown)}"
    return [pytest.param(service, marks=getattr(pytest.mark, service)) for service in services]
