"""The service's own pages, open to anybody: health, this API's OpenAPI spec, and the dashboard
(which asks for a key in the browser)."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from pgbroker import _sql as sql
from pgbroker.http.dashboard import asset
from pgbroker.http.models import Health
from pgbroker.http.operations import Call, Router

router = Router()


@router.get(
    "/healthz", "the server and its database are up", access="public", errors={503: "database unavailable"}
)
async def healthz(call: Call) -> Health:
    async with call.broker.connection() as conn:
        await conn.execute(sql.queries("http")["health_check"])
    return Health(status="ok")


@router.get("/openapi.json", "this document", access="public", answer_schema={"type": "object"})
async def openapi(call: Call) -> Response:
    return JSONResponse(call.state.spec)


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
