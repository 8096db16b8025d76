"""The OpenAPI 3.1 description of the REST API, written out by hand next to the routes it
describes (pgbroker.http.app); tests/http checks that the two list the same operations."""

from __future__ import annotations

import re
from typing import Any

from pgbroker.http.errors import ERROR_CODES

_INT32 = 2**31 - 1


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, **_json(_ref("Error"))}


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


_COMMON_ERRORS = {
    "401": _error("no key, or an invalid or revoked key (code unauthorized)"),
    "403": _error("the key lacks the scope or the queue (code forbidden)"),
    "429": _error("the key's rate limit is exceeded (code rate_limited; see Retry-After)"),
    "503": _error("database unavailable or pgbroker not installed"),
}
_BODY_ERRORS = {
    "400": _error("invalid JSON, queue name or argument"),
    "413": _error("request body too large (request_too_large) or message too large"),
    "422": _error("the body has the wrong shape (invalid_body)"),
}
# The names every pgbroker accepts: letters, digits, _ and - (never two - in a row: SQL's comment),
# at most 47. The server takes some others too (non-ASCII letters, up to 47 bytes); the spec
# promises the portable set.
QUEUE_NAME_PATTERN = "^-?[A-Za-z0-9_]+(-[A-Za-z0-9_]+)*-?$"
QUEUE_NAME_MAX = 47
QUEUE_NAME = {"type": "string", "pattern": QUEUE_NAME_PATTERN, "maxLength": QUEUE_NAME_MAX}
_QUEUE_PARAM = {
    "name": "queue",
    "in": "path",
    "required": True,
    "schema": QUEUE_NAME,
    "example": "orders",
}
_RECEIPT = {
    "type": "string",
    "pattern": "^[0-9]{1,18}:[0-9]{1,9}:-?[0-9]{1,18}$",
    "description": "<msg_id>:<read_ct>:<lease>, exactly as a read returned it",
}
_NUL_FREE = {"type": "string", "pattern": "^[^\\u0000]*$"}
_MSG_ID = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}


def _op(
    summary: str,
    scope: str | None,
    ok: tuple[str, dict[str, Any]],
    *,
    body: dict[str, Any] | None = None,
    body_required: bool = True,
    queue: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status, schema = ok
    op: dict[str, Any] = {
        "summary": summary,
        "description": f"Needs a key with scope {scope!r} (admin implies every scope)."
        if scope
        else "Needs any valid key.",
        "responses": {status: {"description": "success", **_json(schema)}, **_COMMON_ERRORS},
    }
    if queue:
        op["parameters"] = [_QUEUE_PARAM]
        op["responses"]["404"] = _error("queue_not_found")
        op["responses"]["400"] = _error("invalid_queue_name, or an invalid argument")
    if body is not None:
        op["requestBody"] = {"required": body_required, **_json(body)}
        op["responses"].update(_BODY_ERRORS)
    op["responses"].update(extra or {})
    return op


def _static(summary: str, media_type: str) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "security": [],
            "responses": {
                "200": {"description": media_type, "content": {media_type: {"schema": {"type": "string"}}}}
            },
        }
    }


def _query_int(name: str, description: str, lo: int, hi: int, default: int) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": "integer", "minimum": lo, "maximum": hi, "default": default},
    }


def _link_queue_operations(paths: dict[str, Any]) -> None:
    """Links from a created queue to every operation on a queue (a client, or a stateful test,
    can follow them with the name the create returned)."""
    created = paths["/v1/queues"]["post"]["responses"]["201"]
    created["links"] = {
        re.sub(r"[^A-Za-z0-9]+", "_", f"{method}{path}").strip("_"): {
            "operationRef": "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method,
            "parameters": {"queue": "$response.body#/queue_name"},
        }
        for path, operations in paths.items()
        if "{queue}" in path
        for method in operations
    }


def openapi_spec(max_batch: int, max_wait_seconds: float) -> dict[str, Any]:
    """The spec, with the server's limits in it."""

    def by_receipt(extra: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
        """A body with one receipt (a stale one answers 409) or a batch (stale ones are listed)."""
        single = {"receipt": _RECEIPT, **extra}
        batch = {
            "receipts": {"type": "array", "items": _RECEIPT, "minItems": 1, "maxItems": max_batch},
            **extra,
        }
        return {
            "oneOf": [
                {**_obj(single, ("receipt", *required)), "not": {"required": ["receipts"]}},
                {**_obj(batch, ("receipts", *required)), "not": {"required": ["receipt"]}},
            ]
        }

    stale_409 = {"409": _error("stale_receipt (single receipt form only)")}
    headers = {"anyOf": [_ref("JsonObject"), {"type": "null"}], "description": "the message's headers"}
    message = {**_ref("JsonValue"), "description": "any JSON value jsonb can store (no NUL character)"}
    delay = {"delay": {"type": "integer", "minimum": 0, "maximum": _INT32, "default": 0}}
    msg_ids = _obj(
        {
            "msg_ids": {
                "type": "array",
                "items": _MSG_ID,
                "minItems": 1,
                "maxItems": max_batch,
            }
        },
        ("msg_ids",),
    )
    ids = {"type": "array", "items": {"type": "integer"}}
    stale = {"type": "array", "items": {"type": "string"}}
    paths: dict[str, Any] = {
        "/v1/queues": {
            "get": _op(
                "list the queues the key can see",
                None,
                ("200", _obj({"queues": {"type": "array", "items": _ref("QueueInfo")}})),
                queue=False,
            ),
            "post": _op(
                "create a queue (idempotent)",
                "admin",
                ("201", _obj({"queue_name": {"type": "string"}})),
                body=_obj(
                    {
                        "name": QUEUE_NAME,
                        "unlogged": {"type": "boolean", "default": False},
                        "notify": {"type": "boolean", "default": True},
                    },
                    ("name",),
                ),
                queue=False,
                extra={"409": _error("queue_name_conflict")},
            ),
        },
        "/v1/queues/{queue}": {
            "delete": _op(
                "drop a queue and its archive", "admin", ("200", _obj({"dropped": {"type": "string"}}))
            ),
        },
        "/v1/queues/{queue}/metrics": {
            "get": _op("exact lengths and ages of one queue", "read", ("200", _ref("Metrics"))),
        },
        "/v1/queues/{queue}/messages": {
            "post": _op(
                "send one message (message) or a batch (messages)",
                "send",
                ("201", _obj({"msg_ids": ids})),
                body={
                    "description": "With messages, headers (when given) has one entry per message.",
                    "oneOf": [
                        {
                            **_obj(
                                {"message": message, "headers": headers, **delay},
                                ("message",),
                            ),
                            "not": {"required": ["messages"]},
                        },
                        {
                            **_obj(
                                {
                                    "messages": {
                                        "type": "array",
                                        "items": message,
                                        "minItems": 1,
                                        "maxItems": max_batch,
                                    },
                                    "headers": {"type": ["array", "null"], "items": headers},
                                    **delay,
                                },
                                ("messages",),
                            ),
                            "not": {"required": ["message"]},
                        },
                    ],
                },
                extra={"503": _error("queue_full (max_depth reached; see Retry-After) or database error")},
            ),
        },
        "/v1/queues/{queue}/read": {
            "post": _op(
                "lease up to qty visible messages for vt seconds, waiting up to wait seconds",
                "read",
                ("200", _obj({"messages": {"type": "array", "items": _ref("Message")}})),
                body=_obj(
                    {
                        "vt": {"type": "integer", "minimum": 0, "maximum": _INT32, "default": 30},
                        "qty": {"type": "integer", "minimum": 1, "maximum": max_batch, "default": 1},
                        "wait": {"type": "number", "minimum": 0, "maximum": max_wait_seconds, "default": 0},
                    }
                ),
                body_required=False,
            ),
        },
        "/v1/queues/{queue}/ack": {
            "post": _op(
                "acknowledge by receipt",
                "read",
                ("200", _obj({"acked": ids, "stale": stale})),
                body=by_receipt({"archive": {"type": "boolean", "default": True}}),
                extra=stale_409,
            ),
        },
        "/v1/queues/{queue}/nack": {
            "post": _op(
                "give messages back, visible after delay seconds",
                "read",
                ("200", _obj({"nacked": ids, "stale": stale})),
                body=by_receipt(delay),
                extra=stale_409,
            ),
        },
        "/v1/queues/{queue}/extend": {
            "post": _op(
                "extend leases to vt seconds from now; returns the new receipts by msg_id",
                "read",
                (
                    "200",
                    _obj(
                        {
                            "receipts": {"type": "object", "additionalProperties": {"type": "string"}},
                            "stale": stale,
                        }
                    ),
                ),
                body=by_receipt({"vt": {"type": "integer", "minimum": 0, "maximum": _INT32}}, ("vt",)),
                extra=stale_409,
            ),
        },
        "/v1/queues/{queue}/archive": {
            "post": _op(
                "archive messages by msg_id (unfenced)",
                "read",
                ("200", _obj({"archived": ids})),
                body=msg_ids,
            ),
        },
        "/v1/queues/{queue}/delete": {
            "post": _op(
                "delete messages by msg_id (unfenced)", "read", ("200", _obj({"deleted": ids})), body=msg_ids
            ),
        },
        "/v1/queues/{queue}/purge": {
            "post": _op(
                "delete every message of the queue", "admin", ("200", _obj({"purged": {"type": "integer"}}))
            ),
        },
        "/v1/queues/{queue}/dead-letters": {
            "get": {
                **_op(
                    "the queue's dead letters, oldest first (headers say why: x-pgbroker-dead-letter)",
                    "read",
                    ("200", _obj({"messages": {"type": "array", "items": _ref("Message")}})),
                    extra={"422": _error("limit or after out of range (invalid_query)")},
                ),
                "parameters": [
                    _QUEUE_PARAM,
                    _query_int("limit", "at most this many", 1, max_batch, 100),
                    _query_int("after", "only dead letters with a larger id (paging)", 0, 2**63 - 1, 0),
                ],
            },
        },
        "/v1/queues/{queue}/dead-letters/replay": {
            "post": _op(
                "send dead letters back to their queue as new messages: all, or those of msg_ids",
                "admin",
                (
                    "200",
                    _obj(
                        {
                            "replayed": {
                                "type": "array",
                                "items": _obj(
                                    {"dead_letter_id": {"type": "integer"}, "msg_id": {"type": "integer"}}
                                ),
                            }
                        }
                    ),
                ),
                body=_obj({"msg_ids": msg_ids["properties"]["msg_ids"]}),
                body_required=False,
                extra={"503": _error("queue_full (max_depth reached; see Retry-After) or database error")},
            ),
        },
        "/v1/stats": {
            "get": _op(
                "cheap statistics of the queues the key can see (the dashboard's feed)",
                None,
                ("200", _obj({"queues": {"type": "array", "items": _ref("QueueStats")}})),
                queue=False,
            ),
        },
        "/v1/key": {
            "get": _op(
                "the calling key: its name, scopes and queue patterns",
                None,
                (
                    "200",
                    _obj(
                        {
                            "name": {"type": "string"},
                            "scopes": {"type": "array", "items": {"type": "string"}},
                            "queues": {"type": "array", "items": {"type": "string"}},
                        }
                    ),
                ),
                queue=False,
            ),
        },
        "/metrics": {
            "get": {
                "summary": "queue statistics in the Prometheus text format",
                "responses": {
                    "200": {
                        "description": "exposition text",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_COMMON_ERRORS,
                },
            },
        },
        "/healthz": {
            "get": {
                "summary": "the server and its database are up",
                "security": [],
                "responses": {
                    "200": {"description": "ok", **_json(_obj({"status": {"type": "string"}}))},
                    "503": _error("database unavailable"),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "this document",
                "security": [],
                "responses": {"200": {"description": "the spec", **_json({"type": "object"})}},
            }
        },
        "/dashboard": _static("the dashboard page (asks for a key in the browser)", "text/html"),
        "/dashboard/app.js": _static("the dashboard's script", "text/javascript"),
        "/dashboard/app.css": _static("the dashboard's stylesheet", "text/css"),
    }
    _link_queue_operations(paths)
    ts = {"type": "string", "format": "date-time"}
    nullable_ts = {"type": ["string", "null"], "format": "date-time"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "pgbroker", "version": "1", "description": "Queues inside PostgreSQL, over HTTP."},
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
            "schemas": {
                # JSON as PostgreSQL's jsonb takes it: the NUL character is the one thing it refuses.
                "JsonValue": {
                    "anyOf": [
                        _NUL_FREE,
                        {"type": ["number", "boolean", "null"]},
                        {"type": "array", "items": _ref("JsonValue")},
                        _ref("JsonObject"),
                    ]
                },
                "JsonObject": {
                    "type": "object",
                    "propertyNames": _NUL_FREE,
                    "additionalProperties": _ref("JsonValue"),
                },
                "Error": _obj(
                    {
                        "error": _obj(
                            {
                                "code": {"type": "string", "enum": sorted(ERROR_CODES)},
                                "message": {"type": "string"},
                                "hint": {"type": "string"},
                            },
                            ("code", "message"),
                        )
                    },
                    ("error",),
                ),
                "Message": _obj(
                    {
                        "msg_id": {"type": "integer"},
                        "read_ct": {"type": "integer"},
                        "enqueued_at": ts,
                        "last_read_at": nullable_ts,
                        "vt": ts,
                        "message": {},
                        "headers": {"type": ["object", "null"]},
                        "receipt": {"type": ["string", "null"]},
                    },
                    ("msg_id", "read_ct", "enqueued_at", "vt", "message", "receipt"),
                ),
                "QueueInfo": _obj(
                    {
                        "queue_name": {"type": "string"},
                        "is_partitioned": {"type": "boolean"},
                        "is_unlogged": {"type": "boolean"},
                        "created_at": ts,
                    }
                ),
                "QueueStats": _obj(
                    {
                        "queue_name": {"type": "string"},
                        "queue_length": {"type": "integer"},
                        "visible_length": {"type": "integer"},
                        "length_is_estimate": {"type": "boolean"},
                        "oldest_msg_age_sec": {"type": ["number", "null"]},
                        "newest_msg_age_sec": {"type": ["number", "null"]},
                        "total_sent": {"type": "integer"},
                        "dead_letter_length": {"type": ["integer", "null"]},
                        "scrape_time": ts,
                        "total_consumed": {"type": "integer"},
                    }
                ),
                "Metrics": _obj(
                    {
                        "queue_name": {"type": "string"},
                        "queue_length": {"type": "integer"},
                        "newest_msg_age_sec": {"type": ["integer", "null"]},
                        "oldest_msg_age_sec": {"type": ["integer", "null"]},
                        "total_messages": {"type": "integer"},
                        "scrape_time": ts,
                        "queue_visible_length": {"type": "integer"},
                        "default_partition_length": {"type": ["integer", "null"]},
                    }
                ),
            },
        },
    }
