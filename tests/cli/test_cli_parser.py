"""The ``pgbroker`` parser's shape, read from the parser itself: every command names its queue the
same way, and says where an App's settings win over the defaults it shows."""

from __future__ import annotations

import argparse
import math

import pytest

from pgbroker.cli.commands.worker import _workers
from pgbroker.cli.main import build_parser
from pgbroker.cli.support.arguments import (
    connect_seconds,
    positive_seconds,
    positive_whole_seconds,
    seconds,
    whole_seconds,
)
from pgbroker.runtime._worker import DEFAULT_MAX_DELIVERIES, Worker
from pgbroker.spark.jobs import build_parser as pipeline_parser
from tests.support.cli import run


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command and group action, by its full name (``dlq replay``)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[f"{prefix}{name}"] = sub
                found.update(_commands(sub, f"{prefix}{name} "))
    return found


def _takes_a_queue_name(action: argparse.Action) -> bool:
    if action.nargs == 0 or action.metavar == "GLOB":  # a flag, or a pattern of names
        return False
    if action.dest == "name":  # also a stream's, a schedule's or a key's
        return "queue" in (action.help or "")
    return action.dest in ("queue", "queues") or action.dest.endswith("_queue")


def test_every_command_calls_its_queue_QUEUE() -> None:
    shown = {
        f"{command} {action.dest}": action.metavar or action.dest.upper()
        for command, parser in _commands(build_parser()).items()
        for action in parser._actions
        if _takes_a_queue_name(action)
    }
    assert len(shown) > 20
    assert {where: name for where, name in shown.items() if name != "QUEUE"} == {}


def test_every_positional_argument_is_shown_in_capitals() -> None:
    # As QUEUE, STREAM and MSG_ID are: the usage lines read 'send QUEUE [message]',
    # 'stream read STREAM group', 'keys create name', 'grant {...} role', 'pipeline drain queue'.
    commands = {**_commands(build_parser()), **_commands(pipeline_parser(), "pipeline ")}
    shown = {
        f"{command} {action.dest}": action.metavar or action.dest
        for command, parser in commands.items()
        for action in parser._actions
        if not action.option_strings
        and not action.choices
        and action.nargs != argparse.REMAINDER
        and not isinstance(action, argparse._SubParsersAction)
    }
    assert len(shown) > 40
    assert {where: name for where, name in shown.items() if not str(name).isupper()} == {}


def test_worker_help_says_an_app_s_settings_win() -> None:
    help_text = _commands(build_parser())["worker"].format_help()
    assert "(the handler's, else 1)" in help_text
    assert "An option left out keeps what the App's @app.handler(...) set" in help_text


def test_worker_max_deliveries_reaches_the_workers_and_zero_means_none() -> None:
    parser = build_parser()

    def limit(*options: str) -> int | None:
        [worker] = _workers(parser.parse_args(["worker", "builtins:print", "--queue", "jobs", *options]))
        assert isinstance(worker, Worker)
        return worker.max_deliveries

    assert limit() == DEFAULT_MAX_DELIVERIES
    assert limit("--max-deliveries", "3") == 3
    assert limit("--max-deliveries", "0") is None


DURATION_TYPES = {seconds, positive_seconds, whole_seconds, positive_whole_seconds, connect_seconds}


def test_every_length_of_time_is_one_duration_taking_fractions_and_units() -> None:
    """A delay, lease, wait or timeout took whole seconds (send --delay, read --vt), a number of
    seconds (--wait, --connect-timeout) or a whole number with a unit (policy --dedup-window 5m),
    by option, each parsed its own way. Now every one is a DURATION, parsed by one parser: 1.5,
    500ms and 5m mean the same everywhere."""
    commands = {
        "pgbroker": build_parser(),
        **_commands(build_parser()),
        **_commands(pipeline_parser(), "pipeline "),
    }
    timed = {
        f"{command} {action.option_strings[-1]}": action
        for command, parser in commands.items()
        for action in parser._actions
        if action.type in DURATION_TYPES or action.metavar in ("SECONDS", "DURATION", "S")
    }
    assert len(timed) > 40
    assert {where: action.metavar for where, action in timed.items() if action.metavar != "DURATION"} == {}
    assert {where for where, action in timed.items() if action.type not in DURATION_TYPES} == set()
    for where, action in timed.items():
        parse = action.type
        assert callable(parse)
        if parse in (whole_seconds, positive_whole_seconds, connect_seconds):
            # What was rounded up is said by the option named after the dest (cli.support.running).
            assert "--" + action.dest.replace("_", "-") in action.option_strings, where
        if parse is connect_seconds:  # libpq's: whole seconds, at least 2
            assert [parse(text) for text in ("2.5", "2500ms", "5m")] == [3, 3, 300], where
            continue
        assert [parse(text) for text in ("1.5", "500ms", "5m")] in ([1.5, 0.5, 300], [2, 1, 300]), where


def test_a_timeout_or_an_interval_of_zero_is_refused_by_its_option_s_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """These took 0, which no timeout or interval can mean: the worker then refused it by its
    parameter's name ('maintain_every must be > 0 seconds'), which the command line does not
    show, and the bridge and --progress took it as given."""
    parser = build_parser()
    for command in (
        ["worker", "builtins:print", "--queue", "jobs", "--maintain-every", "0"],
        ["worker", "builtins:print", "--queue", "jobs", "--poll-max", "0"],
        ["worker", "builtins:print", "--queue", "jobs", "--progress", "0"],
        ["bridge", "out", "--queue", "q", "--to", "redis://127.0.0.1:1", "--confirm-timeout", "0"],
        ["bridge", "in", "--from", "redis://127.0.0.1:1", "--queue", "q", "--ack-wait", "0"],
    ):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(command)
        assert exited.value.code == 2, command
        assert f"argument {command[-2]}: must be a duration > 0, got 0" in capsys.readouterr().err


def test_a_key_s_rate_is_a_finite_number_above_zero_refused_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """keys create --rate was a plain float: the command refused 0, -1 and nan only once it ran,
    with the database opened, and took inf (a limit that limits nothing)."""
    parser = build_parser()
    for rate in ("0", "-1", "nan", "inf", "fast"):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["keys", "create", "ci", "--scope", "read", "--rate", rate])
        assert exited.value.code == 2, rate
        assert "argument --rate: " in capsys.readouterr().err
    assert parser.parse_args(["keys", "create", "ci", "--scope", "read", "--rate", "2.5"]).rate == 2.5


def test_the_pipeline_trigger_is_a_duration_above_zero_refused_by_its_name() -> None:
    """pipeline drain|route --trigger-seconds was a plain float: -1 and nan were taken, and went on
    to Spark as a trigger of '-1.0 seconds' or 'nan seconds'. It is a DURATION now, parsed by the
    CLI's one parser (pgbroker._durations, below both the CLI and Spark), run here as a user would."""
    for value, said in (
        ("-1", "argument --trigger-seconds: must be a duration >= 0, got -1"),
        ("nan", "argument --trigger-seconds: expected a duration: seconds (30, 1.5) or a number with a unit"),
        ("0", "argument --trigger-seconds: must be a duration > 0, got 0"),
    ):
        res = run("pipeline", "drain", "jobs", "--output", "out", "--follow", "--trigger-seconds", value)
        assert (res.returncode, res.stdout) == (2, ""), res.stderr
        assert said in res.stderr
    parse = pipeline_parser().parse_args
    assert parse(["drain", "jobs", "--output", "out", "--trigger-seconds", "500ms"]).trigger_seconds == 0.5


def test_a_duration_s_unit_is_taken_in_any_case() -> None:
    """2H, 30S and 500MS were refused ('expected a duration'): the units are ms, s, m, h and d
    only, so upper case means nothing else (no month to tell M from m)."""
    for text, value in (
        ("2H", 7200),
        ("30S", 30),
        ("500MS", 0.5),
        ("5M", 300),
        ("7D", 604800),
        ("1Ms", 0.001),
    ):
        assert seconds(text) == value, text
        assert positive_seconds(text) == value, text
        assert whole_seconds(text) == math.ceil(value), text
    assert build_parser().parse_args(["read", "jobs", "--vt", "2H", "--wait", "500MS"]).vt == 7200


def test_the_connect_timeout_is_whole_seconds_of_at_least_2() -> None:
    """--connect-timeout took any duration > 0 and said nothing of libpq's rule: 1, 1.5 or 500ms
    became a wait of 2 s, 2.5 one of 3 s. Below 2 is now a usage error, before connecting; a
    fraction is rounded up as its help says."""
    for value in ("1", "1.5", "500ms", "0"):
        res = run("--connect-timeout", value, "list")
        assert (res.returncode, res.stdout) == (2, ""), res.stderr
        assert (
            f"argument --connect-timeout: must be at least 2 seconds (libpq's minimum), got {value}"
            in res.stderr
        )
    parser = build_parser()
    taken = [parser.parse_args(["--connect-timeout", v, "list"]).connect_timeout for v in ("2", "2.5", "1m")]
    assert taken == [2, 3, 60]
    assert "in whole seconds of at least 2 as libpq takes it: a fraction is rounded up" in " ".join(
        run("list", "--help").stdout.split()
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["send", "orders", "--delay", "5", '{"n": 1}'],
        ["send", "orders", "--headers", '{"a": 1}', '{"n": 1}', "--priority", "2"],
        ["stream", "send", "clicks", "--key", "user-1", '{"n": 1}'],
    ],
    ids=["send --delay", "send --headers", "stream send --key"],
)
def test_a_command_s_options_may_come_between_its_arguments(argv: list[str]) -> None:
    # `pgbroker send orders --delay 5 '{"n": 1}'` was refused, exit 2, with 'unrecognized
    # arguments: {"n": 1}': argparse gave MESSAGE (optional) nothing once an option followed QUEUE.
    parsed = build_parser().parse_args(argv)
    assert parsed.message == '{"n": 1}'


def test_an_argument_too_many_is_still_refused_by_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["send", "orders", "--delay", "5", "1", "2"])
    assert stopped.value.code == 2
    assert "pgbroker send: error: unrecognized arguments: 2" in capsys.readouterr().err
