"""The pipeline jobs (drain, route, archive-report) run in-process on the tests' SparkSession
(--no-ship: its executors have pgbroker), their output, and their errors and exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pgbroker.spark import jobs
from tests.spark.helpers import Conn, count, create, fill


def run(*argv: str) -> int:
    return jobs.main(list(argv))


def test_drain_writes_parquet_by_date_exactly_once(
    spark: Any, dsn: str, conn: Conn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    create(conn, "orders")
    fill(conn, "orders", 3_000)
    out = tmp_path / "lake"
    args = (
        "drain",
        "orders",
        "--output",
        str(out),
        "--dsn",
        dsn,
        "--max-rows-per-batch",
        "1000",
        "--no-ship",
    )

    assert run(*args) == 0
    fill(conn, "orders", 500, start=3_000)
    assert run(*args) == 0

    printed = capsys.readouterr().out
    assert "drain: batch 0: 1,000 messages" in printed
    assert "drain: done: 3,000 messages" in printed
    assert "drain: done: 500 messages" in printed
    lake = spark.read.parquet(str(out))
    assert lake.columns == ["msg_id", "read_ct", "enqueued_at", "message", "headers", "date"]
    rows = lake.select("message", "date").collect()
    assert sorted(json.loads(r.message)["n"] for r in rows) == list(range(3_500))
    assert {p.name for p in out.iterdir() if p.name.startswith("date=")} == {f"date={r.date}" for r in rows}
    assert count(conn, "q_orders") == 0
    assert count(conn, "a_orders") == 3_500


def test_route_with_a_sql_expression_and_a_condition(
    spark: Any, dsn: str, conn: Conn, tmp_path: Path
) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", 100)
    code = run(
        "route", "src", "dst", "--dsn", dsn, "--no-ship", "--checkpoint", str(tmp_path / "ck"),
        "--where", "get_json_object(message, '$.n') % 2 = 0",
        "--sql", "named_struct('half', cast(get_json_object(message, '$.n') AS INT) DIV 2)",
    )  # fmt: skip
    assert code == 0
    got = conn.execute("SELECT message FROM pgmq.q_dst ORDER BY msg_id").fetchall()
    assert sorted(m["half"] for (m,) in got) == list(range(50))
    assert count(conn, "q_src") == 0


def test_route_with_a_python_function(spark: Any, dsn: str, conn: Conn, tmp_path: Path) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", 30)
    code = run(
        "route", "src", "dst", "--dsn", dsn, "--no-ship", "--checkpoint", str(tmp_path / "ck"),
        "--function", "tests.spark.route_functions:triple_or_drop", "--mode", "claim",
    )  # fmt: skip
    assert code == 0
    got = [m for (m,) in conn.execute("SELECT message FROM pgmq.q_dst").fetchall()]
    assert sorted(m["n"] for m in got) == [n * 3 for n in range(30) if n % 3]
    assert all(m["routed"] for m in got)
    assert count(conn, "a_src") == 30


def test_a_failing_function_fails_the_job_and_sends_nothing(
    spark: Any, dsn: str, conn: Conn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", 10)
    code = run(
        "route", "src", "dst", "--dsn", dsn, "--no-ship", "--checkpoint", str(tmp_path / "ck"),
        "--function", "tests.spark.route_functions:refuse_seven", "--partitions", "1",
    )  # fmt: skip
    assert code == 1
    errors = capsys.readouterr().err
    assert "pgbroker pipeline route: error: Spark: " in errors
    assert "ValueError: seven is not routable" in errors
    assert count(conn, "q_dst") == 0
    assert count(conn, "q_src") == 10


def test_archive_report(
    spark: Any, dsn: str, conn: Conn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    create(conn, "orders")
    fill(conn, "orders", 300)
    # Deliveries: 100 archived unread, 150 read once, 50 read twice.
    conn.execute("SELECT pgmq.archive('orders', ARRAY(SELECT generate_series(1, 100)::bigint))")
    conn.execute("SELECT * FROM pgmq.read('orders', 0, 200)")
    conn.execute("SELECT * FROM pgmq.read('orders', 0, 50)")
    conn.execute("SELECT pgmq.archive('orders', ARRAY(SELECT generate_series(101, 300)::bigint))")
    out = tmp_path / "report"

    assert run("archive-report", "orders", "--output", str(out), "--dsn", dsn, "--no-ship") == 0

    printed = capsys.readouterr().out
    assert "archive-report: orders: 300 archived messages" in printed
    assert "latency (enqueued -> archived): p50" in printed
    assert "deliveries (read_ct): 0: 100, 1: 150, 2: 50" in printed
    for name in ("throughput", "latency", "summary", "read_ct"):
        assert list((out / name).glob("*.parquet")), name
    for png in ("throughput.png", "latency.png", "read_ct.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    read_ct = {r.read_ct: r.messages for r in spark.read.parquet(str(out / "read_ct")).collect()}
    assert read_ct == {0: 100, 1: 150, 2: 50}
    throughput = spark.read.parquet(str(out / "throughput")).collect()
    assert sum(r.archived for r in throughput) == sum(r.enqueued for r in throughput) == 300
    summary = spark.read.parquet(str(out / "summary")).first()
    assert summary is not None
    assert summary.messages == 300
    assert 0 <= summary.p50_ms <= summary.p99_ms <= summary.max_ms


def test_archive_report_of_an_empty_archive(
    dsn: str, conn: Conn, tmp_path: Path, capsys: pytest.CaptureFixture[str], spark: Any
) -> None:
    create(conn, "quiet")
    assert run("archive-report", "quiet", "--output", str(tmp_path), "--dsn", dsn, "--no-ship") == 0
    assert "is empty: nothing to report" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (("drain", "missing", "--output", "/tmp/x"), 4, 'queue "missing" does not exist'),
        (("route", "src", "missing", "--checkpoint", "/tmp/x"), 4, 'queue "missing" does not exist'),
        (("route", "src", "SRC", "--checkpoint", "/tmp/x"), 2, "are the same queue"),
        (
            ("route", "src", "dst", "--checkpoint", "/tmp/x", "--function", "nosuchmodule:f"),
            2,
            "cannot import",
        ),
        (
            (
                "route",
                "src",
                "dst",
                "--checkpoint",
                "/tmp/x",
                "--function",
                "tests.spark.route_functions:NOT_CALLABLE",
            ),
            2,
            "has no function 'NOT_CALLABLE'",
        ),
        (
            ("route", "src", "dst", "--checkpoint", "/tmp/x", "--function", "nocolon"),
            2,
            "must be module:function",
        ),
        (("route", "src", "dst", "--checkpoint", "/tmp/x", "--sql", "no_such_column + 1"), 2, "--sql"),
    ],
)
def test_errors(
    spark: Any,
    dsn: str,
    conn: Conn,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    code: int,
    message: str,
) -> None:
    create(conn, "src", "dst")
    assert run(*argv, "--dsn", dsn, "--no-ship") == code
    errors = [line for line in capsys.readouterr().err.splitlines() if "error: " in line]
    assert errors
    assert errors[0].startswith(f"pgbroker pipeline {argv[0]}: error: ")
    assert message in errors[0]


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run("drain", "q")  # --output missing
    assert exit_info.value.code == 2
    assert "--output" in capsys.readouterr().err
