"""The OpenAPI 3.1 spec of the REST API, derived from the declared operations
(pgbroker.http.operations) and their models (pgbroker.http.models): nothing here describes an
operation by hand.

Per operation: its path and method, summary, scope (in words, and as ``x-pgbroker-scope``: send,
read or admin, ``key`` for any valid key, ``none`` for an operation open to anybody), the
queue path parameter, its query parameters, body and answer schemas (pydantic's JSON Schema, the
models shared under components/schemas) and the failures its kind of operation can meet, in the
API's one error shape. The server's limits are written in where the models mark them (Limit).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from pgbroker.http.errors import Error
from pgbroker.http.models import ScheduleName
from pgbroker.http.operations import Operation
from pgbroker.http.settings import Settings
from pgbroker.http.stream_models import GROUP_NAME_PATTERN, STREAM_NAME_PATTERN
from pgbroker.http.validation import (
    BIGINT_MAX,
    DOCUMENT_MARK,
    JSON_SCHEMAS,
    LIMIT_MARK,
    QueueName,
    SchemaWriter,
)

_REF = "#/components/schemas/{model}"


def _error(description: str) -> dict[str, Any]:
    return {"description": description, **_json({"$ref": "#/components/schemas/Error"})}


def _json(schema: Any, media_type: str = "application/json") -> dict[str, Any]:
    return {"content": {media_type: {"schema": schema}}}


# The failures of each kind of operation, beyond those it declares.
_KEYED = {
    401: "no key, or an invalid or revoked key (code unauthorized)",
    403: "the key lacks the scope, the queue or the group (code forbidden)",
    429: "the key's rate limit is exceeded (code rate_limited; see Retry-After)",
    503: "database unavailable or pgbroker not installed",
}
_ON_QUEUE = {404: "queue_not_found", 400: "invalid_queue_name, or an invalid argument"}
_ON_STREAM = {400: "invalid_queue_name: the stream name is empty or holds whitespace or a control character"}
_WITH_BODY = {
    400: "invalid JSON, queue name or argument",
    408: "the body did not arrive in time (request_timeout)",
    413: "request body too large (request_too_large) or message too large",
    422: "the body has the wrong shape (invalid_body)",
}
# The path parameters of the stream operations (pgbroker.http.routes.streams).
_STREAM_PATH_PARAMETERS = (
    ("stream", STREAM_NAME_PATTERN, "clicks"),
    ("group", GROUP_NAME_PATTERN, "billing"),
)
_WITH_QUERY = {422: "a query parameter is out of range (invalid_query)"}


def _access(operation: Operation) -> tuple[str, str]:
    """The operation's x-pgbroker-scope and its description in words."""
    if operation.access == "public":
        return "none", "Needs no key."
    if operation.access == "metrics":
        return "key", "Needs any valid key, unless the server serves /metrics publicly."
    if operation.scope is None:
        return "key", "Needs any valid key."
    return operation.scope, f"Needs a key with scope {operation.scope!r} (admin implies every scope)."


def _document(operation: Operation, schemas: dict[tuple[str, str], Any]) -> dict[str, Any]:
    scope, needs = _access(operation)
    if operation.answer is not None:
        ok = {"description": "success", **_json(schemas[operation.operation_id, "answer"])}
    else:
        ok = {"description": operation.media_type, **_json(operation.answer_schema, operation.media_type)}
    failures: dict[int, str] = {}
    if operation.access != "public":
        failures.update(_KEYED)
    if operation.on_queue:
        failures.update(_ON_QUEUE)
    if "{stream}" in operation.path:
        failures.update(_ON_STREAM)
    if operation.body is not None:
        failures.update(_WITH_BODY)
    if operation.query is not None:
        failures.update(_WITH_QUERY)
    failures.update(operation.errors)
    document: dict[str, Any] = {
        "operationId": operation.operation_id,
        "summary": operation.summary,
        "description": needs,
        "x-pgbroker-scope": scope,
        "responses": {
            str(operation.status): ok,
            **{str(status): _error(text) for status, text in sorted(failures.items())},
        },
    }
    if operation.access == "public":
        document["security"] = []
    parameters = []
    if operation.on_queue:
        queue_name = TypeAdapter(QueueName).json_schema(schema_generator=SchemaWriter)
        parameters.append(
            {"name": "queue", "in": "path", "required": True, "schema": queue_name, "example": "orders"}
        )
    if "{name}" in operation.path:  # a schedule's (routes/schedules.py)
        schedule_name = TypeAdapter(ScheduleName).json_schema(schema_generator=SchemaWriter)
        parameters.append(
            {"name": "name", "in": "path", "required": True, "schema": schedule_name, "example": "nightly"}
        )
    if "{msg_id}" in operation.path:  # a dead letter's (routes/dead_letters.py)
        msg_id = {"type": "integer", "minimum": 1, "maximum": BIGINT_MAX}
        parameters.append({"name": "msg_id", "in": "path", "required": True, "schema": msg_id, "example": 42})
    for name, pattern, example in _STREAM_PATH_PARAMETERS:
        if "{" + name + "}" in operation.path:
            schema = {"type": "string", "pattern": pattern}
            parameters.append(
                {"name": name, "in": "path", "required": True, "schema": schema, "example": example}
            )
    if operation.query is not None:
        query = operation.query.json_schema(schema_generator=SchemaWriter)
        for name, schema in query["properties"].items():
            description = schema.pop("description", None)
            parameter = {"name": name, "in": "query", "required": name in query.get("required", ())}
            if description:
                parameter["description"] = description
            parameters.append({**parameter, "schema": schema})
    for name, description in operation.headers.items():
        text = {"type": "string", "minLength": 1, "maxLength": 255}
        parameters.append(
            {"name": name, "in": "header", "required": False, "description": description, "schema": text}
        )
    if parameters:
        document["parameters"] = parameters
    if operation.body is not None:
        document["requestBody"] = {
            "required": operation.body_required,
            **_json(schemas[operation.operation_id, "body"]),
        }
    return document


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


def _resolve_marks(node: Any, settings: Settings) -> None:
    """Write every Limit mark as the bound of the server's setting, and every JSON document mark
    as the reference to its schema."""
    if isinstance(node, list):
        for item in node:
            _resolve_marks(item, settings)
    elif isinstance(node, dict):
        setting = node.pop(LIMIT_MARK, None)
        if setting is not None:
            node["maxItems" if node.get("type") == "array" else "maximum"] = getattr(settings, setting)
        document = node.pop(DOCUMENT_MARK, None)
        if document is not None:
            node["$ref"] = _REF.format(model=document)
        for value in node.values():
            _resolve_marks(value, settings)


def openapi_spec(operations: Sequence[Operation], settings: Settings) -> dict[str, Any]:
    """The spec of these operations, with the server's limits in it."""
    inputs: list[tuple[tuple[str, str], Any, TypeAdapter[Any]]] = [
        (("Error", ""), "serialization", TypeAdapter(Error))
    ]
    for operation in operations:
        if operation.body is not None:
            inputs.append(((operation.operation_id, "body"), "validation", operation.body))
        if operation.answer is not None:
            inputs.append(((operation.operation_id, "answer"), "serialization", operation.answer))
    by_input, definitions = TypeAdapter.json_schemas(inputs, ref_template=_REF, schema_generator=SchemaWriter)
    schemas = {key: schema for (key, _), schema in by_input.items()}
    paths: dict[str, Any] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method.lower()] = _document(operation, schemas)
    _link_queue_operations(paths)
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "pgbroker", "version": "1", "description": "Queues inside PostgreSQL, over HTTP."},
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
            "schemas": {**definitions.get("$defs", {}), **JSON_SCHEMAS},
        },
    }
    _resolve_marks(spec, settings)
    _drop_unreferenced(spec["components"]["schemas"], spec)
    return spec


def _drop_unreferenced(schemas: dict[str, Any], spec: dict[str, Any]) -> None:
    """Leave out the definitions nothing refers to (a model written out in place)."""
    while True:
        text = json.dumps(spec)
        unused = [name for name in schemas if f'"{_REF.format(model=name)}"' not in text]
        if not unused:
            return
        for name in unused:
            del schemas[name]
