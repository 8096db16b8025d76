"""Fixtures of the bridge tests: a private Redis for a module (marked redis by its name,
tests/plugins/services.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.postgres import scratch_dir
from tests.support.servers import KINDS, PrivateServer


@pytest.fixture(scope="module")
def redis_server() -> Iterator[PrivateServer]:
    node = PrivateServer(KINDS["redis"], scratch_dir("pgbroker-redis-"))
    node.start()
    try:
        yield node
    finally:
        node.close()
