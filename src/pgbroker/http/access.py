"""Who may call what: a request's API key (a bearer token or X-API-Key), its rate limit and its
scope on a queue, each refusal answered with its own error (401, 429, 403)."""

from __future__ import annotations

import math

from starlette.requests import Request

from pgbroker._db.api_keys import ApiKey
from pgbroker.http.auth import FailureLimiter, KeyStore, RateLimiter
from pgbroker.http.errors import ApiError


def token_of(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.headers.get("x-api-key") or None


async def authenticate(
    request: Request, keys: KeyStore, limiter: RateLimiter, failures: FailureLimiter
) -> ApiKey:
    """The request's live key, charged one request against its rate limit. An address whose
    keys failed too often gets a 429 for any key the server would have to look up."""
    token = token_of(request)
    if token is None:
        raise ApiError(
            401,
            "unauthorized",
            _why_no_token(request),
            hint="Send 'Authorization: Bearer <token>' (create one with `pgbroker keys create`).",
            headers={"WWW-Authenticate": "Bearer"},
        )
    address = request.client.host if request.client else ""
    if not keys.knows(token):
        _refuse_if_limited(failures.wait(address), "too many failed API keys from this address")
    key = await keys.authenticate(token)
    if key is None:
        failures.charge(address)
        raise ApiError(
            401, "unauthorized", "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"}
        )
    # Charged before any scope check: a key probing what it may do is still rate limited.
    _refuse_if_limited(limiter.take(key), f"rate limit of key {key.name!r} exceeded")
    return key


def _why_no_token(request: Request) -> str:
    given = request.headers.get("authorization", "").strip()
    if not given:
        return "no API key given"
    scheme = given.split()[0]
    if scheme.lower() == "bearer":
        return "the Authorization header's bearer token is empty"
    return f"the Authorization header is of scheme {scheme[:20]!r}, not Bearer"


def _refuse_if_limited(wait: float, message: str) -> None:
    if wait > 0:
        raise ApiError(429, "rate_limited", message, headers={"Retry-After": str(max(1, math.ceil(wait)))})


def require(key: ApiKey, scope: str, queue: str | None) -> None:
    """403 unless ``key`` may do ``scope`` on ``queue`` (None: on no one queue)."""
    if not key.allows(scope, queue):
        target = f" on queue {queue!r}" if queue is not None else ""
        raise ApiError(403, "forbidden", f"key {key.name!r} may not {scope}{target}")
