"""Fixtures for the stream tests: the integration fixtures (a fresh database per test), and the
chaos test's private cluster (tests/system/test_worker_chaos.py)."""

from tests.integration.conftest import broker, module_conn, module_dsn  # noqa: F401
from tests.system.test_worker_chaos import cluster  # noqa: F401
