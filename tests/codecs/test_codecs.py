"""pgbroker.codecs without a database: round trips, content types, the stored envelope, the
bodies passed through for bridges, and the typed errors of bad values, bytes and names."""

from __future__ import annotations

import base64
import sys
from typing import Any

import pytest

from pgbroker import codecs
from pgbroker.codecs import (
    AvroCodec,
    CodecNotInstalled,
    CodecRegistry,
    CorruptBody,
    EncodeError,
    MsgpackCodec,
    ProtobufCodec,
    UnknownCodec,
)
from pgbroker.errors import InvalidMessage
from tests.support.codec_types import AVRO, AVRO_SCHEMA, PROTO_TYPE, PROTOBUF, Order, samples

CODECS = list(samples())


@pytest.mark.parametrize("name", CODECS)
def test_every_codec_round_trips_bytes_and_the_stored_form(name: str) -> None:
    value = samples(7)[name]
    data, content_type = codecs.encode(value, name)
    assert isinstance(data, bytes)
    assert codecs.decode(data, content_type) == value
    assert codecs.codec_name(content_type) == name
    stored = codecs.to_stored(value, name)
    assert codecs.from_stored(stored) == codecs.Decoded(value, name)


def test_a_json_body_is_stored_as_itself_and_a_binary_one_in_a_documented_envelope() -> None:
    assert codecs.to_stored({"a": 1}) == {"a": 1}
    stored = codecs.to_stored({"a": 1}, "msgpack")
    assert stored == {
        "$pgbroker": {
            "codec": "msgpack",
            "content_type": "application/msgpack",
            "data": base64.b64encode(MsgpackCodec().encode({"a": 1})).decode(),
        }
    }


def test_content_types_name_the_message_type() -> None:
    assert codecs.get("json").content_type == "application/json"
    assert codecs.get("msgpack").content_type == "application/msgpack"
    assert codecs.get(PROTOBUF).content_type == f"application/x-protobuf; messageType={PROTO_TYPE}"
    assert codecs.get(AVRO).content_type == "application/avro; type=pgbroker_tests.shop.Order"
    # What other producers send: parameters quoted, other spellings of the media type.
    assert codecs.codec_name(f'application/protobuf; messageType="{PROTO_TYPE}"') == PROTOBUF
    assert codecs.codec_name("application/vnd.msgpack") == "msgpack"
    assert codecs.codec_name("application/json; charset=utf-8") == "json"


def test_avro_bodies_are_single_object_encoded_with_the_schema_fingerprint() -> None:
    data, _ = codecs.encode(samples()[AVRO], AVRO)
    assert data[:2] == b"\xc3\x01"
    other = AvroCodec({**AVRO_SCHEMA, "fields": AVRO_SCHEMA["fields"][:2]})  # same name, another schema
    with pytest.raises(CorruptBody, match="another Avro schema"):
        other.decode(data)


def test_protobuf_takes_messages_or_dicts_and_resolves_imported_types_by_name() -> None:
    registry = CodecRegistry()  # nothing registered: found in the default descriptor pool
    codec = registry.get(PROTOBUF)
    assert isinstance(codec, ProtobufCodec)
    assert codec.decode(codec.encode({"id": 3, "item": "pen"})) == Order(id=3, item="pen")


def test_bridges_pass_binary_bodies_through_without_decoding() -> None:
    stored = codecs.to_stored(samples()[AVRO], AVRO)
    data, content_type = codecs.wire_body(stored)
    assert codecs.decode(data, content_type) == samples()[AVRO]
    unregistered = CodecRegistry()  # a bridge needs no schema to carry the bytes back in
    assert codecs.stored_from_wire(data, content_type) == stored
    with pytest.raises(UnknownCodec):
        unregistered.from_stored(stored)
    assert codecs.wire_body({"a": 1}) == (b'{"a":1}', "application/json")
    assert codecs.stored_from_wire(b'{"a":1}', None) == {"a": 1}


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("json", {"x": float("nan")}, "not JSON-serialisable"),
        ("json", {"x": b"bytes"}, "not JSON-serialisable"),
        ("msgpack", {"x": object()}, "MessagePack"),
        (PROTOBUF, {"id": "not a number"}, "does not fit"),
        (PROTOBUF, 42, "takes pgbroker_tests.shop.Order messages"),
        (AVRO, {"id": 1}, "does not match the Avro schema"),
        (AVRO, {"id": "x", "item": "a", "tags": []}, "does not match"),
    ],
)
def test_a_value_the_codec_cannot_encode_is_an_encode_error(name: str, value: Any, match: str) -> None:
    with pytest.raises(EncodeError, match=match) as caught:
        codecs.to_stored(value, name)
    assert isinstance(caught.value, InvalidMessage)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("json", b"{not json"),
        ("msgpack", b"\xc1"),  # a byte MessagePack never uses
        ("msgpack", b"\x92\x01"),  # an array of two with one element
        (PROTOBUF, b"\x0a\x05ab"),  # a string field cut short
        (AVRO, b"\x00\x01garbage"),  # no single-object marker
    ],
)
def test_bytes_the_codec_cannot_read_are_a_corrupt_body(name: str, data: bytes) -> None:
    with pytest.raises(CorruptBody):
        codecs.get(name).decode(data)


def test_a_truncated_avro_body_is_a_corrupt_body() -> None:
    data, _ = codecs.encode(samples()[AVRO], AVRO)
    with pytest.raises(CorruptBody):
        codecs.get(AVRO).decode(data[:-3])
    with pytest.raises(CorruptBody, match="after its"):
        codecs.get(AVRO).decode(data + b"\x00")


@pytest.mark.parametrize(
    "stored",
    [
        {"$pgbroker": "not an object"},
        {"$pgbroker": {"codec": "msgpack", "content_type": "application/msgpack"}},
        {"$pgbroker": {"codec": "msgpack", "content_type": "application/msgpack", "data": "***"}},
        {"$pgbroker": {"codec": "msgpack", "content_type": "application/msgpack", "data": "wQ=="}},
    ],
)
def test_a_damaged_envelope_is_a_corrupt_body(stored: Any) -> None:
    with pytest.raises(CorruptBody):
        codecs.from_stored(stored)


@pytest.mark.parametrize(
    "name", ["cbor", "avro:not.Registered", "protobuf:not.a.Type", "protobuf:", "MSGPACK", ""]
)
def test_an_unknown_codec_name_says_how_to_make_it_known(name: str) -> None:
    with pytest.raises(UnknownCodec) as caught:
        codecs.get(name)
    assert caught.value.hint


def test_unknown_content_types_and_non_codecs_are_refused() -> None:
    with pytest.raises(UnknownCodec, match="text/plain"):
        codecs.decode(b"hello", "text/plain")
    with pytest.raises(UnknownCodec, match="messageType"):
        codecs.codec_name("application/x-protobuf")  # which type?
    with pytest.raises(UnknownCodec):
        CodecRegistry().register("msgpack")  # type: ignore[arg-type]
    with pytest.raises(UnknownCodec, match="named schema"):
        AvroCodec({"type": "array", "items": "long"})
    with pytest.raises(UnknownCodec, match="not a valid Avro schema"):
        AvroCodec('{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}')
    with pytest.raises(UnknownCodec, match="not a Protobuf message class"):
        ProtobufCodec(dict)


def test_a_missing_library_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "msgpack", None)  # what Python does for a package not installed
    with pytest.raises(CodecNotInstalled) as caught:
        CodecRegistry().get("msgpack")
    assert "pgbroker[codecs]" in str(caught.value)
    assert "msgpack" in caught.value.message


def test_json_view_shows_decoded_values_in_their_json_form() -> None:
    value = {"blob": b"\x00\xff", "order": Order(id=2, item="pen", tags=["x"]), "n": [1, (2, 3)]}
    assert codecs.json_view(value) == {
        "blob": "AP8=",
        "order": {"id": 2, "item": "pen", "tags": ["x"], "price": 0.0},
        "n": [1, [2, 3]],
    }
