"""The pipeline on a real Spark cluster, not local mode: a standalone master and two one-core
workers on this machine (tests/spark/standalone.py), the jobs run against it as docs/spark.md's
"Running on a cluster" says, through the pgbroker CLI and through spark-submit.

The executors' Python does not have pgbroker (only its dependencies) and their working directory
is the worker's, outside the source tree: every task that reads, writes or routes must import
pgbroker from the zip the driver shipped. The routed messages record where they were routed, so
the test sees that both workers' executors ran tasks, with pgbroker from the zip. One executor is
killed in the middle of the route: its tasks run again, and every message still arrives once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from tests.spark.helpers import Conn, count, create, fill, numbers, require_spark, wait_for
from tests.spark.standalone import Driver, StandaloneCluster, run_driver

ROOT = Path(__file__).resolve().parents[2]
TOTAL = 20_000
BATCH = 4_000  # 2 partitions of 2,000: the sink sends 1,000 a call, in one transaction
DRIVER_TIMEOUT = 300

# The module's cluster takes a while to start, whichever test needs it.
pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(scope="module")
def cluster() -> Iterator[StandaloneCluster]:
    require_spark()
    root = Path(tempfile.mkdtemp(prefix="pgbroker-spark-cluster-"))
    standalone = StandaloneCluster(root)
    try:
        standalone.start()
        yield standalone
    finally:
        standalone.stop()
        survivors = standalone.survivors()
        shutil.rmtree(root, ignore_errors=True)
        assert not survivors, f"processes left running after the cluster stopped: {survivors}"


def test_python_of_the_executors_cannot_import_pgbroker(cluster: StandaloneCluster) -> None:
    """What the other tests rely on: without the shipped zip, an executor has no pgbroker."""
    probe = (
        "import psycopg, pyarrow, numpy, pyspark\ntry:\n import pgbroker\nexcept ImportError:\n print('ok')"
    )
    result = subprocess.run(
        [str(cluster.executor_python), "-c", probe],
        cwd=cluster.root, capture_output=True, text=True, check=False,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr


@pytest.mark.timeout(DRIVER_TIMEOUT + 120)
def test_route_on_the_cluster_through_the_cli_with_an_executor_killed(
    cluster: StandaloneCluster, dsn: str, conn: Conn
) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", TOTAL)
    pgbroker_cli = Path(sys.executable).parent / "pgbroker"
    route = Driver(
        [str(pgbroker_cli), "pipeline", "route", "src", "dst", "--dsn", dsn,
         "--checkpoint", str(cluster.root / "route-checkpoint"), "--master", cluster.url,
         "--function", "tests.spark.cluster_functions:where_it_ran",
         "--max-rows-per-batch", str(BATCH), "--partitions", "2", *cluster.driver_conf()],
        # The driver imports the route function from the source tree; the executors get it, and
        # pgbroker, from the zips the driver ships.
        env={**cluster.driver_env(), "PYTHONPATH": str(ROOT)},
        cwd=cluster.root,
        log=cluster.root / "route.log",
    )  # fmt: skip
    try:
        # One executor dies (its machine, say) in the middle of a task, which sent part of its
        # partition: the task runs again elsewhere, the worker starts another executor.
        marker = cluster.root / "stalled"
        wait_for(
            lambda: marker.exists() or route.process.poll() is not None, DRIVER_TIMEOUT, "the stalled task"
        )
        assert route.process.poll() is None, route.log.read_text()
        wait_for(lambda: marker.read_text() != "", 10, "the stalled executor's directory")
        killed = Path(marker.read_text())
        cluster.kill_executor(killed)
        at_kill = count(conn, "q_dst")
        code, output = route.finish(DRIVER_TIMEOUT)
    finally:
        route.kill()
    assert code == 0, f"{output[-8000:]}\n{cluster.logs()}"
    assert f"route: done: {TOTAL:,} messages" in output
    assert at_kill < TOTAL
    assert "Lost task" in output  # the stalled one, with its executor
    print(f"executor {killed} killed with {at_kill:,} of {TOTAL:,} messages routed")

    # Exactly once: every message once in the target, none left in the source, all archived.
    assert numbers(conn, "q_dst") == list(range(TOTAL))
    assert count(conn, "q_src") == 0
    assert numbers(conn, "a_src") == list(range(TOTAL))

    routed = [m for (m,) in conn.execute("SELECT message FROM pgmq.q_dst").fetchall()]
    executors = {Path(m["cwd"]) for m in routed}
    # Routed by executors of both workers, in their own directories (worker/app/executor).
    assert executors <= set(cluster.executor_dirs()), executors
    assert {e.parent.parent for e in executors} == {cluster.worker_dir(1), cluster.worker_dir(2)}
    # With pgbroker imported from the shipped zip, not from the source tree.
    for message in routed[:: TOTAL // 100]:
        assert PurePosixPath(message["pgbroker"]).parts[-3:] == (_zip_name(), "pgbroker", "__init__.py")
        assert not {str(ROOT), str(ROOT / "src")} & set(message["sys_path"])


@pytest.mark.timeout(DRIVER_TIMEOUT + 120)
def test_drain_on_the_cluster_through_spark_submit(
    cluster: StandaloneCluster, dsn: str, conn: Conn, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    from pgbroker.spark import shipping
    from pgbroker.spark.jobs import drain

    create(conn, "orders")
    fill(conn, "orders", TOTAL)
    # The commands of docs/spark.md: the zip built, then given to spark-submit with the job.
    shipped = shipping.build_zip(tmp_path)
    lake = tmp_path / "lake"
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = {**cluster.driver_env(), "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = run_driver(
        [str(spark_submit), "--master", cluster.url, "--py-files", str(shipped), *cluster.driver_conf(),
         str(drain.__file__), "orders", "--output", str(lake), "--dsn", dsn,
         "--max-rows-per-batch", str(TOTAL // 2), "--partitions", "2"],
        env=env,
        cwd=cluster.root,
        timeout=DRIVER_TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout[-8000:]}\n{cluster.logs()}"
    assert f"drain: done: {TOTAL:,} messages" in result.stdout

    messages = pq.read_table(lake, columns=["message"]).column("message").to_pylist()
    assert sorted(json.loads(m)["n"] for m in messages) == list(range(TOTAL))
    assert count(conn, "q_orders") == 0
    assert count(conn, "a_orders") == TOTAL
    # The reading tasks ran on the executors, which fetched the zip spark-submit was given.
    app = _latest_app(cluster)
    assert {p.parent.parent for p in app} == {cluster.worker_dir(1), cluster.worker_dir(2)}
    assert all((executor / _zip_name()).is_file() for executor in app)


def _zip_name() -> str:
    from pgbroker.spark import shipping

    return shipping.zip_name()


def _latest_app(cluster: StandaloneCluster) -> list[Path]:
    """The executor directories of the last application that ran on the cluster."""
    latest = max(p.parent.name for p in cluster.executor_dirs())
    return [p for p in cluster.executor_dirs() if p.parent.name == latest]
