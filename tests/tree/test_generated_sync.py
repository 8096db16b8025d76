"""The committed sync twins are what scripts/async_to_sync.py makes of the asyncio modules now, to
the byte: a change to an asyncio module without `make generate` fails here (and `make lint`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from scripts.async_to_sync import TARGETS, Target, generate

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.generated)
def test_the_generated_sync_module_is_up_to_date(target: Target) -> None:
    source = (ROOT / target.source).read_text()
    generated = (ROOT / target.generated).read_text()
    assert generated == generate(source, target), (
        f"{target.generated} is stale: run `make generate` (python scripts/async_to_sync.py)"
    )


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.generated)
def test_the_generated_sync_module_is_committed(target: Target) -> None:
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--error-unmatch", target.generated],
        capture_output=True,
        check=False,
    )
    assert tracked.returncode == 0, f"{target.generated} is not in git: users import it"


def test_the_client_that_imports_is_the_generated_one() -> None:
    import pgbroker.queues._client

    generated = (ROOT / TARGETS[0].generated).resolve()
    assert Path(pgbroker.queues._client.__file__).resolve() == generated


def test_async_only_code_and_sync_replacements_follow_the_markers() -> None:
    source = '''# hand-written
"""The asyncio client: AsyncBroker."""

import asyncio

ASYNC = True


class AsyncBroker:
    async def __aenter__(self) -> AsyncBroker:
        return await self.open()  # sync: return self

    if ASYNC:

        async def open(self) -> AsyncBroker:
            await asyncio.sleep(0)
            return self

    async def wait(self) -> None:
        """Sleep inside ``async with AsyncBroker()``."""
        if ASYNC:
            pass
        else:
            print("sync")
        await asyncio.sleep(1)
'''
    expected = '''# Generated from _client_async.py by scripts/async_to_sync.py; do not edit.
# Change src/pgbroker/queues/_client_async.py, then run `make generate` (python scripts/async_to_sync.py).
"""The synchronous client: Broker."""

import time


class Broker:
    def __enter__(self) -> Broker:
        return self

    def wait(self) -> None:
        """Sleep inside ``with Broker()``."""
        print("sync")
        time.sleep(1)
'''
    assert generate(source, TARGETS[0]) == expected


@pytest.mark.parametrize(
    ("source", "complaint"),
    [
        ("import asyncio\n\nasyncio.Event()\n", "asyncio has no sync equivalent"),
        ("if ASYNC:\n    a = 1\nelif b:\n    a = 2\n", "takes an else, not an elif"),
        ("ASYNC = True\nprint(ASYNC)\n", "ASYNC is left"),
    ],
)
def test_what_has_no_sync_form_stops_the_generator(source: str, complaint: str) -> None:
    with pytest.raises(SystemExit, match=complaint):
        generate(source, TARGETS[0])
