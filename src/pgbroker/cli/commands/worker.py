"""``pgbroker worker MODULE:ATTR``: run handlers that consume queues, until SIGTERM or Ctrl-C.

MODULE:ATTR is imported from the current directory (it is put on the import path): a
pgbroker.App runs every handler it registered (or those of --queue), a function is run as the
handler of each --queue. With --processes N, a supervisor starts N worker processes, restarts
one that is killed, and passes SIGTERM and SIGINT on to them. The command, and each worker
process (a replacement too), waits for a database out of reach at its start (restarting, failing
over), as the running ones do (cli.support.waiting; --wait-for-database bounds the wait).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import operator
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pgbroker
from pgbroker import _event_loop as event_loop
from pgbroker._db.dsn import database_place
from pgbroker._log_lines import say, set_up
from pgbroker.cli.support.arguments import (
    positive_int,
    positive_seconds,
    positive_whole_seconds,
    seconds,
    whole,
)
from pgbroker.cli.support.connecting import dsn_of
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.parsers import Subcommands, add_command, add_progress_option, add_service_options
from pgbroker.cli.support.running import classify, print_error
from pgbroker.cli.support.user_modules import importable_from_cwd
from pgbroker.cli.support.waiting import until_reachable
from pgbroker.errors import QueueNotFound, StreamNotFound
from pgbroker.queues._client import Broker
from pgbroker.queues._records import Message
from pgbroker.runtime._app import App, serve
from pgbroker.runtime._signals import STOP_SIGNALS, hold_stop_signals, take_held
from pgbroker.runtime._stream_worker import StreamWorker
from pgbroker.runtime._worker import Worker
from pgbroker.streams._client import Stream

__all__ = ["register"]

log = logging.getLogger("pgbroker.worker")

# A worker process that was killed is started again after this pause, so that one that
# dies at once (out of memory, say) does not spin.
_RESTART_PAUSE = 1.0


def register(subcommands: Subcommands) -> None:
    summary = "run handlers that consume queues (until SIGTERM or Ctrl-C)"
    sub = add_command(subcommands, "worker", summary, _worker, json_output=False)
    sub.epilog = (
        "An option left out keeps what the App's @app.handler(...) set, else the default in "
        "parentheses. exit codes: see pgbroker --help"
    )
    sub.add_argument("target", metavar="MODULE:ATTR", help="a pgbroker.App, or a handler function")
    sub.add_argument(
        "--queue",
        action="append",
        default=[],
        metavar="QUEUE",
        help="queue to consume (repeatable; an App: all)",
    )
    sub.add_argument(
        "--concurrency",
        type=positive_int,
        metavar="N",
        help="messages in flight per process (the handler's, else 1)",
    )
    sub.add_argument(
        "--batch-size", type=positive_int, metavar="N", help="most messages per read (concurrency)"
    )
    sub.add_argument("--vt", type=positive_whole_seconds, metavar="DURATION", help="lease length (30)")
    sub.add_argument(
        "--no-heartbeat", dest="heartbeat", action="store_false", default=None, help="do not extend leases"
    )
    sub.add_argument(
        "--no-notify",
        dest="notify",
        action="store_false",
        default=None,
        help="do not enable notify on the queue",
    )
    sub.add_argument(
        "--poll-max", type=positive_seconds, metavar="DURATION", help="longest pause between polls (5)"
    )
    sub.add_argument("--grace", dest="grace_period", type=seconds, metavar="DURATION", help="drain time (30)")
    sub.add_argument(
        "--maintain-every",
        type=positive_seconds,
        metavar="DURATION",
        help="also apply archive retention this often",
    )
    sub.add_argument(
        "--max-deliveries",
        type=whole,
        metavar="N",
        help="a failed message's last delivery when the queue's policy sets none, then a dead "
        "letter (25; 0: retry for ever)",
    )
    sub.add_argument("--processes", type=positive_int, default=1, metavar="N", help="worker processes (1)")
    sub.add_argument(
        "--no-scheduler",
        dest="schedules",
        action="store_false",
        help="do not send schedule ticks (by default every worker process runs a scheduler)",
    )
    add_progress_option(sub, "counts and rates to stderr")
    add_service_options(sub)


def _worker(args: argparse.Namespace, broker: Broker) -> int:
    workers = _workers(args)  # import the handlers here, so that a mistake fails before any process starts
    event_loop.loop_factory(args.loop)  # and a wrong $PGBROKER_LOOP
    dsn = dsn_of(args.dsn, args.connect_timeout)
    # A missing queue, stream or group is the worker's to report (exit 4), with no start-up line
    # before the error. The line is said once the pools are open: a login refused before then
    # fails the start (exit 5), unsaid.
    announce = _once(lambda: _announce(workers, dsn, args.processes)) if _all_there(broker, workers) else None
    if args.processes == 1:
        return _serve_once_reachable(args, dsn, announce)
    return _supervise(args, dsn, announce)


def _once(say_it: Callable[[], None]) -> Callable[[], None]:
    """``say_it``, called the first time only (a start retried after a passing failure starts again)."""
    said = False

    def once() -> None:
        nonlocal said
        if not said:
            said = True
            say_it()

    return once


def _all_there(broker: Broker, workers: Sequence[Worker | StreamWorker]) -> bool:
    """Whether every queue, and every stream with its group, the workers consume exists (a name
    not found here only leaves the start-up line out: the worker itself judges). Each queue is
    asked for its policy, which the consumer role may read, where a list of every queue is the
    monitor's: a worker runs as a consumer."""
    for worker in workers:
        if isinstance(worker, Worker):
            try:
                broker.queue(worker.queue).policy()
            except QueueNotFound:
                return False
            continue
        try:
            groups = Stream(broker, worker.stream).groups()
        except StreamNotFound:
            return False
        if all(group.name != worker.group for group in groups):
            return False
    return True


def _announce(workers: Sequence[Worker | StreamWorker], dsn: str, processes: int) -> None:
    """One line on stderr, shown without -v: what the worker consumes, from where, how to stop it."""
    consumed = ", ".join(f"{worker.queue} (concurrency {worker.concurrency})" for worker in workers)
    each = f"{processes} processes, each" if processes > 1 else "1 process"
    say(
        f"worker started: {each} consuming {consumed} from {database_place(dsn)} (stop: Ctrl-C or SIGTERM)",
        event="command.started",
        command="worker",
    )


def _serve(
    workers: Sequence[Worker | StreamWorker],
    dsn: str,
    args: argparse.Namespace,
    on_started: Callable[[], None] | None,
) -> int:
    event_loop.run(
        serve(
            workers,
            dsn=dsn,
            progress_every=args.progress,
            schedules=args.schedules,
            pooler=args.pooler,
            pool_timeout=args.pool_timeout,
            on_started=on_started,
        ),
        args.loop,
    )
    return Exit.OK


def _workers(args: argparse.Namespace) -> Sequence[Worker | StreamWorker]:
    target = _load(args.target)
    names = (
        "concurrency",
        "batch_size",
        "vt",
        "heartbeat",
        "notify",
        "poll_max",
        "grace_period",
        "maintain_every",
        "max_deliveries",
    )
    options: dict[str, Any] = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if options.get("max_deliveries") == 0:
        options["max_deliveries"] = None
    if isinstance(target, App):
        streams = [] if args.queue else target.stream_workers()  # --queue names queues only
        workers: list[Worker | StreamWorker] = [*target.workers(args.queue or None, **options), *streams]
        if not workers:  # said before the start-up line, which would name nothing it consumes
            raise CliError(
                f"{args.target} has no handlers: it consumes nothing",
                code=Exit.USAGE,
                hint='Register one in that module: @app.handler("QUEUE") (or @app.stream_handler('
                '"STREAM", "GROUP")) on a function.',
            )
        return workers
    if not args.queue:
        raise CliError(
            f"{args.target} is a handler function: say which queue it consumes",
            code=Exit.USAGE,
            hint=f"pgbroker worker {args.target} --queue NAME",
        )
    return [Worker(name, target, **options) for name in args.queue]


def _load(target: str) -> App | Callable[[Message], Any]:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise CliError(
            f"expected MODULE:ATTR, got {target!r}",
            code=Exit.USAGE,
            hint="For example: pgbroker worker shop.jobs:app",
        )
    importable_from_cwd()
    try:
        module = importlib.import_module(module_name)
        found = operator.attrgetter(attribute)(module)
    except Exception as exc:  # whatever the user's module raised while it ran (SyntaxError included)
        raise CliError(f"cannot load {target}: {_user_frames(exc)}", code=Exit.USAGE) from exc
    if not (isinstance(found, App) or callable(found)):
        raise CliError(f"{target} is neither a pgbroker.App nor a function, but {found!r}", code=Exit.USAGE)
    return found  # type: ignore[no-any-return]


def _user_frames(exc: Exception) -> str:
    """The error, then the frames of the user's code that led to it: not those of the import
    machinery or of pgbroker, which only say where it was noticed."""
    machinery = tuple(str(Path(package.__file__ or "").parent) for package in (importlib, pgbroker))
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith(("<frozen ", *machinery))
    ]
    # The last line names the error; a SyntaxError's lines before it show where it is.
    *where, error = traceback.format_exception_only(exc)
    return "".join([error, *traceback.format_list(frames), *where]).rstrip()


def _supervise(args: argparse.Namespace, dsn: str, announce: Callable[[], None] | None) -> int:
    """Run args.processes worker processes until SIGTERM or SIGINT; restart one that is killed;
    ``announce`` once each of them has said that its pool is open.

    The first signal reaches the workers as SIGTERM (stop within the grace period), any later
    one as SIGINT (stop now). Exits with the first non-zero exit code of a worker process that
    ended on its own (after stopping the others), else 0.
    """
    context = multiprocessing.get_context("spawn")  # a fork would share the parent's connection
    level = logging.getLogger().getEffectiveLevel()
    children: list[BaseProcess] = []
    # Each worker process sends its pid once its pool is open.
    started_pids, started_writer = context.Pipe(duplex=False)
    started: set[int] = set()
    stopping = False
    result: int = Exit.OK

    def start(replacement: bool = False) -> None:
        if stopping:
            return
        child = context.Process(
            target=_child, args=(args, dsn, level, started_writer, replacement), name="pgbroker-worker"
        )
        child.start()
        children.append(child)
        if stopping and child.pid is not None:  # the stop signal came while it was being started
            os.kill(child.pid, signal.SIGTERM)

    def stop_all(*_: object) -> None:
        nonlocal stopping
        for child in children:
            if child.pid is not None and child.exitcode is None:
                os.kill(child.pid, signal.SIGINT if stopping else signal.SIGTERM)
        stopping = True

    previous = {signum: signal.signal(signum, stop_all) for signum in STOP_SIGNALS}
    try:
        if take_held():  # a stop signal came while it started: no worker process to start
            return result
        for _ in range(args.processes):
            start()
        log.info("supervisor.started processes=%s pid=%s", args.processes, os.getpid())
        while children:
            multiprocessing.connection.wait(
                [started_pids, *(child.sentinel for child in children)], timeout=1.0
            )
            while started_pids.poll():
                started.add(started_pids.recv())
            if announce is not None and all(child.pid in started for child in children):
                announce()
            for child in [c for c in children if c.exitcode is not None]:
                children.remove(child)
                code = child.exitcode
                assert code is not None
                if stopping or code == 0:
                    continue
                if code < 0:
                    log.warning("supervisor.restarting pid=%s signal=%s", child.pid, -code)
                    time.sleep(_RESTART_PAUSE)
                    start(replacement=True)
                else:
                    result = code
                    stop_all()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return result


def _child(
    args: argparse.Namespace,
    dsn: str,
    level: int,
    started: multiprocessing.connection.Connection,
    replacement: bool,
) -> None:
    """A worker process under the supervisor, which alone decides when it stops. A replacement
    waits for a login refused too, as the running worker processes do: exiting, it stopped them all."""
    # Out of the terminal's process group: Ctrl-C reaches the supervisor only, which passes it on.
    os.setpgrp()
    hold_stop_signals()  # the supervisor's SIGTERM, come while this process starts, stops it cleanly
    _stop_with(os.getppid())
    set_up(level, args.log_format)
    try:
        code = _serve_once_reachable(args, dsn, _once(lambda: started.send(os.getpid())), replacement)
    except Exception as exc:
        code, message, hint = classify(exc)
        print_error(message, hint)
    sys.exit(code)


def _serve_once_reachable(
    args: argparse.Namespace, dsn: str, on_started: Callable[[], None] | None, refused_too: bool = False
) -> int:
    """Serve, waiting for a database out of reach at the start (cli.support.waiting) until it
    answers or a stop signal comes. A worker process that exited instead stayed down; under the
    supervisor, a replacement that did made it stop every worker process for good."""
    code = until_reachable(
        lambda: _serve(_workers(args), dsn, args, on_started),
        within=args.wait_for_database,
        refused_too=refused_too,
    )
    return Exit.OK if code is None else code


def _stop_with(parent: int) -> None:
    """Stop gracefully once the supervisor is gone (killed): nobody else would stop this process."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="pgbroker-parent-watch", daemon=True).start()
