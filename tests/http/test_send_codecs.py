"""POST /v1/queues/{queue}/messages with ``codec``: the value comes as JSON, the server encodes it;
a codec the server does not know is a 400 whose hint says how to make it known there."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest

from tests.support.codec_types import AVRO, PROTOBUF, stored_codec
from tests.support.http import auth, make_queue
from tests.support.tables import q_rows

pytestmark = pytest.mark.anyio

ORDER = {"id": 7, "item": "book", "tags": ["a"], "price": 9.5}


def _stored_codecs(conn: psycopg.Connection[Any], queue: str) -> list[str]:
    return [stored_codec(r[3]) for r in q_rows(conn, queue)]


async def test_send_chooses_the_codec(
    client: httpx.AsyncClient, keys: dict[str, str], conn: psycopg.Connection[Any]
) -> None:
    await make_queue(client, keys["admin"])
    both = auth(keys["both"])
    sends: list[dict[str, Any]] = [
        {"message": {"n": 1}, "codec": "msgpack"},
        {"messages": [ORDER, ORDER], "codec": AVRO},  # the tests registered the schema in this process
        {"message": ORDER, "codec": PROTOBUF},
        {"message": {"n": 2}},  # the queue's default: JSON
    ]
    for body in sends:
        r = await client.post("/v1/queues/jobs/messages", json=body, headers=both)
        assert r.status_code == 201, r.text
    assert _stored_codecs(conn, "jobs") == ["msgpack", AVRO, AVRO, PROTOBUF, "json"]
    r = await client.post("/v1/queues/jobs/read", json={"qty": 10}, headers=both)
    shown = [m["message"] for m in r.json()["messages"]]
    assert shown[:3] == [{"n": 1}, ORDER, ORDER]
    assert shown[3]["item"] == "book"
    assert shown[4] == {"n": 2}


async def test_unknown_codec_or_value_is_a_clear_400_and_sends_nothing(
    client: httpx.AsyncClient, keys: dict[str, str], conn: psycopg.Connection[Any]
) -> None:
    await make_queue(client, keys["admin"])
    both = auth(keys["both"])
    r = await client.post(
        "/v1/queues/jobs/messages", json={"message": ORDER, "codec": "avro:shop.Unknown"}, headers=both
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "unknown_codec"
    assert "avro:shop.Unknown" in error["message"]
    assert "pgbroker serve --codec-module" in error["hint"]
    r = await client.post(
        "/v1/queues/jobs/messages", json={"message": ORDER, "codec": "msgpak"}, headers=both
    )
    assert (r.status_code, r.json()["error"]["code"]) == (400, "unknown_codec")
    # A value the schema refuses: the whole batch is refused.
    r = await client.post(
        "/v1/queues/jobs/messages", json={"messages": [ORDER, {"id": "x"}], "codec": AVRO}, headers=both
    )
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_message"), r.text
    r = await client.post("/v1/queues/jobs/messages", json={"message": 1, "codec": ""}, headers=both)
    assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_body")
    assert q_rows(conn, "jobs") == []
