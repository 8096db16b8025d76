"""The order files are handed to the xdist processes: the longest first.

``make test`` runs ``--dist loadfile``: each process takes the next file once it is nearly done
with its own. xdist's own order (most tests first) left the files of a few long tests (chaos,
killed Spark drivers, schedulers running for minutes) to the end, where one process ran them
for minutes while the others had nothing left. Started first, they run beside the many short
files instead. A file's weight is read from its markers, so a new test needs nothing more:
``slow`` (minutes) before ``spark`` (a JVM a module), before any other service, before Postgres
alone; within a weight, more tests first. ``--no-loadscope-reorder`` (in the Makefile) keeps it.
"""

from __future__ import annotations

import pytest

from tests.support.services import SERVICES

# What a marker says of a file's run time; a file weighs the sum of its tests' distinct markers.
MARKER_WEIGHTS = {"slow": 4, "spark": 2}
OTHER_SERVICE_WEIGHT = 1
OTHER_SERVICES = frozenset(SERVICES) - MARKER_WEIGHTS.keys()


def file_weight(items: list[pytest.Item]) -> int:
    """How long a file's tests are expected to take, on the scale of MARKER_WEIGHTS."""
    names = {mark.name for item in items for mark in item.iter_markers()}
    weight = sum(MARKER_WEIGHTS.get(name, 0) for name in names)
    if names & OTHER_SERVICES:
        weight += OTHER_SERVICE_WEIGHT
    return weight


def longest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with whole files reordered, heaviest first (the order within a file is kept)."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ranked = sorted(files.values(), key=lambda tests: (-file_weight(tests), -len(tests)))
    return [item for tests in ranked for item in tests]


@pytest.hookimpl(trylast=True)  # after tests.plugins.services has marked the services
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = longest_files_first(items)
