"""Database roles scoped to queues (sql/functions/15_scopes.sql), used by real LOGIN users: a role
granted a kind on ``orders*`` does that kind on those queues, whatever their letter case, and is
refused (42501) on every other queue, by every entry point, and changes nothing there."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgbroker import Broker
from pgbroker._db.install import (
    grant_queue_access,
    install,
    install_roles,
    list_queue_grants,
    revoke_queue_access,
)
from pgbroker.cli.main import main as cli_main
from pgbroker.errors import InvalidArgument

Conn = psycopg.Connection[Any]
KINDS = ("producer", "consumer", "monitor")
# Topic sends take a routing key, and are checked for every queue it reaches.
TOPIC_SENDS = {"send_topic", "send_batch_topic"}


@pytest.fixture
def roles(conn: Conn, pg_admin_dsn: str) -> Iterator[dict[str, str]]:
    """The broad roles of a unique prefix, and a LOGIN user per kind with no grant yet, by kind:
    their names (the DSN of each is ``login(dsn, name)``)."""
    prefix = f"s{uuid.uuid4().hex[:10]}"
    install_roles(conn, prefix)
    users = {kind: f"{prefix}_{kind}_scoped" for kind in KINDS}
    for user in users.values():
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(user)))
    try:
        yield users
    finally:
        names = [*users.values(), *(f"{prefix}_{kind}" for kind in KINDS)]
        identifiers = sql.SQL(", ").join(sql.Identifier(n) for n in names)
        # Their grants live in this database: taken back here before the roles can go.
        conn.execute(sql.SQL("DROP OWNED BY {}").format(identifiers))
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(identifiers))


def login(dsn: str, user: str) -> str:
    return make_conninfo(dsn, user=user)


@pytest.fixture
def queues(conn: Conn) -> None:
    """orders-eu (the scoped roles' queue) and billing (not theirs), a message in each."""
    for name in ("orders-eu", "billing"):
        conn.execute("SELECT pgmq.create(%s)", (name,))
        conn.execute("SELECT pgmq.send(%s, %s)", (name, json.dumps({"in": name})))


@pytest.fixture
def scoped(conn: Conn, roles: dict[str, str], queues: None) -> dict[str, str]:
    """Each kind's user granted its kind on orders*."""
    for kind, user in roles.items():
        assert grant_queue_access(conn, kind, user, "orders*")
    return roles


def refusal(dsn: str, statement: str | sql.Composed, params: tuple[Any, ...] = ()) -> str | None:
    """The SQLSTATE ``statement`` fails with, None when it succeeds."""
    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            c.execute(statement.encode() if isinstance(statement, str) else statement, params or None)
        except psycopg.Error as exc:
            return exc.diag.sqlstate
    return None


def billing_state(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT 'q', msg_id, read_ct, vt FROM pgmq.q_billing UNION ALL SELECT 'a', msg_id, read_ct, vt"
        " FROM pgmq.a_billing ORDER BY 1, 2"
    ).fetchall()


def test_a_scoped_consumer_reads_acks_deletes_archives_and_hides_in_its_queues(
    dsn: str, conn: Conn, scoped: dict[str, str]
) -> None:
    for n in range(4):
        conn.execute("SELECT pgmq.send('orders-eu', %s)", (json.dumps({"n": n}),))
    with Broker(login(dsn, scoped["consumer"])) as consumer:
        queue = consumer.queue("orders-eu")
        [first, *_] = queue.read_many(1, vt=30)
        queue.ack(first)
    with psycopg.connect(login(dsn, scoped["consumer"]), autocommit=True) as c:
        [(read_id,)] = c.execute("SELECT msg_id FROM pgmq.read('orders-eu', 30, 1)").fetchall()
        assert c.execute("SELECT pgmq.delete('orders-eu', %s::bigint)", (read_id,)).fetchone() == (True,)
        [(other_id,)] = c.execute("SELECT msg_id FROM pgmq.read('ORDERS-EU', 30, 1)").fetchall()
        assert c.execute("SELECT pgmq.archive('orders-eu', %s::bigint)", (other_id,)).fetchone() == (True,)
        assert c.execute(
            "SELECT count(*) FROM pgmq.set_vt('orders-eu', ARRAY[5::bigint], 600)"
        ).fetchone() == (1,)
        rows = c.execute("SELECT message FROM pgbroker.consume('orders-eu', 30, 10)").fetchall()
        assert len(rows) == 1
        assert c.execute("SELECT count(*) FROM pgbroker.peek('orders-eu')").fetchone() == (2,)
        assert c.execute("SELECT queue_name FROM pgbroker.policy('Orders-EU')").fetchone() == ("orders-eu",)
    assert conn.execute('SELECT count(*) FROM pgmq."a_orders-eu"').fetchone() == (2,)


# Every refusal the issue names, on billing: none may change it.
REFUSED_TO_THE_CONSUMER = [
    "SELECT * FROM pgmq.read('billing', 30, 1)",
    "SELECT * FROM pgmq.read('Billing', 30, 1, '{\"in\": \"billing\"}')",
    "SELECT * FROM pgmq.read_with_poll('billing', 30, 1, 1)",
    "SELECT * FROM pgmq.read_grouped('billing', 30, 1)",
    "SELECT * FROM pgmq.pop('billing')",
    "SELECT * FROM pgbroker.read('billing', 30, 1)",
    "SELECT * FROM pgbroker.consume('billing', 30, 1)",
    "SELECT * FROM pgbroker.peek('billing')",
    "SELECT * FROM pgmq.delete('billing', ARRAY(SELECT generate_series(1, 1000)::bigint))",
    "SELECT pgmq.delete('billing', 1::bigint)",
    "SELECT * FROM pgmq.archive('billing', ARRAY[1::bigint])",
    "SELECT * FROM pgmq.set_vt('billing', 1::bigint, 100000000)",
    "SELECT pgmq.purge_queue('billing')",
    "SELECT * FROM pgmq.metrics('billing')",
    "SELECT * FROM pgmq.metrics_all()",
    "SELECT * FROM pgmq.list_queues()",
    "SELECT * FROM pgbroker.policy('billing')",
    "SELECT pgbroker.notify_channel('billing')",
    # A queue that does not exist is refused the same way: a refused caller learns nothing.
    "SELECT * FROM pgmq.delete('no_such_queue', ARRAY[1::bigint])",
    "SELECT * FROM pgmq.read('no_such_queue', 30, 1)",
]


@pytest.mark.parametrize("statement", REFUSED_TO_THE_CONSUMER)
def test_a_scoped_consumer_is_refused_other_queues(
    dsn: str, conn: Conn, scoped: dict[str, str], statement: str
) -> None:
    before = billing_state(conn)
    assert refusal(login(dsn, scoped["consumer"]), statement) == "42501"
    assert billing_state(conn) == before


def test_receipts_of_another_queue_give_a_scoped_consumer_nothing(
    dsn: str, conn: Conn, scoped: dict[str, str]
) -> None:
    # Real receipts of billing, as its own consumer holds them.
    [(receipt,)] = conn.execute("SELECT receipt FROM pgbroker.read('billing', 300, 1)").fetchall()
    before = billing_state(conn)
    consumer = login(dsn, scoped["consumer"])
    for statement in (
        "SELECT * FROM pgbroker.ack('billing', ARRAY[%s])",
        "SELECT pgbroker.ack('billing', %s)",
        "SELECT * FROM pgbroker.nack('billing', ARRAY[%s])",
        "SELECT * FROM pgbroker.extend('billing', ARRAY[%s], 100000000)",
        "SELECT * FROM pgbroker.fail('billing', ARRAY[%s])",
        "SELECT * FROM pgbroker.consume('billing', 30, 1, ARRAY[%s])",
        "SELECT pgbroker.stale_reason('billing', %s)",
    ):
        assert refusal(consumer, statement, (receipt,)) == "42501", statement
    # Sent to its own queue, the receipt names no message of it.
    with psycopg.connect(consumer, autocommit=True) as c:
        assert c.execute("SELECT * FROM pgbroker.ack('orders-eu', ARRAY[%s])", (receipt,)).fetchall() == []
    assert billing_state(conn) == before


def _refusing_call(schema: str, name: str, arg_types: list[str], arg_names: list[str]) -> sql.Composed:
    """A call of one overload on queue billing (a topic send: a routing key reaching billing),
    every other argument a typed NULL: the refusal comes before any argument is looked at."""
    if name in TOPIC_SENDS:
        # These check their message and delay before any queue.
        given = {"jsonb": "'{}'::jsonb", "jsonb[]": "ARRAY['{}'::jsonb]", "integer": "0"}
        given["timestamp with time zone"] = "now()"
        values = ["'orders.new'", given[arg_types[1]]] + [given.get(t, f"NULL::{t}") for t in arg_types[2:]]
    else:
        values = [f"NULL::{t}" for t in arg_types]
        values[arg_names.index("queue_name")] = "'billing'::text"
    return sql.SQL("SELECT * FROM {}.{}({})").format(
        sql.Identifier(schema), sql.Identifier(name), sql.SQL(", ".join(values))
    )


def test_a_scoped_consumer_peeks_at_its_queues_dead_letters_only_in_a_shared_dead_letter_queue(
    dsn: str, conn: Conn, scoped: dict[str, str]
) -> None:
    # The dead-letter queue is not the consumer's (no grant covers it) and holds billing's letters
    # too: a peek at orders-eu's dead letters reads that queue with the owner's rights, so its
    # filter on the letter's queue is all that keeps billing's payloads from the consumer.
    conn.execute("SELECT pgmq.create('shared_dlq')")
    for name in ("orders-eu", "billing"):
        conn.execute(
            "SELECT pgbroker.set_policy(%s, max_deliveries => 1, dead_letter_queue => 'shared_dlq')", (name,)
        )
        [(receipt,)] = conn.execute("SELECT receipt FROM pgbroker.read(%s, 30, 1)", (name,)).fetchall()
        conn.execute("SELECT * FROM pgbroker.fail(%s, ARRAY[%s])", (name, receipt))
    assert conn.execute("SELECT count(*) FROM pgmq.q_shared_dlq").fetchone() == (2,)
    with psycopg.connect(login(dsn, scoped["consumer"]), autocommit=True) as c:
        letters = c.execute("SELECT message FROM pgbroker.peek('ORDERS-EU', 10, state => 'dead')").fetchall()
        assert letters == [({"in": "orders-eu"},)]
    assert refusal(login(dsn, scoped["consumer"]), "SELECT * FROM pgbroker.peek('shared_dlq')") == "42501"


def test_every_scoped_entry_point_refuses_a_queue_outside_the_grants(
    dsn: str, conn: Conn, scoped: dict[str, str]
) -> None:
    conn.execute("SELECT pgmq.bind_topic('orders.*', 'orders-eu')")
    conn.execute("SELECT pgmq.bind_topic('orders.*', 'billing')")
    overloads = conn.execute(
        "SELECT f.role_kind, n.nspname, p.proname,"
        "       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t), p.proargnames"
        " FROM pgbroker.queue_scoped_function f"
        " JOIN pg_namespace n ON n.nspname = f.function_schema"
        " JOIN pg_proc p ON p.pronamespace = n.oid AND p.proname = f.function_name"
        " ORDER BY 1, 2, 3, p.oid"
    ).fetchall()
    assert len(overloads) >= 60
    before = billing_state(conn)
    for kind, schema, name, arg_types, arg_names in overloads:
        statement = _refusing_call(schema, name, arg_types, arg_names)
        assert refusal(login(dsn, scoped[kind]), statement) == "42501", statement.as_string(conn)
    assert billing_state(conn) == before
    assert conn.execute('SELECT count(*) FROM pgmq."q_orders-eu"').fetchone() == (1,)


def test_a_role_granted_every_queue_reaches_no_stream_and_nothing_of_every_queue_at_once(
    dsn: str, conn: Conn, roles: dict[str, str]
) -> None:
    # What docs/security.md says a scoped role does not get, with the widest grant there is ('*'):
    # every entry point of the broad roles that takes no queue to check (the streams', and those
    # that cover every queue at once) is refused it, whatever it is called with, and no stream
    # changes. Streams are granted to the broad roles only.
    conn.execute("SELECT pgbroker.create_stream('orders_log', 2)")
    conn.execute("SELECT pgbroker.create_stream_group('orders_log', 'billing', 'start')")
    conn.execute("""SELECT pgbroker.stream_send('orders_log', '{"n": 1}', NULL, 'k')""")
    for kind, user in roles.items():
        assert grant_queue_access(conn, kind, user, "*")
    lag = "SELECT * FROM pgbroker.stream_lag('orders_log')"
    before = conn.execute(lag).fetchall()
    overloads = conn.execute(
        "SELECT f.role_kind, p.oid::regprocedure::text, n.nspname, p.proname,"
        "       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t)"
        " FROM (SELECT * FROM pgbroker.role_function EXCEPT SELECT * FROM pgbroker.queue_scoped_function) f"
        " JOIN pg_namespace n ON n.nspname = f.function_schema"
        " JOIN pg_proc p ON p.pronamespace = n.oid AND p.proname = f.function_name"
        " ORDER BY 1, 2"
    ).fetchall()
    names = {name for _, _, _, name, _ in overloads}
    assert {"stream_send", "stream_read", "stream_ack", "stream_consume", "stream_rewind", "streams"} <= names
    assert {"metrics_all", "list_queues", "queue_stats", "queue_workers", "blocking_sessions"} <= names
    for kind in KINDS:
        with psycopg.connect(login(dsn, roles[kind]), autocommit=True) as c:
            for _, signature, schema, name, arg_types in overloads:
                granted = c.execute("SELECT has_function_privilege(%s, 'EXECUTE')", (signature,)).fetchone()
                assert granted == (False,), signature
                call = sql.SQL("SELECT * FROM {}.{}({})").format(
                    sql.Identifier(schema),
                    sql.Identifier(name),
                    sql.SQL(", ".join(f"NULL::{t}" for t in arg_types)),
                )
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(call)
    assert conn.execute(lag).fetchall() == before


def test_scoped_entry_points_are_role_entry_points_that_authorize_first(conn: Conn) -> None:
    unlisted = conn.execute(
        "SELECT * FROM pgbroker.queue_scoped_function EXCEPT SELECT * FROM pgbroker.role_function"
    ).fetchall()
    assert unlisted == []
    unchecked = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pgbroker.queue_scoped_function f"
        " JOIN pg_namespace n ON n.nspname = f.function_schema"
        " JOIN pg_proc p ON p.pronamespace = n.oid AND p.proname = f.function_name"
        " WHERE p.prosrc NOT LIKE '%%pgbroker._authorize(' || CASE WHEN p.proname = 'policy' THEN 'NULL'"
        "       ELSE quote_literal(f.role_kind) END || ', queue_name)%%'"
        "   AND NOT p.proname = ANY(%s)",
        (sorted(TOPIC_SENDS),),
    ).fetchall()
    assert unchecked == []


def test_a_scoped_producer_sends_only_to_its_queues(dsn: str, conn: Conn, scoped: dict[str, str]) -> None:
    producer = login(dsn, scoped["producer"])
    with Broker(producer) as broker:
        broker.queue("orders-eu").send({"n": 1})
        broker.queue("orders-eu").send_many([{"n": 2}, {"n": 3}])
        broker.queue("orders-eu").send_many([{"n": 4}], idempotency_key="order-4")
    # A key of billing's: a refused caller learns neither that it exists nor its msg_ids.
    conn.execute("SELECT pgbroker.send_idempotent('billing', 'order-4', ARRAY['{}'::jsonb])")
    before = billing_state(conn)
    for statement in (
        "SELECT pgmq.send('billing', '{}')",
        "SELECT * FROM pgbroker.send_idempotent('billing', 'order-4', ARRAY['{}'::jsonb])",
        "SELECT * FROM pgbroker.send_idempotent('billing', 'order-4', ARRAY['{\"other\": 1}'::jsonb])",
        "SELECT pgmq.send_batch('billing', ARRAY['{}'::jsonb])",
        "SELECT * FROM pgbroker.receive_many('billing', ARRAY['id'], ARRAY['{}'::jsonb], ARRAY[NULL::jsonb],"
        " '1 hour')",
        "SELECT * FROM pgmq.read('orders-eu', 30, 1)",
        "SELECT pgbroker.prune_inbound_seen('1 hour')",
    ):
        assert refusal(producer, statement) == "42501", statement
    assert billing_state(conn) == before
    assert conn.execute('SELECT count(*) FROM pgmq."q_orders-eu"').fetchone() == (5,)


def test_a_scoped_producer_forgets_the_inbound_ids_of_its_queues_only(
    dsn: str, conn: Conn, scoped: dict[str, str]
) -> None:
    # Its inbound bridge prunes its queue's message ids every minute: a producer granted orders*
    # could not (prune_inbound_seen was the broad producer's alone), and logged
    # bridge.in.prune_failed every minute while the ids piled up.
    for queue in ("orders-eu", "billing"):
        conn.execute(
            "SELECT * FROM pgbroker.receive_many(%s, ARRAY['old'], ARRAY['{}'::jsonb], ARRAY[NULL::jsonb],"
            " '1 day')",
            (queue,),
        )
    conn.execute("UPDATE pgbroker.inbound_seen SET seen_at = now() - interval '2 hours'")
    producer = login(dsn, scoped["producer"])
    with psycopg.connect(producer, autocommit=True) as c:
        pruned = c.execute("SELECT pgbroker.prune_inbound_seen('1 hour', 10, 'ORDERS-EU')").fetchone()
        assert pruned == (1,)
        for other in ("billing", None):  # another queue's, every queue's
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as err:
                c.execute("SELECT pgbroker.prune_inbound_seen('1 hour', 10, %s)", (other,))
            where = f'queue "{other}"' if other else "every queue"
            expected = f'permission denied: role "{scoped["producer"]}" has no producer access to {where}'
            assert err.value.diag.message_primary == expected
    remembered = conn.execute("SELECT queue_name FROM pgbroker.inbound_seen").fetchall()
    assert remembered == [("billing",)]


def test_a_topic_send_reaching_a_queue_outside_the_grants_sends_nothing(
    dsn: str, conn: Conn, scoped: dict[str, str]
) -> None:
    conn.execute("SELECT pgmq.bind_topic('orders.*', 'orders-eu')")
    conn.execute("SELECT pgmq.bind_topic('*.paid', 'billing')")
    producer = login(dsn, scoped["producer"])
    with psycopg.connect(producer, autocommit=True) as c:
        assert c.execute("SELECT pgmq.send_topic('orders.new', '{}')").fetchone() == (1,)
    assert refusal(producer, "SELECT pgmq.send_topic('orders.paid', '{}')") == "42501"
    assert (
        refusal(producer, "SELECT * FROM pgmq.send_batch_topic('orders.paid', ARRAY['{}'::jsonb])") == "42501"
    )
    assert conn.execute('SELECT count(*) FROM pgmq."q_orders-eu"').fetchone() == (2,)
    assert conn.execute("SELECT count(*) FROM pgmq.q_billing").fetchone() == (1,)


def test_a_scoped_monitor_sees_its_queues_only(dsn: str, scoped: dict[str, str]) -> None:
    monitor = login(dsn, scoped["monitor"])
    with psycopg.connect(monitor, autocommit=True) as c:
        assert c.execute("SELECT queue_length FROM pgmq.metrics('orders-eu')").fetchone() == (1,)
        assert c.execute("SELECT pgbroker.is_paused('orders-eu')").fetchone() == (False,)
    for statement in (
        "SELECT * FROM pgmq.metrics('billing')",
        "SELECT pgbroker.messages_consumed('billing')",
        "SELECT * FROM pgmq.metrics_all()",
        "SELECT * FROM pgbroker.queue_stats()",
        "SELECT * FROM pgbroker.peek('orders-eu')",
    ):
        assert refusal(monitor, statement) == "42501", statement


def test_patterns_match_case_insensitively_and_take_underscores_literally(
    dsn: str, conn: Conn, roles: dict[str, str], queues: None
) -> None:
    conn.execute("SELECT pgmq.create('ORDERS-x')")
    conn.execute("SELECT pgmq.create('eu_1')")
    conn.execute("SELECT pgmq.create('eux1')")
    consumer = roles["consumer"]
    grant_queue_access(conn, "consumer", consumer, "Orders-*")
    grant_queue_access(conn, "consumer", consumer, "eu_?")
    with psycopg.connect(login(dsn, consumer), autocommit=True) as c:
        for name in ("ORDERS-x", "orders-X", "orders-eu", "eu_1"):
            c.execute("SELECT * FROM pgmq.read(%s, 30, 1)", (name,))
    assert refusal(login(dsn, consumer), "SELECT * FROM pgmq.read('eux1', 30, 1)") == "42501"
    assert [(g.role_kind, g.pattern) for g in list_queue_grants(conn)] == [
        ("consumer", "eu_?"),
        ("consumer", "orders-*"),
    ]


def test_the_refusal_names_the_role_the_kind_and_the_queue(dsn: str, scoped: dict[str, str]) -> None:
    with (
        psycopg.connect(login(dsn, scoped["consumer"]), autocommit=True) as c,
        pytest.raises(psycopg.errors.InsufficientPrivilege) as caught,
    ):
        c.execute("SELECT * FROM pgmq.read('billing', 30, 1)")
    diag = caught.value.diag
    assert diag.message_primary == (
        f'permission denied: role "{scoped["consumer"]}" has no consumer access to queue "billing"'
    )
    assert f"pgbroker grant consumer {scoped['consumer']} --queue billing" in (diag.message_hint or "")


def test_revoke_takes_the_access_back(dsn: str, conn: Conn, scoped: dict[str, str]) -> None:
    consumer = scoped["consumer"]
    statement = "SELECT * FROM pgmq.read('orders-eu', 30, 1)"
    assert refusal(login(dsn, consumer), statement) is None
    assert revoke_queue_access(conn, "consumer", consumer, "ORDERS*") == 1
    assert refusal(login(dsn, consumer), statement) == "42501"
    # With its last grant gone the role cannot even call the entry points.
    assert conn.execute(
        "SELECT has_function_privilege(%s, 'pgmq.read(text, integer, integer, jsonb)', 'EXECUTE')",
        (consumer,),
    ).fetchone() == (False,)
    assert revoke_queue_access(conn, "consumer", consumer, "orders*") == 0


def test_grants_survive_an_upgrade(dsn: str, conn: Conn, scoped: dict[str, str]) -> None:
    # A migration that recreates an entry point drops its grants; the installer gives them back.
    conn.execute(
        sql.SQL("REVOKE EXECUTE ON FUNCTION pgmq.read(text, integer, integer, jsonb) FROM {}").format(
            sql.Identifier(scoped["consumer"])
        )
    )
    statement = "SELECT * FROM pgmq.read('orders-eu', 30, 1)"
    assert refusal(login(dsn, scoped["consumer"]), statement) == "42501"
    install(conn)
    assert refusal(login(dsn, scoped["consumer"]), statement) is None


def test_grants_survive_the_function_files_applied_again(
    dsn: str, conn: Conn, scoped: dict[str, str]
) -> None:
    # The database last ran other function files (another package version's): the install applies
    # them again, which resets the entry points to SECURITY INVOKER, and the scoped roles keep
    # their grants and their queues.
    conn.execute(
        sql.SQL("REVOKE EXECUTE ON FUNCTION pgmq.read(text, integer, integer, jsonb) FROM {}").format(
            sql.Identifier(scoped["consumer"])
        )
    )
    conn.execute("UPDATE pgbroker.schema_functions SET checksum = 'another version'")
    install(conn)
    assert refusal(login(dsn, scoped["consumer"]), "SELECT * FROM pgmq.read('orders-eu', 30, 1)") is None
    assert refusal(login(dsn, scoped["consumer"]), "SELECT * FROM pgmq.read('billing', 30, 1)") == "42501"
    assert refusal(login(dsn, scoped["producer"]), "SELECT pgmq.send('orders-eu', '{}')") is None


def test_a_member_of_a_granted_group_role_is_scoped_too(dsn: str, conn: Conn, scoped: dict[str, str]) -> None:
    member = f"{scoped['consumer']}_member"
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
            sql.Identifier(member), sql.Identifier(scoped["consumer"])
        )
    )
    try:
        assert refusal(login(dsn, member), "SELECT * FROM pgmq.read('orders-eu', 30, 1)") is None
        assert refusal(login(dsn, member), "SELECT * FROM pgmq.read('billing', 30, 1)") == "42501"
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(member)))


def test_members_of_the_broad_roles_keep_every_queue(dsn: str, conn: Conn, scoped: dict[str, str]) -> None:
    prefix = scoped["consumer"].removesuffix("_consumer_scoped")
    member = f"{prefix}_broad_member"
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
            sql.Identifier(member), sql.Identifier(f"{prefix}_consumer")
        )
    )
    try:
        with psycopg.connect(login(dsn, member), autocommit=True) as c:
            assert len(c.execute("SELECT * FROM pgmq.read('billing', 30, 1)").fetchall()) == 1
            assert c.execute("SELECT queue_name FROM pgbroker.policy('billing')").fetchone() == ("billing",)
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(member)))


def test_the_grants_of_a_dropped_role_are_forgotten(conn: Conn, roles: dict[str, str]) -> None:
    gone = f"{roles['consumer']}_gone"
    conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(gone)))
    grant_queue_access(conn, "consumer", gone, "orders*")
    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(gone)))
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(gone)))
    grant_queue_access(conn, "consumer", roles["consumer"], "billing")
    assert conn.execute("SELECT grantee::text, pattern FROM pgbroker.queue_grant").fetchall() == [
        (roles["consumer"], "billing")
    ]


@pytest.mark.parametrize(
    ("kind", "role", "pattern", "message"),
    [
        ("consumer", "no_such_role_anywhere", "orders*", "role 'no_such_role_anywhere' does not exist"),
        ("reader", None, "orders*", "unknown role kind 'reader'"),
        ("consumer", None, "", "queue pattern '' must be"),
        ("consumer", None, "orders *", "queue pattern 'orders *' must be"),
    ],
)
def test_a_bad_grant_is_refused_with_a_clear_error(
    conn: Conn, roles: dict[str, str], kind: str, role: str | None, pattern: str, message: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        grant_queue_access(conn, kind, role or roles["consumer"], pattern)
    assert message in caught.value.message
    assert list_queue_grants(conn) == []


def test_a_grant_that_would_not_limit_the_role_is_refused(conn: Conn, roles: dict[str, str]) -> None:
    prefix = roles["consumer"].removesuffix("_consumer_scoped")
    with pytest.raises(InvalidArgument, match="a queue grant would not limit it"):
        grant_queue_access(conn, "consumer", f"{prefix}_consumer", "orders*")
    owner = conn.execute("SELECT current_user").fetchone()
    assert owner is not None
    with pytest.raises(InvalidArgument, match="has every access already"):
        grant_queue_access(conn, "consumer", owner[0], "orders*")


def test_grants_need_the_roles_installed(conn: Conn) -> None:
    role = f"s{uuid.uuid4().hex[:10]}_without_roles"
    conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
    try:
        with pytest.raises(InvalidArgument, match="pgbroker install --roles"):
            grant_queue_access(conn, "consumer", role, "orders*")
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_cli_grant_list_revoke(
    dsn: str, roles: dict[str, str], queues: None, capsys: pytest.CaptureFixture[str]
) -> None:
    user = roles["consumer"]
    assert cli_main(["--dsn", dsn, "grant", "consumer", user, "--queue", "orders*", "--queue", "eu-?"]) == 0
    capsys.readouterr()
    assert cli_main(["--dsn", dsn, "grants", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(g["role_name"], g["role_kind"], g["pattern"]) for g in listed] == [
        (user, "consumer", "eu-?"),
        (user, "consumer", "orders*"),
    ]
    assert refusal(login(dsn, user), "SELECT * FROM pgmq.read('orders-eu', 30, 1)") is None
    assert cli_main(["--dsn", dsn, "revoke", "consumer", user, "--all"]) == 0
    assert "revoked 2 consumer grants" in capsys.readouterr().out
    assert cli_main(["--dsn", dsn, "grants"]) == 0
    assert "no queue grants" in capsys.readouterr().out
    assert refusal(login(dsn, user), "SELECT * FROM pgmq.read('orders-eu', 30, 1)") == "42501"
    assert cli_main(["--dsn", dsn, "revoke", "consumer", user, "--queue", "orders*"]) == 4
    assert cli_main(["--dsn", dsn, "grant", "consumer", "no_such_role_anywhere", "--queue", "x"]) == 2


def test_a_scoped_consumer_can_neither_overwrite_nor_remove_another_queues_worker(
    dsn: str, conn: Conn, scoped: dict[str, str]
) -> None:
    """The workers panel's rows (pgbroker.worker_heartbeat, worker_stopped): a consumer of orders*
    that learns the id of a billing worker changes nothing of its row."""
    other = uuid.uuid4()
    beat = "SELECT pgbroker.worker_heartbeat(%s, %s, 'h', 1, 4, %s, 0, 0, 0)"
    conn.execute(beat, ("billing", other, 3))
    row = "SELECT queue_name, in_flight FROM pgbroker.queue_workers WHERE worker_id = %s"
    consumer = login(dsn, scoped["consumer"])
    assert refusal(consumer, beat, ("orders-eu", other, 99)) is None  # its own queue: allowed, no effect
    assert refusal(consumer, "SELECT pgbroker.worker_stopped(%s, %s)", ("billing", other)) == "42501"
    assert refusal(consumer, "SELECT pgbroker.worker_stopped(%s, %s)", ("orders-eu", other)) is None
    assert conn.execute(row, (other,)).fetchone() == ("billing", 3)
    own = uuid.uuid4()
    assert refusal(consumer, beat, ("orders-eu", own, 2)) is None
    assert refusal(consumer, "SELECT pgbroker.worker_stopped(%s, %s)", ("orders-eu", own)) is None
    assert conn.execute(row, (own,)).fetchone() is None


def test_an_idempotency_scope_is_the_login_that_names_it(
    dsn: str, conn: Conn, scoped: dict[str, str]
) -> None:
    """The HTTP API keeps each API key's idempotency keys in the scope 'api key <id>'. Another
    login that may send to the queue named that scope and got the API key's msg_ids for the same
    request, and PB009 for another one: it learned which keys the API key used, and their
    msg_ids. A scope is now the login's that names it."""
    other = scoped["consumer"]
    assert grant_queue_access(conn, "producer", other, "orders*")
    send = "SELECT * FROM pgbroker.send_idempotent('orders-eu', %s, ARRAY[%s::jsonb], scope => 'api key 7')"

    def ids(user: str, key: str, body: dict[str, int]) -> list[int]:
        with psycopg.connect(login(dsn, user), autocommit=True) as c:
            return [int(row[0]) for row in c.execute(send, (key, json.dumps(body)))]

    same = ids(scoped["producer"], "order-7", {"n": 1})
    different = ids(scoped["producer"], "order-8", {"n": 1})
    assert ids(scoped["producer"], "order-7", {"n": 1}) == same  # its own retry: answered
    assert set(ids(other, "order-7", {"n": 1})).isdisjoint(same)  # sent, not answered
    assert set(ids(other, "order-8", {"n": 2})).isdisjoint(different)  # sent, not refused (PB009)
