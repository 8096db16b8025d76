"""Message types the codec tests share: a Protobuf class (built from a descriptor, as protoc's
output would define it), an Avro schema, and one sample value per codec."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from pgbroker import codecs
from pgbroker.codecs import AvroCodec

PROTO_FILE = "pgbroker_tests/shop.proto"
PROTO_TYPE = "pgbroker_tests.shop.Order"


def _order_class() -> type[Any]:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(PROTO_FILE)
    except KeyError:
        field = descriptor_pb2.FieldDescriptorProto
        proto = descriptor_pb2.FileDescriptorProto(
            name=PROTO_FILE, package="pgbroker_tests.shop", syntax="proto3"
        )
        order = proto.message_type.add(name="Order")
        order.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
        order.field.add(name="item", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
        order.field.add(name="tags", number=3, type=field.TYPE_STRING, label=field.LABEL_REPEATED)
        order.field.add(name="price", number=4, type=field.TYPE_DOUBLE, label=field.LABEL_OPTIONAL)
        pool.Add(proto)
    order_class: type[Any] = message_factory.GetMessageClass(pool.FindMessageTypeByName(PROTO_TYPE))
    return order_class


Order = _order_class()

AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "pgbroker_tests.shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "price", "type": ["null", "double"], "default": None},
    ],
}
AVRO = codecs.register(AvroCodec(AVRO_SCHEMA)).name  # "avro:pgbroker_tests.shop.Order"
PROTOBUF = f"protobuf:{PROTO_TYPE}"


def samples(n: int = 0) -> dict[str, Any]:
    """A value per codec name; ``n`` varies them."""
    return {
        "json": {"id": n, "item": "book", "tags": ["a", "b"]},
        "msgpack": {"id": n, "item": "book", "blob": bytes([0, 255, n % 256]), "tags": ["a"]},
        PROTOBUF: Order(id=n, item="book", tags=["a", "b"], price=9.5),
        AVRO: {"id": n, "item": "book", "tags": ["a", "b"], "price": 9.5},
    }


def stored_codec(stored: Any) -> str:
    """The codec a stored body (pgmq's message column) was written with."""
    return codecs.envelope_codec(stored) if codecs.is_envelope(stored) else "json"
