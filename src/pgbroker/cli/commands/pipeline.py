"""``pgbroker pipeline JOB ...``: the data pipeline jobs on Spark (pgbroker.spark.jobs).

The jobs parse their own arguments, -h included; they need the ``spark`` extra, which the rest
of the CLI does without, so they are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

from pgbroker._db.dsn import POOLER_ENV
from pgbroker.cli.support.errors import Exit
from pgbroker.cli.support.parsers import Subcommands
from pgbroker.cli.support.running import missing_extra

__all__ = ["register"]


def register(subcommands: Subcommands) -> None:
    summary = "data pipeline jobs on Spark: drain, route, archive-report (see pgbroker pipeline -h)"
    sub = subcommands.add_parser("pipeline", help=summary, description=summary, add_help=False)
    sub.add_argument("-h", "--help", action="store_true", dest="pipeline_help", help="show the jobs' help")
    sub.add_argument("job_args", nargs=argparse.REMAINDER, metavar="JOB ...", help="a job and its arguments")
    # The jobs connect on their own: they get --dsn, not a Broker.
    sub.set_defaults(handler=_pipeline, needs_database=False)


def _pipeline(args: argparse.Namespace) -> int:
    # Without pyspark the jobs cannot even start: ask for the extra here. A package that is there
    # but broken is the jobs' own to diagnose (pgbroker.spark.requirements).
    for package in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(package) is None:
            raise missing_extra("spark", package)
    from pgbroker.spark.jobs import main as pipeline_main

    job_args = list(args.job_args)
    if args.pipeline_help or not job_args:
        job_args.insert(0, "--help")
    elif args.dsn and "--dsn" not in job_args:
        job_args += ["--dsn", args.dsn]
    if args.verbose and job_args[0] != "--help":
        job_args.append("-v")
    if args.pooler is not None:
        # Spark's executors are processes of their own: the variable is what reaches them.
        os.environ[POOLER_ENV] = args.pooler
    try:
        return pipeline_main(job_args, prog="pgbroker pipeline")
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else Exit.USAGE
