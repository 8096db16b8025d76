"""``pgbroker bridge out|in``: the bridges (pgbroker.bridge) from a shell.

``bridge out --queue Q --to URL`` publishes queue Q to the broker at URL (a transactional
outbox); ``bridge in --from URL --queue Q`` receives from the broker into Q. The URL's scheme
chooses the broker: amqp://, redis://, nats://, mqtt://, sqs:// (docs/bridge.md). The RabbitMQ
forms of before still work: ``bridge out --queue Q --amqp URL`` and
``bridge in --amqp URL --from RABBIT_QUEUE --queue Q`` (the AMQP URL also from
$PGBROKER_AMQP_URL). A stream in place of the queue: ``bridge out --stream S --group G --to URL``
(read as consumer group G, acked after the confirm) and ``bridge in --from URL --stream S``.
Both run until SIGTERM or Ctrl-C: the first signal finishes the batch in hand (published and
acked, or written and acked) and exits 0; a second one exits at once (what was in hand is
delivered again later, as after a crash) and exits 130.

Exit codes are pgbroker's (see pgbroker --help); 6 is the bridge's own: the broker unreachable,
a refused login, or a missing exchange, queue or stream (without --declare).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

from pgbroker import _event_loop as event_loop
from pgbroker._db.dsn import database_place
from pgbroker._log_lines import say
from pgbroker.cli.support.arguments import (
    positive_int,
    positive_seconds,
    positive_whole_seconds,
    whole_seconds,
)
from pgbroker.cli.support.connecting import dsn_of
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.parsers import (
    Handler,
    Subcommands,
    add_command,
    add_group,
    add_progress_option,
    add_service_options,
)
from pgbroker.cli.support.running import needs_extra
from pgbroker.queues._client import Broker
from pgbroker.queues._refusal_watch import RefusalWatch
from pgbroker.runtime._signals import on_stop_signals

__all__ = ["register"]

AMQP_ENV = "PGBROKER_AMQP_URL"


def register(subcommands: Subcommands) -> None:
    summary = "bridges to RabbitMQ, Redis, NATS, MQTT, SQS: publish a queue (out), or receive into one (in)"
    actions = add_group(subcommands, "bridge", summary, metavar="DIRECTION")

    def command(name: str, summary: str, handler: Handler) -> argparse.ArgumentParser:
        sub = add_command(actions, name, summary, handler, json_output=False)
        sub.add_argument(
            "--amqp", metavar="URL", help=f"RabbitMQ, amqp://user:password@host:5672/vhost (${AMQP_ENV})"
        )
        sub.add_argument(
            "--declare", action="store_true", help="create what is missing on the broker (durable)"
        )
        sub.add_argument(
            "--batch-size", type=positive_int, default=500, metavar="N", help="messages per batch (500)"
        )
        add_progress_option(sub, "counts")
        add_service_options(sub)
        return sub

    sub = command("out", "publish a pgbroker queue to a broker, acking each message after its confirm", _out)
    what = sub.add_mutually_exclusive_group(required=True)
    what.add_argument("--queue", metavar="QUEUE", help="the pgbroker queue to publish")
    what.add_argument("--stream", metavar="STREAM", help="the pgbroker stream to publish (with --group)")
    sub.add_argument("--group", metavar="NAME", help="--stream: the consumer group the bridge reads as")
    sub.add_argument(
        "--consumer", metavar="NAME", help="--stream: this bridge's name in the group (host:pid:random)"
    )
    sub.add_argument(
        "--to", metavar="URL", help="the broker: amqp://, redis://, nats://, mqtt://, sqs:// (docs/bridge.md)"
    )
    sub.add_argument("--exchange", metavar="NAME", help="RabbitMQ: exchange without x-amqp-exchange ('')")
    sub.add_argument(
        "--routing-key",
        metavar="KEY",
        help="RabbitMQ: routing key without x-amqp-routing-key (the queue's name)",
    )
    sub.add_argument(
        "--exchange-type",
        metavar="TYPE",
        help="RabbitMQ with --declare: exchange type (topic)",
    )
    sub.add_argument(
        "--windows", type=positive_int, default=2, metavar="N", help="batches in flight at once (2)"
    )
    sub.add_argument(
        "--lease", type=positive_whole_seconds, default=30, metavar="DURATION", help="lease per message (30)"
    )
    sub.add_argument(
        "--confirm-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="DURATION",
        help="wait for a confirm this long (30)",
    )
    sub.add_argument(
        "--no-notify", dest="notify", action="store_false", help="do not enable notify on the queue"
    )

    sub = command("in", "receive from a broker into a pgbroker queue, acking after the commit", _in)
    sub.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="URL",
        help="the broker (amqp://, redis://, nats://, mqtt://, sqs://); with --amqp: the RabbitMQ queue",
    )
    what = sub.add_mutually_exclusive_group(required=True)
    what.add_argument("--queue", metavar="QUEUE", help="the pgbroker queue to write to")
    what.add_argument("--stream", metavar="STREAM", help="the pgbroker stream to append to")
    sub.add_argument(
        "--prefetch", type=positive_int, default=1000, metavar="N", help="unacked deliveries (1000)"
    )
    sub.add_argument(
        "--dedup-window",
        type=whole_seconds,
        default=86_400,
        metavar="DURATION",
        help="remember message_ids this long, e.g. 1h or 7d (1d)",
    )
    sub.add_argument(
        "--ack-wait",
        type=positive_seconds,
        default=30.0,
        metavar="DURATION",
        help="NATS, SQS, Redis: an unacked message goes to another consumer after this (30)",
    )


class _Bridge(Protocol):
    stats: Any
    started: asyncio.Event

    @property
    def where(self) -> str: ...

    async def run(self) -> None: ...

    def stop(self) -> None: ...


def _amqp_url(args: argparse.Namespace) -> str:
    url: str | None = args.amqp or os.environ.get(AMQP_ENV)
    if not url:
        raise CliError(
            f"no broker given: no URL, and no RabbitMQ given (--amqp, ${AMQP_ENV})",
            code=Exit.USAGE,
            hint="Pass --to URL (out) or --from URL (in), e.g. redis://127.0.0.1:6379, or"
            f" --amqp amqp://user:password@host:5672/, or set ${AMQP_ENV}.",
        )
    return url


def _target(args: argparse.Namespace) -> str:
    if args.to and args.amqp:
        raise CliError("give --to or --amqp, not both", code=Exit.USAGE)
    return str(args.to) if args.to else _amqp_url(args)


def _source(args: argparse.Namespace) -> tuple[str | None, str]:
    """(name on the broker, URL): --from URL names both; --from NAME takes the URL from --amqp."""
    if "://" in args.source:
        if args.amqp:
            raise CliError(
                "--from is a URL, so --amqp is not needed",
                code=Exit.USAGE,
                hint="Give --from URL alone, or --amqp URL with --from RABBIT_QUEUE.",
            )
        return None, str(args.source)
    return str(args.source), _amqp_url(args)


def _refuse_unused_options(args: argparse.Namespace, url: str) -> None:
    """An option that would change nothing is a usage error: it was taken without a word, so a
    bridge ran otherwise than its command line said."""
    stream_only = (("--group", args.group), ("--consumer", args.consumer))
    given = [option for option, value in stream_only if value]
    if args.queue is not None and given:
        raise CliError(
            f"{', '.join(given)}: for --stream only; a queue is published without a consumer group",
            code=Exit.USAGE,
            hint="Leave it out, or publish a stream: --stream S --group G.",
        )
    scheme = url.partition("://")[0].lower()
    rabbit_only = (("--exchange", args.exchange), ("--routing-key", args.routing_key))
    given = [option for option, value in (*rabbit_only, ("--exchange-type", args.exchange_type)) if value]
    if scheme not in ("amqp", "amqps") and given:
        raise CliError(
            f"{', '.join(given)}: for RabbitMQ only, and the broker is {scheme}://",
            code=Exit.USAGE,
            hint="Say where messages go in the URL (docs/bridge.md lists each broker's options).",
        )


def _out(args: argparse.Namespace, broker: Broker) -> int:
    with needs_extra("bridge"):
        from pgbroker.bridge import OutboundBridge, OutboundSettings
        from pgbroker.bridge.core.endpoints import outbound_endpoint

    url = _target(args)
    _refuse_unused_options(args, url)
    settings = OutboundSettings(
        exchange=args.exchange or "",
        routing_key=args.routing_key,
        batch_size=args.batch_size,
        windows=args.windows,
        lease=args.lease,
        confirm_timeout=args.confirm_timeout,
        declare=args.declare,
        exchange_type=args.exchange_type or "topic",
        enable_notify=args.notify,
    )
    name = args.queue or args.stream
    with needs_extra("bridge"):
        outbound_endpoint(url, name, settings)  # the URL and its client library, before anything runs
    if args.stream is None:
        return _serve(
            broker,
            args,
            lambda abroker: OutboundBridge(abroker, args.queue, url, settings),
            lambda where, place: f"publishing queue {args.queue} ({place}) to {where}",
        )
    if not args.group:
        raise CliError("--stream needs --group", code=Exit.USAGE, hint="The bridge reads as a consumer group")
    from pgbroker.bridge.core.stream_outbound import StreamOutboundBridge

    return _serve(
        broker,
        args,
        lambda abroker: StreamOutboundBridge(
            abroker, args.stream, args.group, url, settings, consumer=args.consumer
        ),
        lambda where, place: f"publishing stream {args.stream} as group {args.group} ({place}) to {where}",
    )


def _in(args: argparse.Namespace, broker: Broker) -> int:
    with needs_extra("bridge"):
        from pgbroker.bridge import InboundBridge, InboundSettings
        from pgbroker.bridge.core.endpoints import inbound_endpoint
        from pgbroker.bridge.core.inbound import StreamInboundBridge

    settings = InboundSettings(
        batch_size=args.batch_size,
        prefetch=args.prefetch,
        seen_within=args.dedup_window,
        declare=args.declare,
        ack_wait=args.ack_wait,
    )
    source, url = _source(args)
    name = args.queue or args.stream
    with needs_extra("bridge"):
        inbound_endpoint(url, source, name, settings)  # the URL and its client library, before anything runs
    kind = InboundBridge if args.stream is None else StreamInboundBridge
    into = "queue" if args.stream is None else "stream"
    return _serve(
        broker,
        args,
        lambda abroker: kind(abroker, source, name, url, settings),
        lambda where, place: f"receiving from {where} into {into} {name} ({place})",
    )


# Says why at ERROR when the server refuses the bridge's connections (a password changed).
_REFUSALS = RefusalWatch(logging.getLogger("pgbroker.bridge"), "bridge.database_refused", "bridge")


def _serve(
    broker: Broker,
    args: argparse.Namespace,
    make: Callable[[Any], _Bridge],
    describe: Callable[[str, str], str],
) -> int:
    """Run the bridge ``make`` builds until a stop signal. ``describe(broker's place, database's
    place)`` says what it does, in the line printed once it has started (shown without -v, as
    pgbroker worker's and serve's are): a bridge otherwise runs without a word."""
    from pgbroker.bridge import BridgeError
    from pgbroker.queues._client_async import AsyncBroker

    dsn = dsn_of(args.dsn, args.connect_timeout)

    async def announce(bridge: _Bridge) -> None:
        await bridge.started.wait()
        what = describe(bridge.where, database_place(dsn))
        say(f"bridge started: {what} (stop: Ctrl-C or SIGTERM)", event="command.started", command="bridge")

    async def run() -> None:
        async with AsyncBroker(
            dsn, max_connections=4, pooler=args.pooler, pool_timeout=args.pool_timeout
        ) as abroker:
            bridge = make(abroker)
            task = asyncio.create_task(bridge.run())
            signals = 0

            def on_signal(_: int) -> None:
                nonlocal signals
                signals += 1
                bridge.stop()
                if signals > 1:
                    task.cancel()  # a second signal: leave now

            reporter = asyncio.create_task(_report(bridge, args.progress)) if args.progress else None
            announcer = asyncio.create_task(announce(bridge))
            try:
                with on_stop_signals(on_signal):
                    async with _REFUSALS.watching(abroker):
                        await task
            finally:
                announcer.cancel()
                if reporter is not None:
                    reporter.cancel()

    try:
        event_loop.run(run(), args.loop)
    except asyncio.CancelledError:
        say("interrupted", event="command.interrupted")
        return Exit.INTERRUPTED
    except BridgeError as exc:
        raise CliError(exc.message, code=Exit.AMQP, hint=exc.hint) from exc
    return Exit.OK


async def _report(bridge: _Bridge, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        fields = " ".join(f"{k}={v}" for k, v in asdict(bridge.stats).items() if not isinstance(v, dict))
        print(f"progress {fields}", file=sys.stderr, flush=True)
