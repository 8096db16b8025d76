"""Codecs in Spark (pgbroker.spark.bodies): a batch read decodes each codec's bodies (MessagePack
to the JSON text column, Avro and Protobuf to struct columns typed by the schema), the sink encodes
them, a stream does the same, and a bad option or an unreadable body fails saying which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb
from pyspark.errors import PySparkException

from pgbroker import Broker
from tests.spark.helpers import Conn
from tests.support.codec_types import AVRO, AVRO_SCHEMA, PROTOBUF, samples

AVRO_OPTIONS = {"codec": "avro", "avroSchema": json.dumps(AVRO_SCHEMA)}
PROTOBUF_OPTIONS = {"codec": "protobuf", "protobufClass": "tests.support.codec_types:Order"}


def reader(spark: Any, dsn: str, queue: str, **options: str) -> Any:
    return spark.read.format("pgbroker").option("queue", queue).option("dsn", dsn).options(**options)


def write(df: Any, dsn: str, queue: str, **options: str) -> None:
    df.write.format("pgbroker").option("queue", queue).option("dsn", dsn).options(**options).mode(
        "append"
    ).save()


def test_spark_reads_and_writes_every_codec(spark: Any, dsn: str, conn: Conn, tmp_path: Path) -> None:
    with Broker(dsn) as broker:
        for name in ("mixed", "avro_in", "avro_out", "proto_in", "proto_out", "msgpack_out", "stream_out"):
            broker.create_queue(name)
        mixed = broker.queue("mixed")
        mixed.send({"plain": 1})
        mixed.send(samples(1)["msgpack"], codec="msgpack")
        broker.queue("avro_in").send_many([samples(n)[AVRO] for n in (1, 2)], codec=AVRO)
        broker.queue("avro_in").send({"id": 3, "item": "json", "tags": []})  # plain JSON fills by name
        broker.queue("proto_in").send_many([samples(n)[PROTOBUF] for n in (1, 2)], codec=PROTOBUF)

        # JSON and MessagePack: the JSON text column, binary bodies decoded (bytes as base64).
        rows = reader(spark, dsn, "mixed", codec="msgpack").load().orderBy("msg_id").collect()
        assert [json.loads(r.message) for r in rows] == [
            {"plain": 1},
            {**samples(1)["msgpack"], "blob": "AP8B"},
        ]

        # Avro and Protobuf: struct columns typed by the schema.
        avro = reader(spark, dsn, "avro_in", **AVRO_OPTIONS).load()
        assert avro.schema["message"].dataType.simpleString() == (
            "struct<id:bigint,item:string,tags:array<string>,price:double>"
        )
        assert [r.message.asDict() for r in avro.orderBy("msg_id").collect()] == [
            samples(1)[AVRO],
            samples(2)[AVRO],
            {"id": 3, "item": "json", "tags": [], "price": None},
        ]
        proto = reader(spark, dsn, "proto_in", **PROTOBUF_OPTIONS).load()
        assert proto.schema["message"].dataType.simpleString() == (
            "struct<id:bigint,item:string,tags:array<string>,price:double>"
        )
        assert [r.message.id for r in proto.orderBy("msg_id").collect()] == [1, 2]

        # The sink encodes: structs to Avro and Protobuf, JSON text to MessagePack.
        write(avro.select("message"), dsn, "avro_out", **AVRO_OPTIONS)
        write(proto.select("message"), dsn, "proto_out", **PROTOBUF_OPTIONS)
        write(reader(spark, dsn, "mixed").load().select("message"), dsn, "msgpack_out", codec="msgpack")
        back = broker.queue("avro_out").read_many(10)
        assert {m.codec for m in back} == {AVRO}
        assert sorted((m.message for m in back), key=lambda v: v["id"]) == [
            samples(1)[AVRO],
            samples(2)[AVRO],
            {"id": 3, "item": "json", "tags": [], "price": None},
        ]
        assert sorted((m.message for m in broker.queue("proto_out").read_many(10)), key=lambda v: v.id) == [
            samples(1)[PROTOBUF],
            samples(2)[PROTOBUF],
        ]
        packed = broker.queue("msgpack_out").read_many(10)
        assert {m.codec for m in packed} == {"msgpack"}
        assert sorted(json.dumps(m.message, sort_keys=True) for m in packed) == sorted(
            # The stored JSON text of the mixed queue, envelope included, went in as MessagePack.
            json.dumps(r[0], sort_keys=True)
            for r in conn.execute("SELECT message FROM pgmq.q_mixed").fetchall()
        )

        # A stream decodes and encodes the same way.
        query = (
            spark.readStream.format("pgbroker")
            .option("dsn", dsn)
            .option("queue", "avro_in")
            .options(**AVRO_OPTIONS)
            .load()
            .select("message")
            .writeStream.format("pgbroker")
            .option("dsn", dsn)
            .option("queue", "stream_out")
            .options(**AVRO_OPTIONS)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert sorted(m.message["id"] for m in broker.queue("stream_out").read_many(10)) == [1, 2, 3]

        # Bad input: an unknown codec fails at load; an unreadable body fails the job, naming it.
        with pytest.raises(PySparkException, match="codec must be one of"):
            reader(spark, dsn, "mixed", codec="xml").load()
        with pytest.raises(PySparkException, match="avroSchema goes with codec=avro"):
            reader(spark, dsn, "mixed", codec="avro").load()
        damaged = conn.execute(
            "SELECT pgmq.send('proto_in', %s)",
            [Jsonb({"$pgbroker": {"codec": PROTOBUF, "content_type": "x", "data": "CgVhYg=="}})],
        ).fetchone()
        assert damaged is not None
        with pytest.raises(PySparkException, match=f"message {damaged[0]}: body is not a"):
            reader(spark, dsn, "proto_in", **PROTOBUF_OPTIONS).load().collect()
