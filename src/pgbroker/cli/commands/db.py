"""``pgbroker db start|stop|status|url``: the embedded PostgreSQL cluster (pgbroker.embedded)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.output import print_result
from pgbroker.cli.support.parsers import Subcommands, add_command
from pgbroker.embedded import EmbeddedPostgres

__all__ = ["register"]


def register(subcommands: Subcommands) -> None:
    summary = "the embedded PostgreSQL cluster"
    sub = add_command(subcommands, "db", summary, _db, database=False)
    sub.add_argument(
        "action",
        choices=["start", "stop", "status", "url"],
        help="start it, stop it, show its status, or print its DSN (for DATABASE_URL)",
    )
    sub.add_argument("--data-dir", type=Path, metavar="DIR", help="the cluster's data directory")


def _db(args: argparse.Namespace) -> int:
    cluster = EmbeddedPostgres(args.data_dir)
    if args.action == "start":
        was_running = cluster.status().running
        dsn = cluster.start()
        status = cluster.status()
        verb = "already running" if was_running else "started"
        text = f"embedded PostgreSQL {status.server_version} {verb} in {status.data_dir} (pid {status.pid})"
        return print_result(args, {**asdict(status), "started": not was_running}, f"{text}\ndsn: {dsn}")
    if args.action == "stop":
        # Stopping a stopped cluster is nothing to do (0), as starting a running one.
        stopped = cluster.stop()
        text = (
            f"stopped embedded PostgreSQL in {cluster.data_dir}"
            if stopped
            else f"embedded PostgreSQL in {cluster.data_dir} is not running: nothing to stop"
        )
        return print_result(args, {"data_dir": cluster.data_dir, "stopped": stopped}, text)
    if args.action == "url":
        status = cluster.status()
        if status.dsn is None:
            raise CliError(
                f"embedded PostgreSQL in {cluster.data_dir} is not running",
                code=Exit.NOTHING_DONE,
                hint="Start it first: pgbroker db start",
            )
        return print_result(args, {"dsn": status.dsn}, status.dsn)
    status = cluster.status()
    fields = {
        "running": "yes" if status.running else "no",
        "data dir": str(status.data_dir),
        "pid": status.pid,
        "dsn": status.dsn,
        "server version": status.server_version,
        "binaries": status.bin_dir,
    }
    text = "\n".join(f"{k + ':':<16}{'-' if v is None else v}" for k, v in fields.items())
    print_result(args, asdict(status), text)
    # Like `pg_ctl status`, the exit code answers "is it running?" for scripts.
    return Exit.OK if status.running else Exit.NOTHING_DONE
