"""`pgbroker send --codec NAME` (and --codec-module for the types only a module of yours defines),
run as real subprocesses; the bodies are checked as stored and as the Python client decodes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pgbroker.queues._client import Broker
from tests.support.cli import Cli, _assert_error, _ids, _messages
from tests.support.codec_types import AVRO, PROTOBUF, stored_codec
from tests.support.tables import Conn, q_rows

# A module the CLI process imports: it registers the Avro schema and defines the Protobuf type.
TYPES_MODULE = "tests.support.codec_types"


def _stored_codecs(conn: Conn, queue: str) -> list[str]:
    return [stored_codec(row[3]) for row in q_rows(conn, queue)]


def test_send_codec_encodes_argument_and_stdin_lines(cli: Cli, orders: str, conn: Conn, dsn: str) -> None:
    cli.ok("send", orders, '{"n": 1}', "--codec", "msgpack")
    cli.ok("send", orders, "--codec", "msgpack", stdin='{"n": 2}\n{"n": 3}\n')
    cli.ok("send", orders, '{"n": 4}', "--codec", "json")
    assert _stored_codecs(conn, orders) == ["msgpack", "msgpack", "msgpack", "json"]
    # `read` shows each body decoded, whatever it was written with.
    read = _messages(cli.ok("read", orders, "--qty", "10"))
    assert [m["message"] for m in read] == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]


def test_send_codec_for_registered_types_needs_their_module(
    cli: Cli, orders: str, conn: Conn, dsn: str
) -> None:
    order = '{"id": 7, "item": "book", "tags": ["a"], "price": 9.5}'
    # Without the module this process knows no such schema: a usage error, nothing sent.
    _assert_error(cli("send", orders, order, "--codec", AVRO), 2, "no Avro schema registered", "register")
    _assert_error(
        cli("send", orders, order, "--codec", "avro:x", "--codec-module", "no_such_module_here"),
        2,
        "cannot import codec module 'no_such_module_here'",
        "PYTHONPATH",
    )
    _assert_error(cli("send", orders, order, "--codec", "msgpak"), 2, "unknown codec 'msgpak'")
    assert q_rows(conn, orders) == []

    avro_id = _ids(cli.ok("send", orders, order, "--codec", AVRO, "--codec-module", TYPES_MODULE))
    proto_id = _ids(cli.ok("send", orders, order, "--codec", PROTOBUF, "--codec-module", TYPES_MODULE))
    # A value the schema refuses is refused before anything is stored.
    _assert_error(
        cli("send", orders, '{"id": "x"}', "--codec", AVRO, "--codec-module", TYPES_MODULE), 2, "id"
    )
    assert _stored_codecs(conn, orders) == [AVRO, PROTOBUF]
    with Broker(dsn) as broker:
        got = broker.queue(orders).read_many(10)
    assert [m.msg_id for m in got] == avro_id + proto_id
    assert [m.codec for m in got] == [AVRO, PROTOBUF]
    assert got[0].message == {"id": 7, "item": "book", "tags": ["a"], "price": 9.5}
    assert (got[1].message.id, got[1].message.item, list(got[1].message.tags)) == (7, "book", ["a"])


def test_serve_stops_on_a_codec_module_it_cannot_import(cli: Cli) -> None:
    # Before serving anything: a server that would answer unknown_codec for every Avro send.
    _assert_error(
        cli("serve", "--port", "0", "--codec-module", "no_such_module_here"),
        2,
        "cannot import codec module 'no_such_module_here'",
    )


def test_a_codec_module_is_found_in_the_current_directory_as_a_worker_s_handlers_are(
    orders: str, conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """An installed `pgbroker` script does not put the current directory on the import path
    (python -P here), so --codec-module shop_codecs beside the user was 'No module named'
    unless PYTHONPATH said '.', while pgbroker worker shop:app found shop.py there."""
    (tmp_path / "shop_codecs.py").write_text(
        "from pgbroker.codecs import AvroCodec, register\n"
        "register(AvroCodec({'type': 'record', 'name': 'Order', 'namespace': 'shop',\n"
        "    'fields': [{'name': 'id', 'type': 'long'}]}))\n"
    )
    argv = ["send", orders, '{"id": 1}', "--codec", "avro:shop.Order", "--codec-module", "shop_codecs"]
    done = subprocess.run(
        [sys.executable, "-P", "-m", "pgbroker.cli", "--dsn", dsn, *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert _stored_codecs(conn, orders) == ["avro:shop.Order"]
