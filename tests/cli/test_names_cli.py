"""The CLI refuses a bad queue or stream name as a usage error: the engine's rule, said plainly,
nothing made, and never "a bug in pgbroker"."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgbroker.cli.main import main
from pgbroker.cli.support.errors import Exit


@pytest.mark.parametrize(
    "argv",
    [
        ("create", "a b"),
        ("create", "tab\there"),
        ("create", "nbsp\u00a0x"),
        ("send", "a b", "{}"),
        ("metrics", " lead"),
        ("stream", "create", "a b"),
    ],
)
def test_a_bad_name_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], dsn: str, conn: psycopg.Connection[Any], argv: tuple[str, ...]
) -> None:
    before = conn.execute("SELECT count(*) FROM pgmq.meta").fetchone()
    code = main([*argv, "--dsn", dsn])
    _, err = capsys.readouterr()
    assert code == Exit.USAGE, err
    assert "whitespace or a control character" in err
    assert "bug" not in err
    assert conn.execute("SELECT count(*) FROM pgmq.meta").fetchone() == before
