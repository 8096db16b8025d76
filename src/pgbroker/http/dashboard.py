"""The dashboard and the API reference: static pages, scripts and stylesheets (pgbroker/http/static)
served by the API's own application. The dashboard's script polls /v1/stats with a key the user
types in, and draws its charts as inline SVG; the reference's renders /openapi.json. No CDN, no
third-party code, nothing fetched but this server's own routes.

The strict Content-Security-Policy enforces that: scripts and styles only from this origin, no
inline script, connections only back to this server. So even a message payload shown in the
dead-letter table could not run as script, were it ever inserted as HTML (it is not).
"""

from __future__ import annotations

from importlib import resources

from starlette.responses import Response

_STATIC = resources.files(__package__).joinpath("static")

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

_ASSETS = {
    name: (_STATIC.joinpath(name).read_bytes(), media_type)
    for name, media_type in (
        ("dashboard.html", "text/html; charset=utf-8"),
        ("dashboard.js", "text/javascript; charset=utf-8"),
        ("dashboard.css", "text/css; charset=utf-8"),
        ("docs.html", "text/html; charset=utf-8"),
        ("docs.js", "text/javascript; charset=utf-8"),
        ("docs.css", "text/css; charset=utf-8"),
    )
}


def asset(name: str) -> Response:
    """One of the pages' files, with the security headers."""
    body, media_type = _ASSETS[name]
    return Response(body, media_type=media_type, headers=_HEADERS)
