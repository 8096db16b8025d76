"""``pgbroker stream ...`` end to end, in-process (pgbroker.cli.main.main) on the test's database:
what it prints and its exit codes."""

from __future__ import annotations

import io
import json

import pytest

from pgbroker.cli.main import main
from pgbroker.cli.support.errors import Exit


def run(capsys: pytest.CaptureFixture[str], dsn: str, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--dsn", dsn, "-v"])
    out, err = capsys.readouterr()
    return code, out, err


def test_create_send_read_groups_lag_maintain(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, dsn: str
) -> None:
    assert run(capsys, dsn, "stream", "create", "clicks", "--partitions", "2")[:3:2] == (Exit.OK, "")
    code, out, _ = run(capsys, dsn, "stream", "create-group", "clicks", "billing", "--start", "start")
    assert code == Exit.OK
    assert "clicks_billing_retry" in out
    code, out, _ = run(
        capsys, dsn, "stream", "send", "clicks", '{"n": 1}', "--key", "u1", "--headers", '{"h": 1}'
    )
    assert (code, out.strip()) == (Exit.OK, "1")
    monkeypatch.setattr("sys.stdin", io.StringIO('{"n": 2}\n{"n": 3}\n'))
    code, out, _ = run(capsys, dsn, "stream", "send", "clicks")
    assert out.split() == ["2", "3"]

    code, out, _ = run(capsys, dsn, "stream", "groups", "clicks", "--json")
    assert json.loads(out)[0]["lag"] == 3
    code, out, _ = run(capsys, dsn, "stream", "read", "clicks", "billing", "--qty", "10")
    read = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["message"]["n"] for r in read) == [1, 2, 3]
    assert next(r for r in read if r["message"]["n"] == 1)["headers"] == {"h": 1}
    code, out, _ = run(capsys, dsn, "stream", "lag", "clicks")
    assert "GROUP" in out
    code, out, _ = run(capsys, dsn, "stream", "groups", "clicks", "--json")
    assert json.loads(out)[0]["lag"] == 0  # read acks the batch
    code, out, _ = run(capsys, dsn, "stream", "list")
    assert "clicks" in out
    code, out, _ = run(capsys, dsn, "stream", "maintain")
    assert "clicks: emptied 0 child tables" in out
    code, _, err = run(capsys, dsn, "stream", "drop-group", "clicks", "billing")
    assert code == Exit.USAGE  # its retry queue goes with it
    assert "pgbroker stream drop-group clicks billing --yes" in err
    assert "clicks_billing_retry" in run(capsys, dsn, "list")[1]  # nothing dropped without --yes
    assert run(capsys, dsn, "stream", "drop-group", "clicks", "billing", "--yes")[0] == Exit.OK
    assert "clicks_billing_retry" not in run(capsys, dsn, "list")[1]
    # Again: said as every other missing group is, with where to look (it had no hint).
    code, _, err = run(capsys, dsn, "stream", "drop-group", "clicks", "billing")
    assert code == Exit.NOT_FOUND
    assert err.endswith(
        'pgbroker: error: stream "clicks" has no consumer group "billing"\n'
        "hint: List its groups: pgbroker stream groups clicks\n"
    )
    code, _, err = run(capsys, dsn, "stream", "drop", "clicks")
    assert code == Exit.USAGE
    assert "pgbroker stream drop clicks --yes" in err
    assert "clicks" in run(capsys, dsn, "stream", "list")[1]  # nothing dropped without --yes
    assert run(capsys, dsn, "stream", "drop", "clicks", "--yes")[0] == Exit.OK


def test_a_missing_stream_says_how_to_make_it(capsys: pytest.CaptureFixture[str], dsn: str) -> None:
    code, _, err = run(capsys, dsn, "stream", "send", "nope", "{}")
    assert code == Exit.NOT_FOUND
    assert 'stream "nope" does not exist' in err
    assert "pgbroker stream create nope" in err
    code, _, err = run(capsys, dsn, "stream", "create", "x", "--partitions", "999")
    assert code == Exit.USAGE
    assert "partitions" in err


def test_a_group_whose_retry_queue_is_another_group_s_is_refused(
    capsys: pytest.CaptureFixture[str], dsn: str
) -> None:
    # Group Billing's default retry queue is billing's (queue names fold to lower case): it took
    # that queue, and each group's failures went to the other's handler.
    run(capsys, dsn, "stream", "create", "clicks")
    run(capsys, dsn, "stream", "create-group", "clicks", "billing")
    code, _, err = run(capsys, dsn, "stream", "create-group", "clicks", "Billing")
    assert code == Exit.USAGE
    assert 'queue "clicks_Billing_retry" is already the retry queue of another consumer group' in err
    assert "--retry-queue" in err
    code, out, _ = run(capsys, dsn, "stream", "create-group", "clicks", "Billing", "--retry-queue", "c_2")
    assert (code, "failed messages go to queue c_2" in out) == (Exit.OK, True)


def test_create_group_says_where_the_new_group_reads_from(
    capsys: pytest.CaptureFixture[str], dsn: str
) -> None:
    # A group starts at the end by default: a stream's first reader, made after the first sends,
    # read nothing (exit 0), and create-group had said only the group's retry queue.
    run(capsys, dsn, "stream", "create", "clicks")
    run(capsys, dsn, "stream", "send", "clicks", '{"n": 1}')
    code, out, _ = run(capsys, dsn, "stream", "create-group", "clicks", "billing")
    assert code == Exit.OK
    assert out.endswith(
        "\nit reads the messages sent from now on (--start start: also those the stream keeps)\n"
    )
    assert run(capsys, dsn, "stream", "read", "clicks", "billing")[1] == ""  # as it said
    code, out, _ = run(capsys, dsn, "stream", "create-group", "clicks", "billing", "--start", "start")
    assert out.endswith("\nit was there already: its position is as it was (--start sets a new group's)\n")
    code, out, _ = run(capsys, dsn, "stream", "create-group", "clicks", "audit", "--start", "start")
    assert out.endswith("\nit reads every message the stream keeps, then those sent from now on\n")
    assert json.loads(run(capsys, dsn, "stream", "read", "clicks", "audit")[1])["message"] == {"n": 1}


def test_a_read_that_acks_says_so_and_a_read_with_no_ack_takes_nothing(
    capsys: pytest.CaptureFixture[str], dsn: str
) -> None:
    # stream read acks its batch for the whole group: run to look, under a working group's name,
    # it took the messages from that group's workers, and said nothing of it.
    run(capsys, dsn, "stream", "create", "clicks")
    run(capsys, dsn, "stream", "create-group", "clicks", "billing", "--start", "start")
    run(capsys, dsn, "stream", "send", "clicks", '{"n": 1}')
    code, out, err = run(capsys, dsn, "stream", "read", "clicks", "billing", "--no-ack")
    assert (code, len(out.splitlines())) == (Exit.OK, 1)
    assert "acked" not in err
    code, out, err = run(capsys, dsn, "stream", "read", "clicks", "billing")
    assert (code, len(out.splitlines())) == (Exit.OK, 1)  # the same message: the peek took nothing
    assert (
        "pgbroker: acked 1 message for group billing: its other consumers will not get them "
        "(--no-ack reads without taking them)\n"
    ) in err
    code, out, err = run(capsys, dsn, "stream", "read", "clicks", "billing")
    assert (code, out) == (Exit.OK, "")
    assert "acked" not in err
