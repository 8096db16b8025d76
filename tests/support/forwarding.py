"""A server that comes and goes on a loopback port: a plain TCP relay on 127.0.0.1 to the test's
Postgres (its TCP port or its Unix socket), started when the test says the server is "back". Before
it starts, nothing listens on the port: a connection is refused, as to a server that is down."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from psycopg.conninfo import conninfo_to_dict

HOST = "127.0.0.1"


def _upstream(dsn: str) -> socket.socket:
    """A socket connected to the server of ``dsn``."""
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "/var/run/postgresql")
    port = int(params.get("port") or 5432)
    if host.startswith("/"):
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.connect(f"{host}/.s.PGSQL.{port}")
        return unix
    return socket.create_connection((host, port))


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    for end in (source, sink):
        with suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)


@contextmanager
def relaying(port: int, dsn: str) -> Iterator[None]:
    """Listen on 127.0.0.1:``port`` and relay each connection to the server of ``dsn`` until the
    block ends; then close every relayed connection and the port."""
    listener = socket.create_server((HOST, port))
    opened: list[socket.socket] = []

    def accept() -> None:
        with suppress(OSError):
            while True:
                client, _ = listener.accept()
                server = _upstream(dsn)
                opened.extend((client, server))
                for source, sink in ((client, server), (server, client)):
                    threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield
    finally:
        with suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        for end in opened:
            with suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()
        acceptor.join(10)
