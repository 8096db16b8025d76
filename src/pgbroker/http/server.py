"""What ``pgbroker serve`` puts in front of the application: uvicorn's server, which says where it
listens once it does, and its HTTP protocol with a deadline on each request's head.

uvicorn closes a kept-alive connection that stays idle (``timeout_keep_alive``), but it sets no
clock on a connection that has sent nothing yet, nor on one sending its headers a byte at a time:
such sockets stay open for as long as their client likes. Here the request line and headers must
arrive within ``head_timeout`` seconds of the connection opening, or of the first byte of a later
request; a connection late with them is closed.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, cast

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pgbroker._event_loop import running_loop
from pgbroker._log_lines import say
from pgbroker.http.app import begin_stop

__all__ = ["AnnouncingServer", "protocol_with_head_timeout"]


class AnnouncingServer(uvicorn.Server):
    """uvicorn's server, printing to stderr where the API and the dashboard are once it listens
    (uvicorn's own line is at INFO, which the CLI shows only with -v), and telling the application
    of its stop before it waits for the requests in flight (pgbroker.http.app.begin_stop)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in self.servers:
            for listening in server.sockets:
                host, port = listening.getsockname()[:2]
                url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
                say(
                    f"serving the API at {url}/v1 and the dashboard at {url}/dashboard "
                    f"(event loop {running_loop()}; stop: Ctrl-C or SIGTERM)",
                    event="command.started",
                    command="serve",
                    url=url,
                )

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # The application is told first: uvicorn then waits for the requests in flight, which
        # now end within STOP_PATIENCE (a long poll at once) instead of its graceful timeout.
        begin_stop(cast(Starlette, self.config.app))  # pgbroker serve's, create_app's
        await super().shutdown(sockets)


class _HeadDeadline(HttpToolsProtocol):
    head_timeout: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._head_deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # a new request begins: its head has the time, not the whole connection
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_deadline = self.loop.call_later(self.head_timeout, self._head_too_late)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_late(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol_with_head_timeout(seconds: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol closing a connection whose request head is ``seconds`` late."""
    return type("HttpToolsProtocolWithHeadTimeout", (_HeadDeadline,), {"head_timeout": seconds})
