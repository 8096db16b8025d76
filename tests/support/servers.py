"""Private broker servers for the connector tests: Redis, NATS with JetStream, Mosquitto and
moto's SQS endpoint, each a process of its own on a free loopback port with its data under a
directory of its own, so a test can restart or kill it without touching the machine's shared
servers (other tests, and other people, use those).

A restart keeps the data: Redis writes an append-only file synced on every write, NATS a file
store, Mosquitto its persistence file at shutdown. moto keeps everything in memory: a restart
would lose every queue and message, so the SQS tests never restart it.

Private servers rather than the machine's shared ones (Redis 6379, NATS 4222, Mosquitto 1883),
even for the tests that restart nothing: the same settings everywhere (AOF synced on every
write, no limit on an absent MQTT session's queue) and no leftovers on servers others use.
``make test`` installs the binaries first (scripts/ensure-brokers); a missing one fails the test
with that hint.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.postgres import scratch_dir
from tests.support.processes import stop_gracefully

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def answers(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def binary(name: str) -> str | None:
    """An installed server binary (Debian puts some in /usr/sbin, which PATH may lack)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")


@dataclass(frozen=True)
class Kind:
    """How to run one kind of server: its binary, and the command line for a port and a data
    directory (with any config file written there)."""

    name: str
    binary: str
    command: Callable[[str, int, Path], list[str]]


def _redis(exe: str, port: int, data: Path) -> list[str]:
    return [exe, "--port", str(port), "--bind", HOST, "--dir", str(data), "--appendonly", "yes",
            "--appendfsync", "always", "--save", "", "--protected-mode", "no"]  # fmt: skip


def _nats(exe: str, port: int, data: Path) -> list[str]:
    return [exe, "-js", "-a", HOST, "-p", str(port), "-sd", str(data)]


def _mosquitto(exe: str, port: int, data: Path) -> list[str]:
    config = data / "mosquitto.conf"
    # Persistent sessions keep every message for a subscriber that is away (max_queued_messages
    # 0: no limit), and up to 1000 may be in flight to it unacked (the default is 20).
    config.write_text(
        f"listener {port} {HOST}\nallow_anonymous true\nuser root\npersistence true\n"
        f"persistence_location {data}/\nmax_queued_messages 0\nmax_inflight_messages 1000\n"
        "log_dest none\n"
    )
    return [exe, "-c", str(config)]


def _moto(exe: str, port: int, data: Path) -> list[str]:
    del exe, data
    return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]


# The connectors the bridge tests run against, each on a private server of its kind.
CONNECTORS = ["redis", "nats", "mqtt", "sqs"]

KINDS = {
    "redis": Kind("redis", "redis-server", _redis),
    "nats": Kind("nats", "nats-server", _nats),
    "mqtt": Kind("mqtt", "mosquitto", _mosquitto),
    "sqs": Kind("sqs", "moto", _moto),
}


class PrivateServer:
    """A server of its own: start(), stop(), restart(), kill(); the port stays the same."""

    def __init__(self, kind: Kind, base: Path) -> None:
        self.kind = kind
        self.base = base
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        exe = binary(kind.binary) if kind.name != "sqs" else "moto"
        if exe is None:
            raise RuntimeError(
                f"{kind.binary} is not installed; run scripts/ensure-brokers (make test does; as root it"
                " installs Debian's package)"
            )
        self._exe = exe

    def start(self) -> None:
        data = self.base / "data"
        data.mkdir(parents=True, exist_ok=True)
        log = (self.base / "server.log").open("ab")
        self._process = subprocess.Popen(
            self.kind.command(self._exe, self.port, data),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 30
        while not answers(self.port):
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.kind.binary} exited at start; see {self.base / 'server.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kind.binary} does not answer on port {self.port} after 30 s")
            time.sleep(0.05)

    def stop(self) -> None:
        """A graceful stop (SIGTERM): the server saves what it keeps."""
        if self._process is not None:
            stop_gracefully(self._process, 20)
        self._process = None

    def close(self) -> None:
        """Stop it and remove its directory."""
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def restart(self, down_for: float = 1.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()

    def pause(self) -> None:
        """Freeze it (SIGSTOP): its connections stay open and answer nothing, as a hung server's
        or a silently dropped network's would."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)


@contextmanager
def private_server(kind: str) -> Iterator[PrivateServer]:
    """A private server of ``kind`` (KINDS), started; at the end resumed (a test may have frozen
    it), stopped and its directory removed."""
    node = PrivateServer(KINDS[kind], scratch_dir(f"pgbroker-{kind}-"))
    node.start()
    try:
        yield node
    finally:
        node.resume()
        node.close()
