"""A cap on the requests the server handles at once: one past it is answered 503 ``server_busy``
with Retry-After at once, rather than queueing for the database pool until every client times
out. Long polls count, so the cap bounds what a crowd of waiting reads can hold."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from pgbroker.http.errors import ApiError, error_response


class ConcurrencyLimit:
    """ASGI middleware: at most ``limit`` HTTP requests inside ``app`` at a time."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            busy = ApiError(
                503,
                "server_busy",
                f"the server is handling {self.limit} requests already",
                hint="Retry after the delay Retry-After gives, or start the server with a higher"
                " --max-concurrency.",
                headers={"Retry-After": "1"},
            )
            await error_response(busy)(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
