"""What the CLI prints of the database's text, against a producer or a consumer that writes terminal
escape sequences into it: a message body and headers (any producer), the error and traceback of a
failure report (any consumer of the queue), a stream consumer's name (any consumer of the stream).
An operator looking at them with `pgbroker dlq`, `peek`, `read` or `stream lag` must see them, not
have their terminal run them (clear the screen, retitle the window, write the clipboard, print
what looks like other output)."""

from __future__ import annotations

import json
import re

import pytest
from psycopg.types.json import Jsonb

from tests.support.cli import Cli
from tests.support.streams import read, send
from tests.support.tables import Conn

# What a terminal acts on: the C0 and C1 controls, DEL, and the bidirectional overrides (line and
# paragraph separators too). Output lines are split on "\n" only.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
CLEAR = "\x1b[2J\x1b[H"
TITLE = "\x1b]0;owned\x07"
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"
CSI_C1 = "\x9b31m"
BIDI = "\u202egnp.exe"


@pytest.fixture
def hostile(conn: Conn) -> int:
    """Queue orders with one message still queued and one dead letter, each full of escapes, and a
    stream whose group has a consumer named with one; returns the dead letter's id."""
    conn.execute("SELECT pgmq.create('orders')")
    body = Jsonb({"note": f"{TITLE}{CSI_C1}{BIDI}\x7f"})
    headers = Jsonb({"h": f"{CLEAR}{CSI_C1}"})
    [(dead,)] = conn.execute("SELECT pgmq.send('orders', %s, %s)", (body, headers)).fetchall()
    conn.execute("SELECT pgmq.send('orders', %s, %s)", (body, headers))
    [(receipt,)] = conn.execute("SELECT receipt FROM pgbroker.read('orders', 30, 1)").fetchall()
    conn.execute(
        "SELECT * FROM pgbroker.fail('orders', ARRAY[%s], %s, %s, 1)",
        (receipt, f"{CLEAR}all clear{TITLE}", f"Traceback:\n  {CLIPBOARD}\n{CSI_C1}"),
    )
    conn.execute("SELECT pgbroker.create_stream('clicks', 1)")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', 'start')")
    send(conn, "clicks", [{"n": 1}])
    read(conn, "clicks", "g", f"{CLEAR}root{TITLE}")
    return int(dead)


@pytest.mark.parametrize(
    "command",
    [
        ["dlq", "list", "orders"],
        ["dlq", "list", "orders", "--json"],
        ["dlq", "show", "orders", "DEAD"],
        ["peek", "orders"],
        ["peek", "orders", "--json"],
        ["peek", "orders", "--state", "dead"],
        ["read", "orders"],
        ["stream", "lag", "clicks"],
    ],
)
def test_text_from_the_database_reaches_the_terminal_as_escapes(
    cli: Cli, hostile: int, command: list[str]
) -> None:
    out = cli.ok(*(str(hostile) if arg == "DEAD" else arg for arg in command))
    assert out.strip()
    for line in out.split("\n"):
        assert CONTROL.search(line) is None, line
    # Shown, not dropped: the operator sees what was written.
    assert "\\x1b" in out or "\\u001b" in out, out


def test_a_json_line_keeps_its_meaning(cli: Cli, hostile: int) -> None:
    """The JSON escapes the CLI writes instead are JSON's: a program reading the line gets the
    message as it was sent."""
    [line] = cli.ok("read", "orders").splitlines()
    assert json.loads(line)["message"] == {"note": f"{TITLE}{CSI_C1}{BIDI}\x7f"}


def test_an_indented_json_document_stays_json(cli: Cli, hostile: int) -> None:
    """`schedule list --json` prints one indented document: the newlines between its tokens are
    the document's own, and only the text inside its strings is escaped."""
    message = json.dumps({"note": f"{TITLE}{CSI_C1}{BIDI}"})
    cli.ok("schedule", "add", "nightly", "--queue", "orders", "--cron", "0 3 * * *", "--message", message)
    out = cli.ok("schedule", "list", "--json")
    assert "\n  " in out  # indented
    for line in out.split("\n"):
        assert CONTROL.search(line) is None, line
    [schedule] = json.loads(out)
    assert schedule["message"] == {"note": f"{TITLE}{CSI_C1}{BIDI}"}
