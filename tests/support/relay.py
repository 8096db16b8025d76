"""A TCP relay on a free loopback port that can freeze: the path to a shared server (the machine's
RabbitMQ, which other tests use and which must never be stopped) hangs as a network that drops
packets without a word, or a stopped server, leaves it, and nothing else is touched.

While frozen the relay reads nothing and writes nothing and accepts no connection, its sockets
left open: what a client sends waits in the kernel's buffers (new connections in the listen
backlog), as with a server stopped by SIGSTOP. Thawed, it forwards what waited, in order, and
accepts again. Real sockets and a real server behind them: the only fake is the stall.
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.servers import HOST

_CHUNK = 65536
_TICK = 0.05  # how soon a freeze or a close is seen by the relay's thread


class Relay:
    """``with Relay(port) as relay``: ``relay.port`` forwards to ``port``; ``freeze()``, ``thaw()``."""

    def __init__(self, target_port: int) -> None:
        self._target = (HOST, target_port)
        self._listener = socket.create_server((HOST, 0), backlog=64)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closing = threading.Event()
        # socket -> (its peer, bytes read from it not yet written to the peer)
        self._pairs: dict[socket.socket, tuple[socket.socket, bytearray]] = {}
        self._clients: set[socket.socket] = set()
        self._marker: bytes | None = None
        self._thread = threading.Thread(target=self._run, name=f"relay-{self.port}", daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def freeze(self) -> None:
        self._flowing.clear()

    def freeze_on(self, marker: bytes) -> None:
        """Freeze once a client sends ``marker`` (a name only one request carries), before it is
        forwarded: the path hangs at that request, after what went before (a handshake) worked."""
        self._marker = marker

    def thaw(self) -> None:
        self._flowing.set()

    @contextmanager
    def frozen(self) -> Iterator[None]:
        self.freeze()
        try:
            yield
        finally:
            self.thaw()

    def close(self) -> None:
        self._closing.set()
        self._thread.join(10)
        for sock in [self._listener, *self._pairs]:
            sock.close()
        self._pairs.clear()
        self._clients.clear()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._closing.is_set():
                if not self._flowing.wait(_TICK):
                    continue
                self._flush()
                for key, _ in selector.select(_TICK):
                    if not self._flowing.is_set():
                        break  # frozen meanwhile: what is readable waits in the kernel
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        self._accept(selector)
                    elif sock in self._pairs:
                        self._pump(selector, sock)

    def _accept(self, selector: selectors.BaseSelector) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            server = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return
        for sock, peer in ((client, server), (server, client)):
            sock.setblocking(False)
            self._pairs[sock] = (peer, bytearray())
            selector.register(sock, selectors.EVENT_READ)
        self._clients.add(client)

    def _pump(self, selector: selectors.BaseSelector, sock: socket.socket) -> None:
        peer, waiting = self._pairs[sock]
        try:
            data = sock.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # one side closed: close both, as a server's exit would
            for s in (sock, peer):
                if s in self._pairs:
                    selector.unregister(s)
                    del self._pairs[s]
                self._clients.discard(s)
                s.close()
            return
        waiting += data
        if self._marker is not None and sock in self._clients and self._marker in data:
            self._marker = None
            self.freeze()  # what was read waits, forwarded once thawed
            return
        self._flush()

    def _flush(self) -> None:
        """Write what each side read to its peer, as far as the peer takes it now."""
        for peer, waiting in list(self._pairs.values()):
            while waiting:
                try:
                    sent = peer.send(waiting)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    waiting.clear()
                    break
                del waiting[:sent]
