"""``pgbroker serve``: run the HTTP API (pgbroker.http) with uvicorn.

The server opens its own async pool on the database the CLI connected to. It needs the ``http``
extra, imported only when the command runs.
"""

from __future__ import annotations

import argparse
import errno
import math
import signal
import socket
from types import FrameType

from pgbroker import _event_loop as event_loop
from pgbroker._db.liveness import STOP_PATIENCE
from pgbroker.cli.support.arguments import (
    port,
    positive_int,
    positive_number,
    positive_seconds,
    positive_whole_seconds,
    seconds,
    whole_seconds,
)
from pgbroker.cli.support.codec_modules import add_codec_module_option, load_codec_modules
from pgbroker.cli.support.connecting import dsn_of, require_installed
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.parsers import Subcommands, add_command, add_service_options
from pgbroker.cli.support.running import needs_extra
from pgbroker.queues._client import Broker
from pgbroker.runtime._signals import STOP_SIGNALS, take_held

__all__ = ["register"]


def register(subcommands: Subcommands) -> None:
    summary = "serve the HTTP API, /metrics and the dashboard"
    sub = add_command(subcommands, "serve", summary, _serve, json_output=False)
    sub.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    sub.add_argument("--port", type=port, default=8080, help="port (8080; 0: any free one)")
    sub.add_argument(
        "--max-body", type=positive_int, default=1024 * 1024, metavar="BYTES", help="request body limit"
    )
    sub.add_argument(
        "--rate", type=positive_number, default=100.0, metavar="PER_SECOND", help="per-key rate limit (100)"
    )
    sub.add_argument("--burst", type=positive_number, default=200.0, metavar="N", help="per-key burst (200)")
    sub.add_argument(
        "--max-wait", type=seconds, default=20.0, metavar="DURATION", help="longest long-poll of a read (20)"
    )
    sub.add_argument(
        "--head-timeout",
        type=positive_seconds,
        default=10.0,
        metavar="DURATION",
        help="close a connection whose request line and headers take longer (10)",
    )
    sub.add_argument(
        "--body-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="DURATION",
        help="answer 408 and close when a request's body takes longer (30)",
    )
    sub.add_argument(
        "--keep-alive",
        type=whole_seconds,
        default=5,
        metavar="DURATION",
        help="close a kept-alive connection idle this long (5)",
    )
    sub.add_argument(
        "--answer-within",
        type=positive_seconds,
        default=30.0,
        metavar="DURATION",
        help="give up a request's database calls unanswered this long past its own long-poll wait"
        " (a hung server or pooler): 503 with Retry-After, the session closed (30)",
    )
    sub.add_argument(
        "--max-concurrency",
        type=positive_int,
        default=256,
        metavar="N",
        help="requests handled at once; more are answered 503 with Retry-After (256); the last quarter go"
        " one per API key with none in hand",
    )
    sub.add_argument(
        "--max-concurrency-per-key",
        type=positive_int,
        default=None,
        metavar="N",
        help="requests of one API key handled at once, long polls included; more are answered 429"
        " with Retry-After, so that one key cannot take every slot (half of --max-concurrency)",
    )
    sub.add_argument(
        "--auth-failure-rate",
        type=positive_number,
        default=1.0,
        metavar="PER_SECOND",
        help="failed API keys per client address before unknown keys are refused unread (1)",
    )
    sub.add_argument(
        "--auth-failure-burst",
        type=positive_number,
        default=20.0,
        metavar="N",
        help="burst of failed keys (20)",
    )
    sub.add_argument("--public-metrics", action="store_true", help="serve /metrics without a key")
    sub.add_argument(
        "--history-retention",
        type=whole_seconds,
        default=24 * 3600,
        metavar="DURATION",
        help="keep the dashboard's stats history this long, such as 6h or 7d; 0: no history (24h)",
    )
    sub.add_argument(
        "--history-interval",
        type=positive_whole_seconds,
        default=10,
        metavar="DURATION",
        help="sample the stats history this often (10s)",
    )
    sub.add_argument(
        "--connections", type=positive_int, default=10, metavar="N", help="database pool size (10)"
    )
    sub.add_argument(
        "--replica-dsn",
        metavar="DSN",
        help="a streaming standby to read the statistics, /metrics, peek and listings from (with "
        "its replay lag); writes still go to --dsn. It gets a pool of --connections too. While it "
        "does not answer, they read from --dsn (said once in the log)",
    )
    add_codec_module_option(sub)  # the codecs HTTP sends may name
    add_service_options(sub)


def _serve(args: argparse.Namespace, broker: Broker) -> int:
    with needs_extra("http"):
        import uvicorn

        from pgbroker.http import Settings, create_app
        from pgbroker.http.server import AnnouncingServer, protocol_with_head_timeout

    load_codec_modules(args)
    event_loop.loop_factory(args.loop)  # a loop it cannot give fails here, in pgbroker's words
    require_installed(broker)  # else it would serve, every request failing
    _check_address(args.host, args.port)
    dsn = dsn_of(args.dsn, args.connect_timeout)
    settings = Settings(
        max_body_bytes=args.max_body,
        rate_per_second=args.rate,
        rate_burst=args.burst,
        max_wait_seconds=args.max_wait,
        answer_within_seconds=args.answer_within,
        metrics_public=args.public_metrics,
        max_concurrency=args.max_concurrency,
        max_concurrency_per_key=args.max_concurrency_per_key,
        body_timeout_seconds=args.body_timeout,
        auth_failures_per_second=args.auth_failure_rate,
        auth_failure_burst=args.auth_failure_burst,
        history_retention_seconds=args.history_retention,
        history_interval_seconds=args.history_interval,
    )
    replica_dsn = None if args.replica_dsn is None else dsn_of(args.replica_dsn, args.connect_timeout)
    app = create_app(
        dsn,
        settings=settings,
        max_connections=args.connections,
        replica_dsn=replica_dsn,
        pooler=args.pooler,
        pool_timeout=args.pool_timeout,
    )
    # uvicorn shuts down gracefully on SIGTERM and SIGINT, then raises the signal again for the
    # handler it found: with the default ones the process would die of SIGTERM (exit -15, no
    # cleanup) and exit 130 on Ctrl-C. Either is how a server is normally stopped, so it ends
    # here, as a success, as `pgbroker worker` does (a second Ctrl-C still cuts the wait short).
    previous = {signum: signal.signal(signum, _stop) for signum in STOP_SIGNALS}
    try:
        if take_held():  # a stop signal came while it started: it stops before it serves
            return Exit.OK
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="info" if getattr(args, "verbose", 0) else "warning",
            # JSON lines: uvicorn's records go to the command's handler, not to uvicorn's own.
            log_config=None if args.log_format == "json" else uvicorn.config.LOGGING_CONFIG,
            http=protocol_with_head_timeout(args.head_timeout),
            timeout_keep_alive=args.keep_alive,
            # Requests in flight are answered first: at the stop a long poll answers at once, and
            # a database call gets STOP_PATIENCE (pgbroker.http.app.begin_stop); past this, what a
            # client still holds (a body, an answer it reads slowly) is cut.
            timeout_graceful_shutdown=math.ceil(STOP_PATIENCE) + 5,
            loop=event_loop.chosen(args.loop),  # uvicorn knows the same names
        )
        AnnouncingServer(config).run()
    except _Stopped:
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return Exit.OK


_LISTEN_HINTS = {
    errno.EADDRINUSE: "Another process listens there (ss -ltnp shows which): stop it, or pass another "
    "--port.",
    errno.EADDRNOTAVAIL: "No interface of this machine has that address: pass --host 127.0.0.1 (this "
    "machine only) or 0.0.0.0 (every interface).",
    errno.EACCES: "Ports below 1024 need root (or CAP_NET_BIND_SERVICE): pass a --port of 1024 or more.",
}


def _check_address(host: str, port: int) -> None:
    """Bind the address as uvicorn will (SO_REUSEADDR, each address the host resolves to), and let
    it go: an address that cannot be had fails here, in pgbroker's words. uvicorn logs only the
    OS's error and exits 3, which pgbroker's exit codes call a stale receipt."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CliError(
            f"cannot listen on {host}: {exc.strerror}",
            code=Exit.USAGE,
            hint="Pass --host an address or name of this machine: 127.0.0.1 (this machine only) or "
            "0.0.0.0 (every interface).",
        ) from exc
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                where = f"[{address[0]}]:{port}" if family == socket.AF_INET6 else f"{address[0]}:{port}"
                raise CliError(
                    f"cannot listen on {where}: {exc.strerror or exc}",
                    code=Exit.USAGE,
                    hint=_LISTEN_HINTS.get(exc.errno or 0),
                ) from exc


class _Stopped(Exception):
    """SIGTERM or SIGINT, passed on by uvicorn once it has shut down."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped
