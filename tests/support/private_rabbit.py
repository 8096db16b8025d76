"""A private RabbitMQ node for tests that restart RabbitMQ: the machine's shared server is never
touched, since other tests (and other people) use it.

The node runs the installed server (/usr/lib/rabbitmq/bin/rabbitmq-server, Debian's layout, or
rabbitmq-server on PATH) with its own node name, free AMQP and distribution ports, and its
database, logs, config, plugins list and Erlang cookie ($HOME) under a directory of its own, so
that nothing of the system node's configuration applies. Restarting it keeps its database:
durable queues and persistent messages survive, as they would on a real restart.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

_SERVER_CANDIDATES = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/lib/rabbitmq/sbin/rabbitmq-server")


def server_binary() -> str | None:
    """The rabbitmq-server script to run directly (not Debian's wrapper, which resets the environment)."""
    for candidate in _SERVER_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("rabbitmq-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrivateRabbit:
    """A RabbitMQ node of its own in ``base``: start(), stop(), restart(); ``url`` stays the same."""

    def __init__(self, base: Path, server: str) -> None:
        self.base = base
        self.server = server
        self.port = _free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self._dist_port = _free_port()
        self._node = f"pgbtest-{uuid.uuid4().hex[:8]}@localhost"
        self._process: subprocess.Popen[bytes] | None = None
        for d in ("mnesia", "log"):
            (base / d).mkdir(parents=True, exist_ok=True)
        # Only loopback: guest may log in from there by default.
        (base / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n")
        (base / "rabbitmq-env.conf").write_text("")
        (base / "enabled_plugins").write_text("[].\n")

    def _environment(self) -> dict[str, str]:
        b = str(self.base)
        return {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/bin"),
            "HOME": b,  # the Erlang cookie goes here
            "RABBITMQ_NODENAME": self._node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self._dist_port),
            "RABBITMQ_MNESIA_BASE": f"{b}/mnesia",
            "RABBITMQ_LOG_BASE": f"{b}/log",
            "RABBITMQ_CONFIG_FILE": f"{b}/rabbitmq.conf",
            "RABBITMQ_CONF_ENV_FILE": f"{b}/rabbitmq-env.conf",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{b}/enabled_plugins",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def start(self, timeout: float = 60.0) -> None:
        log = (self.base / "server.out").open("ab")
        self._process = subprocess.Popen(
            [self.server],
            cwd=self.base,
            env=self._environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() signals the server and its children
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"private RabbitMQ exited at start; see {self.base / 'server.out'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"private RabbitMQ did not listen within {timeout} s; see {self.base / 'server.out'}"
        )

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the node as a service manager would (SIGTERM: a clean shutdown) and wait for it."""
        process, self._process = self._process, None
        if process is None:
            return
        pgid = process.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            process.poll()
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.killpg(pgid, signal.SIGKILL)
        process.wait()

    def ctl(self, *args: str) -> str:
        """Run rabbitmqctl against this node (same cookie, same node name); its output."""
        ctl = Path(self.server).with_name("rabbitmqctl")
        done = subprocess.run(
            [str(ctl), "-n", self._node, *args],
            env=self._environment(),
            cwd=self.base,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout

    def restart(self) -> None:
        self.stop()
        self.start()
