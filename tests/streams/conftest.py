"""Fixtures for the stream tests: the integration fixtures (a fresh database per test)."""

from tests.integration.conftest import broker, module_conn, module_dsn  # noqa: F401
