"""The streams benchmark's consume and send steps driven by pgbench (the house method).

A Python consumer or producer costs a core's share per process: on a 2-core machine, four
groups of Python consumers starve the server of the CPU it needs (8 busy processes), and the
rates measure the clients as much as the database. pgbench clients are C, cost a few percent
of a core each, and call the same SQL functions, so the steps below measure the server's work:
- consume: one pgbench client per consumer, the stream's clients calling
  pgbroker.stream_consume (the previous batch's ack carried in pgbench variables, '{}' at the
  start), pgmq's clients pgmq.read of 10 then pgmq.delete of the ids (two statements, two
  commits, as its clients do). Messages consumed are counted from the database after the run
  (the groups' acked cursors; pgmq's rows gone), not from the clients.
- send: --clients pgbench clients (15, as docs/performance.md's queue scenarios), a batch of 10
  a transaction, pgbroker.stream_send_many against pgmq.send_batch.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from bench.harness import connect
from bench.pgbench_article import find_pgbench

_TPS = re.compile(r"tps = ([0-9.]+)")
_PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")


def run_pgbench(dsn: str, script: str, clients: int, seconds: float, *, threads: int = 2) -> int:
    """Run one pgbench script; returns the transactions it completed (raises when any aborted)."""
    with tempfile.TemporaryDirectory(prefix="streams-pgbench-") as tmp:
        path = Path(tmp) / "script.sql"
        path.write_text(script)
        args = [
            find_pgbench(), "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(threads, clients)),
            "-T", str(max(1, round(seconds))), "-D", "p={}", "-D", "e={}", "-D", "i={}", "-f", str(path), dsn,
        ]  # fmt: skip
        done = subprocess.run(args, capture_output=True, text=True, check=False)
    found = _PROCESSED.search(done.stdout)
    if done.returncode != 0 or "aborted" in done.stdout + done.stderr or not found:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return int(found[1])


# The scripts are pgbench files; the names in them are made by the benchmark, never a user's.


def stream_consume_script(stream: str, prefix: str, groups: int, qty: int = 100) -> str:
    """Client n consumes as consumer c<n> of group <prefix><n % groups>, a batch of qty a call."""
    return (
        f"\\set grp :client_id % {groups}\n"  # noqa: S608
        "SELECT coalesce(array_agg(partition), '{}') AS p, coalesce(array_agg(epoch), '{}') AS e,\n"
        "       coalesce(array_agg(id), '{}') AS i\n"
        "FROM (SELECT partition, max(epoch) AS epoch, max(id) AS id\n"
        f"      FROM pgbroker.stream_consume('{stream}', '{prefix}' || :grp::text, 'c' || :client_id::text,"
        f" {qty}, 30,\n"
        "                                   :p::integer[], :e::bigint[], :i::bigint[])\n"
        "      GROUP BY partition) AS last \\gset\n"
    )


def pgmq_consume_script(queue: str, qty: int = 10) -> str:
    return (
        f"SELECT coalesce(array_agg(msg_id), '{{}}') AS i FROM pgmq.read('{queue}', 30, {qty}) \\gset\n"  # noqa: S608
        f"SELECT * FROM pgmq.delete('{queue}', :i::bigint[]);\n"
    )


def send_script(system: str, name: str, payload: str, batch: int = 10) -> str:
    items = ", ".join([f"'{payload}'"] * batch)
    function = "pgbroker.stream_send_many" if system == "stream" else "pgmq.send_batch"
    return f"SELECT count(*) FROM {function}('{name}', ARRAY[{items}]::jsonb[]);\n"  # noqa: S608


def stream_acked(dsn: str, stream: str, group: str) -> int:
    """Messages a group has acknowledged: the log's rows at or below its cursors."""
    with connect(dsn) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM pgbroker.s_{stream} l"  # noqa: S608
            " JOIN pgbroker._stream_positions(%s, %s, ARRAY[l.partition]) c ON l.id <= c.acked_id",
            (stream, group),
        ).fetchone()
    return int(row[0]) if row else 0


def pgmq_length(dsn: str, queue: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM pgmq.q_{queue}").fetchone()  # noqa: S608
    return int(row[0]) if row else 0
