"""`pgbroker bridge out|in` as a user runs them: processes, signals, exit codes and error messages."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

from psycopg.conninfo import conninfo_to_dict

from pgbroker import Broker
from tests.support.bridge_processes import pgbroker
from tests.support.paths import ROOT
from tests.support.rabbit import Rabbit


def test_bridge_out_publishes_until_sigterm_then_exits_0(broker: Broker, dsn: str, amqp: str) -> None:
    outbox = broker.create_queue("outbox")

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit:
            target = await rabbit.queue()
            outbox.send_many([{"n": i} for i in range(100)])
            bridge = pgbroker(
                "bridge", "out", "--queue", "outbox", "--amqp", amqp, "--routing-key", target, dsn=dsn
            )
            try:
                got = await rabbit.drain(target, expect=100, timeout=30)
            finally:
                bridge.send_signal(signal.SIGTERM)
                _, err = bridge.communicate(timeout=30)
            assert bridge.returncode == 0, err
            # Quiet by default, but for one line once it has started (a bridge said nothing at all).
            place = f"{conninfo_to_dict(dsn)['dbname']} at "
            assert err.startswith(f"pgbroker: bridge started: publishing queue outbox ({place}"), err
            assert err.endswith(" exchange '' (stop: Ctrl-C or SIGTERM)\n"), err
            assert err.count("\n") == 1, err
            assert sorted(json.loads(m.body)["n"] for m in got) == list(range(100))

    asyncio.run(scenario())
    assert broker.metrics("outbox").queue_length == 0


def test_bridge_in_receives_until_sigterm_then_exits_0(broker: Broker, dsn: str, amqp: str) -> None:
    broker.create_queue("inbox")

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit:
            source = await rabbit.queue()
            for i in range(50):
                await rabbit.publish(source, b'{"n": %d}' % i, message_id=str(i))
            bridge = pgbroker("bridge", "in", "--amqp", amqp, "--from", source, "--queue", "inbox", dsn=dsn)
            try:
                deadline = time.monotonic() + 30
                while broker.metrics("inbox").queue_length < 50 and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
            finally:
                bridge.send_signal(signal.SIGTERM)
                _, err = bridge.communicate(timeout=30)
            assert bridge.returncode == 0, err
            assert err.startswith("pgbroker: bridge started: receiving from "), err
            assert f" queue '{source}' into queue inbox (" in err
            assert err.count("\n") == 1, err
            assert await rabbit.count(source) == 0

    asyncio.run(scenario())
    assert broker.metrics("inbox").queue_length == 50


def test_rabbitmq_errors_exit_6_with_a_hint_and_usage_errors_exit_2(
    broker: Broker, dsn: str, amqp: str
) -> None:
    broker.create_queue("outbox")
    bad = amqp.replace("guest:guest@", "guest:wrong@")
    refused = pgbroker("bridge", "out", "--queue", "outbox", "--amqp", bad, dsn=dsn)
    _, err = refused.communicate(timeout=30)
    assert refused.returncode == 6
    assert "pgbroker: error: RabbitMQ at " in err
    assert "refused the login of user 'guest'" in err
    assert "wrong" not in err
    assert "hint: Check the user and password" in err

    missing = pgbroker(
        "bridge", "in", "--amqp", amqp, "--from", "pgbroker-test-none", "--queue", "outbox", dsn=dsn
    )
    _, err = missing.communicate(timeout=30)
    assert missing.returncode == 6
    assert "RabbitMQ has no queue 'pgbroker-test-none'" in err
    assert "--declare" in err

    no_url = subprocess.run(
        [sys.executable, "-m", "pgbroker.cli", "bridge", "out", "--queue", "outbox", "--dsn", dsn],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    assert no_url.returncode == 2
    assert "no RabbitMQ given" in no_url.stderr

    unknown_queue = pgbroker("bridge", "out", "--queue", "nope", "--amqp", amqp, dsn=dsn)
    _, err = unknown_queue.communicate(timeout=30)
    assert unknown_queue.returncode == 4, err


def test_a_broker_password_the_url_parser_misreads_is_never_said(broker: Broker, dsn: str) -> None:
    """A password with an unencoded / ends the URL's host there: urllib read the port as 'Xy7Q'
    and the error quoted it."""
    broker.create_queue("outbox")
    for scheme in ("redis", "nats", "mqtt", "amqp"):
        done = pgbroker(
            "bridge", "out", "--queue", "outbox", "--to", f"{scheme}://u:Xy7Q/Zr8W@127.0.0.1:1/", dsn=dsn
        )
        _, err = done.communicate(timeout=30)
        assert done.returncode == 2, err
        assert err.startswith("pgbroker: error: malformed "), err
        assert "Xy7Q" not in err, err


def test_an_option_the_bridge_would_not_use_is_a_usage_error(broker: Broker, dsn: str) -> None:
    """Each was taken without a word, and the bridge ran otherwise than its command line said."""
    broker.create_queue("outbox")
    nowhere = "redis://127.0.0.1:1/"  # refused before any broker is asked
    for options, said in [
        (
            ["--to", nowhere, "--exchange", "shop"],
            "--exchange: for RabbitMQ only, and the broker is redis://",
        ),
        (
            ["--to", nowhere, "--routing-key", "k", "--exchange-type", "direct"],
            "--routing-key, --exchange-type: for RabbitMQ only, and the broker is redis://",
        ),
        (["--to", nowhere, "--group", "g"], "--group: for --stream only; a queue is published without"),
    ]:
        done = pgbroker("bridge", "out", "--queue", "outbox", *options, dsn=dsn)
        _, err = done.communicate(timeout=30)
        assert done.returncode == 2, err
        assert err.startswith(f"pgbroker: error: {said}"), err
