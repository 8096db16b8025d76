"""The pipeline jobs: ``pgbroker pipeline drain | route | archive-report``.

Each job is also a module that spark-submit (or ``python -m``) runs on its own; this package's
main() gathers them under one command for the pgbroker CLI.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pgbroker.spark.jobs import archive_report, common, drain, route

PROG = "pgbroker pipeline"
JOBS = {
    "drain": drain,
    "route": route,
    "archive-report": archive_report,
}


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Data pipeline jobs on Apache Spark (local[*] by default; --master for a cluster).",
    )
    jobs = parser.add_subparsers(dest="job", metavar="JOB", required=True)
    for name, module in JOBS.items():
        sub = jobs.add_parser(name, help=module.DESCRIPTION, description=module.DESCRIPTION)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run, prog=f"{prog} {name}")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    return common.run_main(args.run, args, args.prog)
