"""The service's own pages, open to anybody: health, this API's OpenAPI spec and its reference
page, and the dashboard (which asks for a key in the browser); / leads to the dashboard."""

from __future__ import annotations

from starlette.responses import HTMLResponse, JSONResponse, Response

from pgbroker import _sql as sql
from pgbroker._db.liveness import answered_within
from pgbroker.http.dashboard import asset
from pgbroker.http.models import Health
from pgbroker.http.operations import Call, Router

router = Router()

# /healthz gives up on a database that has not answered its SELECT 1 within this long (a hung
# server, a stuck pooler, a network that drops packets without a word) and answers 503: a probe
# used to wait for as long as the hang lasted, holding a pooled connection. The connection given up
# is closed, so the pool replaces it.
HEALTH_ANSWER_WITHIN = 10.0


@router.get(
    "/healthz", "the server and its database are up", access="public", errors={503: "database unavailable"}
)
async def healthz(call: Call) -> Health:
    async with call.broker.connection() as conn:
        await answered_within(HEALTH_ANSWER_WITHIN, conn.execute(sql.queries("http")["health_check"]))
    return Health(status="ok")


@router.get("/openapi.json", "this document", access="public", answer_schema={"type": "object"})
async def openapi(call: Call) -> Response:
    return JSONResponse(call.state.spec)


@router.get(
    "/",
    "leads to the dashboard (a redirect)",
    access="public",
    status=307,
    media_type="text/html",
)
async def root(call: Call) -> Response:
    # A body too, for a client that does not follow redirects.
    page = '<!doctype html><title>pgbroker</title><a href="/dashboard">dashboard</a> <a href="/docs">API</a>'
    return HTMLResponse(page, status_code=307, headers={"Location": "/dashboard"})


@router.get(
    "/docs", "the API reference, rendered from /openapi.json", access="public", media_type="text/html"
)
async def docs(call: Call) -> Response:
    return asset("docs.html")


@router.get("/docs/app.js", "the API reference's script", access="public", media_type="text/javascript")
async def docs_script(call: Call) -> Response:
    return asset("docs.js")


@router.get("/docs/app.css", "the API reference's stylesheet", access="public", media_type="text/css")
async def docs_stylesheet(call: Call) -> Response:
    return asset("docs.css")


@router.get(
    "/dashboard",
    "the dashboard page (asks for a key in the browser)",
    access="public",
    media_type="text/html",
)
async def dashboard(call: Call) -> Response:
    return asset("dashboard.html")


@router.get("/dashboard/app.js", "the dashboard's script", access="public", media_type="text/javascript")
async def dashboard_script(call: Call) -> Response:
    return asset("dashboard.js")


@router.get("/dashboard/app.css", "the dashboard's stylesheet", access="public", media_type="text/css")
async def dashboard_stylesheet(call: Call) -> Response:
    return asset("dashboard.css")
