"""`pgbroker pause`/`resume`, `send --priority/--dedup-key/--concurrency-key` and the job-feature
settings of `pgbroker policy set`, run as real subprocesses."""

from __future__ import annotations

import json

from tests.support.cli import Cli, _assert_error, _ids, _messages


def test_pause_and_resume_a_queue(cli: Cli, orders: str) -> None:
    cli.ok("send", orders, '{"n": 1}')
    assert "paused queue" in cli.ok("pause", orders)
    assert "was paused already" in cli.ok("pause", orders)
    # Still a success with nothing on stdout, but an empty read of a paused queue says why (it
    # said nothing: pgbroker metrics counts the message as visible).
    said = f'pgbroker: queue "{orders}" is paused: reads return nothing until: pgbroker resume {orders}\n'
    for command in ("read", "pop"):
        res = cli(command, orders)
        assert (res.returncode, res.stdout, res.stderr) == (0, "", said)
    cli.ok("send", orders, '{"n": 2}')  # sends go on
    shown = json.loads(cli.ok("policy", "show", orders, "--json"))
    assert shown[0]["paused"] is True
    assert "paused" in cli.ok("policy", "show", orders)
    assert "resumed" in cli.ok("resume", orders)
    assert [m["message"]["n"] for m in _messages(cli.ok("read", orders, "--qty", "5"))] == [1, 2]
    _assert_error(cli("pause", "nope"), 4, "does not exist")


def test_send_with_priority_dedup_and_concurrency_keys(cli: Cli, orders: str) -> None:
    cli.ok("send", orders, '{"n": 1}')
    cli.ok("send", orders, '{"n": 2}', "--priority", "5", "--concurrency-key", "tenant-1")
    first = _ids(cli.ok("send", orders, '{"n": 3}', "--dedup-key", "k"))
    assert _ids(cli.ok("send", orders, '{"n": 4}', "--dedup-key", "k")) == first
    read = _messages(cli.ok("read", orders, "--qty", "5"))
    assert [m["message"]["n"] for m in read] == [2, 1, 3]
    assert read[0]["headers"] == {"x-pgbroker-priority": 5, "x-pgbroker-concurrency-key": "tenant-1"}


def test_policy_set_takes_the_job_feature_settings(cli: Cli, orders: str) -> None:
    out = cli.ok(
        "policy", "set", orders, "--max-in-flight", "10", "--max-in-flight-per-key", "2",
        "--rate-limit", "50", "--dedup-window", "1h", "--dedup-mode", "window", "--priorities",
    )  # fmt: skip
    assert "10 in flight, 2/key, 50/s" in out
    shown = json.loads(cli.ok("policy", "show", orders, "--json"))[0]
    assert (shown["max_in_flight"], shown["max_in_flight_per_key"], shown["rate_limit_per_second"]) == (
        10,
        2,
        50.0,
    )
    assert (shown["dedup_window_seconds"], shown["priorities"]) == (3600, True)


def test_a_bad_rate_limit_is_refused_by_its_option_s_name(cli: Cli, orders: str) -> None:
    # It was refused by the engine's field name, which the command line does not show.
    for value in ("-1", "nan"):
        res = cli("policy", "set", orders, "--rate-limit", value)
        assert res.returncode == 2, res.stderr
        assert f"argument --rate-limit: must be a number >= 0 (0: no limit), got {value}" in res.stderr
        assert "rate_limit_per_second" not in res.stderr


def test_policy_show_says_what_a_worker_does_without_max_deliveries(cli: Cli, orders: str) -> None:
    # The policy sets none, yet pgbroker's worker dead-letters at its own default: say so.
    assert "unset (workers: 25)" in cli.ok("policy", "show", orders)
    cli.ok("policy", "set", orders, "--max-deliveries", "3")
    assert "unset" not in cli.ok("policy", "show", orders)
