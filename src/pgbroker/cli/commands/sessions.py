"""``pgbroker sessions``: the sessions that hold the engine up (pgbroker.blocking_sessions).

A client that calls pgmq.set_vt or a stream read inside an explicit transaction and leaves it open
(idle in transaction) keeps the rows it locked from the other consumers, a stream's tables from its
retention and the ring's rotation, and every dead tuple newer than it from vacuum. This names it:
its pid, what it holds and for how long, and its last statement.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import asdict

from pgbroker.cli.support.arguments import seconds
from pgbroker.cli.support.output import print_listing
from pgbroker.cli.support.parsers import Subcommands, add_command
from pgbroker.cli.support.tables import age, table
from pgbroker.queues._client import Broker, blocking_sessions
from pgbroker.queues._records import BlockingSession

__all__ = ["register"]

QUERY_WIDTH = 60  # of the last statement, in the table (--json has it whole)
# A queue's or a stream's own tables, named in the table; the engine's are counted (--json names all).
OWN_TABLE = re.compile(r"^(pgmq\.[qa]_|pgbroker\.s_)")


def register(subcommands: Subcommands) -> None:
    summary = "sessions whose long transactions hold queues, streams or vacuum up"
    sub = add_command(subcommands, "sessions", summary, _sessions)
    sub.add_argument(
        "--older-than",
        type=seconds,
        default=60.0,
        metavar="DURATION",
        help="list transactions open at least this long (default: 1m)",
    )


def _sessions(args: argparse.Namespace, broker: Broker) -> int:
    found = blocking_sessions(broker, args.older_than)
    return print_listing(
        args,
        found,
        asdict,
        _table,
        empty=f"no transaction open longer than {age(int(args.older_than))} holds queues, streams or vacuum",
    )


def _table(sessions: Sequence[BlockingSession]) -> str:
    rows = [
        [
            str(s.pid),
            s.state or "-",
            age(int(s.transaction_age_sec)),
            "yes" if s.holds_horizon else "no",
            _held(s.tables),
            s.application_name or "-",
            s.role_name or "-",
            " ".join((s.query or "-").split())[:QUERY_WIDTH],
        ]
        for s in sessions
    ]
    header = ["PID", "STATE", "TRANSACTION", "HOLDS VACUUM", "TABLES", "APPLICATION", "ROLE", "LAST QUERY"]
    hint = "end one with: SELECT pg_terminate_backend(PID);"
    return table(header, rows, right_aligned=(0, 2)) + "\n" + hint


def _held(tables: Sequence[str]) -> str:
    """The queues' and streams' tables it holds, and how many of the engine's."""
    own = [name for name in tables if OWN_TABLE.match(name)]
    engine = len(tables) - len(own)
    return ", ".join([*own, *([f"+{engine} of the engine"] if engine else [])]) or "-"
