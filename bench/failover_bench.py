"""Messages lost and delivered twice across a crash of the primary, per replication mode, and the
time each kind of pgbroker process takes to work again after the promotion.

    python -m bench.failover_bench [--lag 3] [--modes synchronous,asynchronous,asynchronous-no-lag]

Each mode runs the failover test's traffic (tests/support/failover.py: the client, a CLI worker,
serve, bridge out to RabbitMQ, a waiting read, all on one multi-host DSN) on a new primary and
streaming standby (tests/support/replication.py), then SIGKILLs the primary and promotes the
standby:

- ``synchronous``: synchronous_standby_names names the standby, synchronous_commit remote_apply;
  the standby's WAL receiver is stopped (SIGSTOP, a network stall) ``--lag`` seconds before the
  crash and let go after it;
- ``asynchronous``: no synchronous standby, the same stall: the primary goes on committing
  what the standby never gets;
- ``asynchronous-no-lag``: no synchronous standby and no stall (the standby as close behind as
  it gets on a quiet machine).

It needs RabbitMQ ($PGBROKER_TEST_AMQP, else the local default), as the test does.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tests.support.failover import Outcome, Traffic
from tests.support.rabbit import amqp_url
from tests.support.replication import (
    crash,
    multi_host_dsn,
    promote,
    replicated_pair,
    resume_wal_receiver,
    set_synchronous,
    stall_wal_receiver,
)

MODES = ("synchronous", "asynchronous", "asynchronous-no-lag")


def run(mode: str, lag: float) -> Outcome:
    with replicated_pair() as (primary, standby), tempfile.TemporaryDirectory() as directory:
        if mode == "synchronous":
            set_synchronous(primary, standby.data_dir.name)

        def fail_over() -> float:
            stalled = stall_wal_receiver(standby) if mode != "asynchronous-no-lag" else None
            time.sleep(lag if stalled else 0)
            crash(primary)
            if stalled:
                resume_wal_receiver(stalled)
            return promote(standby)

        with Traffic(multi_host_dsn(primary, standby), Path(directory), amqp_url()) as traffic:
            return traffic.across(fail_over)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--lag", type=float, default=3.0, help="seconds the WAL receiver stalls (3)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"among {', '.join(MODES)}")
    args = parser.parse_args()
    for mode in args.modes.split(","):
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}: choose among {', '.join(MODES)}")
        print(run(mode, args.lag).report(mode), flush=True)


if __name__ == "__main__":
    main()
