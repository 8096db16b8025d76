"""The privilege model against a hostile member of every role (issue 21): LOGIN users in the
producer, consumer and monitor roles of ``pgbroker install --roles``, and an outsider with LOGIN
only, try what an attacker would. Every attempt is refused or harmless.

- Session prepared statements under every name the engine's dynamic path uses (a conditional read,
  a queue with max_deliveries, a limited queue, queues beyond the route limit), including the
  engine's own text prepared under a search_path that shadows a function: the owner never runs
  them (a marker table only the owner may write stays empty).
- Functions, operators, types and tables shadowed in pg_temp and in a schema of the caller first
  on its search_path.
- Reserved x-pgbroker-* headers forged through every send.
- Every pgbroker.* setting set in the session; limits hold.
- Prune windows, names, and pg_monitor's access to payloads.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from pgbroker._db.install import install_roles
from tests.support.streams import ack, read, send
from tests.support.tables import Conn

KINDS = ("producer", "consumer", "monitor", "outsider")
# Every operation pgbroker._statement_name names a statement for (50_reads.sql).
OPS = ("read", "read_c", "deliver", "deliver_c", "read_p", "read_pc", "deliver_p", "deliver_pc",
       "pop", "pop_p", "ack_a", "ack_d")  # fmt: skip
# A queue per dynamic path: a routed queue read with a conditional, max_deliveries, limited, and
# two beyond the route limit (one with priorities).
QUEUES = ("plain", "capped", "limited", "far", "far_p")
MARKER = "SELECT count(*) FROM public.marker"


@pytest.fixture
def users(dsn: str, conn: Conn, pg_admin_dsn: str) -> Iterator[dict[str, str]]:
    """A DSN per kind: a LOGIN user in that role, and an outsider in none."""
    prefix = f"s{uuid.uuid4().hex[:10]}"
    install_roles(conn, prefix)
    dsns = {}
    for kind in KINDS:
        user = sql.Identifier(f"{prefix}_{kind}_user")
        if kind == "outsider":
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(user))
        else:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(user, sql.Identifier(f"{prefix}_{kind}"))
            )
        # The right to make a schema of its own, to shadow the engine's names from.
        conn.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(conn.info.dbname), user)
        )
        dsns[kind] = make_conninfo(dsn, user=f"{prefix}_{kind}_user")
    try:
        yield dsns
    finally:
        roles = [sql.Identifier(f"{prefix}_{kind}_user") for kind in KINDS]
        roles += [sql.Identifier(f"{prefix}_{kind}") for kind in KINDS if kind != "outsider"]
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.SQL(", ").join(roles)))
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.SQL(", ").join(roles)))


@pytest.fixture
def queues(conn: Conn) -> tuple[str, ...]:
    """The queues of every dynamic path, six messages each, and the marker table (the owner's:
    a row in it is SQL run with the owner's rights)."""
    conn.execute("CREATE TABLE public.marker (who text)")
    conn.execute("GRANT SELECT ON public.marker TO PUBLIC")
    for name in QUEUES:
        if name == "far":
            # Only the first three queues are routed: for the database, the operator's way, and
            # in this session, which writes the routes (the way of versions before 0025 too).
            db = sql.Identifier(conn.info.dbname)
            conn.execute(sql.SQL("ALTER DATABASE {} SET pgbroker.route_limit = 3").format(db))
            conn.execute("SET pgbroker.route_limit = 3")
        conn.execute("SELECT pgmq.create(%s)", [name])
        conn.execute(
            "SELECT pgmq.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', n %% 3 + 1)"
            "                                 FROM generate_series(0, 5) n))",
            [name],
        )
    conn.execute("SELECT pgbroker.set_policy('capped', max_deliveries => 3)")
    conn.execute("SELECT pgbroker.set_policy('limited', max_in_flight => 100)")
    conn.execute("SELECT pgbroker.set_policy('far_p', priorities => true)")
    routed = {name: conn.execute("SELECT array_position(%s, %s) IS NOT NULL",
                                 [_route_keys(conn), name]).fetchone() for name in QUEUES}  # fmt: skip
    assert routed == {
        "plain": (True,),
        "capped": (True,),
        "limited": (True,),
        "far": (False,),
        "far_p": (False,),
    }
    return QUEUES


@contextmanager
def refused(sqlstate: str) -> Iterator[pytest.ExceptionInfo[psycopg.Error]]:
    """Expect the block to fail with pgbroker's error sqlstate."""
    with pytest.raises(psycopg.Error) as error:
        yield error
    assert error.value.sqlstate == sqlstate, error.value


def _route_keys(conn: Conn) -> list[str]:
    """The queue names the send route holds (the routes are written together)."""
    source = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = '_route_send'").fetchone()
    assert source is not None
    keys = conn.execute("SELECT (regexp_match(%s, 'array_position\\(''([^'']*)''::text\\[\\]'))[1]::text[]",
                        [source[0]]).fetchone()  # fmt: skip
    assert keys is not None
    return list(keys[0])


def _hostile(op: str) -> str:
    """A statement shaped as op's result that writes the marker as whoever runs it."""
    columns = "1::bigint" if op.startswith("ack") else (
        "1::bigint, 1, now(), now(), now(), '{}'::jsonb, NULL::jsonb"
        + (", 'x'::text" if op.startswith("deliver") else ""))  # fmt: skip
    return f"WITH m AS (INSERT INTO public.marker VALUES (current_user) RETURNING 1) SELECT {columns} FROM m"  # noqa: S608


def statement_types(owner: Conn) -> dict[str, str]:
    """The parameter types of the engine's statement of each op (pgbroker._statement_types), read
    by the owner: an outsider may not look into the schema."""
    rows = owner.execute(
        "SELECT op, array_to_string(pgbroker._statement_types(op), ', ') FROM unnest(%s::text[]) AS op",
        [list(OPS)],
    ).fetchall()
    return dict(rows)


def hostile_seed(types: dict[str, str]) -> Callable[[Conn], None]:
    """Prepare a hostile statement under every name the engine could use for every queue, with the
    parameters the engine's statement of that name takes, so that an engine that ran it would
    run it, not fail on its arity."""

    def seed(c: Conn) -> None:
        for name in QUEUES:
            for op in OPS:
                c.execute(f"PREPARE pgb_{op}_q_{name} ({types[op]}) AS {_hostile(op)}".encode())

    return seed


def seed_shadowed(c: Conn) -> None:
    """Prepare the engine's own statements under a search_path whose first schema shadows
    clock_timestamp() with a function that writes the marker."""
    schema = f"evil_{c.info.user}"
    c.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    c.execute(
        sql.SQL("""CREATE FUNCTION {}.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS
                   $$ INSERT INTO public.marker VALUES (current_user) RETURNING pg_catalog.now() $$
                """).format(sql.Identifier(schema))
    )
    c.execute(sql.SQL("SET search_path = {}, pg_catalog, public").format(sql.Identifier(schema)))
    for name in QUEUES:
        for op in OPS:
            text = c.execute("SELECT pgbroker._statement(%s, %s)", [f"q_{name}", op]).fetchone()
            assert text is not None
            c.execute(text[0].encode())


# Every call that reaches the dynamic path, as a consumer makes it.
CALLS = [
    "SELECT * FROM pgmq.read('plain', 30, 1, '{\"n\": 1}')",
    "SELECT * FROM pgbroker.read('capped', 30, 1)",
    "SELECT * FROM pgmq.read('limited', 30, 1)",
    "SELECT * FROM pgbroker.read('limited', 30, 1)",
    "SELECT * FROM pgmq.read('limited', 30, 1, '{\"n\": 3}')",
    "SELECT * FROM pgmq.pop('limited')",
    "SELECT * FROM pgmq.read('far', 30, 1)",
    "SELECT * FROM pgmq.read('far', 30, 1, '{\"n\": 2}')",
    "SELECT * FROM pgmq.read('far_p', 30, 1)",
    "SELECT * FROM pgmq.read('far_p', 30, 1, '{\"n\": 2}')",
    "SELECT * FROM pgmq.pop('far_p')",
    "SELECT * FROM pgmq.pop('far')",
]


def _settle(c: Conn, queue: str, archive: bool) -> list[Any]:
    """Read one message with a receipt from queue, and ack it."""
    read = c.execute("SELECT receipt FROM pgbroker.read(%s, 30, 1)", [queue]).fetchall()
    return c.execute(
        "SELECT * FROM pgbroker.ack(%s, %s::text[], %s)", [queue, [r[0] for r in read], archive]
    ).fetchall()


# pgmq's unfenced removals by msg_id, on a routed queue and on one past the routes (their dynamic path).
REMOVALS = [
    "SELECT pgmq.archive('plain', (SELECT pg_catalog.min(msg_id) FROM pgmq.read('plain', 30, 1)))",
    "SELECT pgmq.delete('plain', (SELECT pg_catalog.min(msg_id) FROM pgmq.read('plain', 30, 1)))",
    "SELECT pgmq.archive('far', (SELECT pg_catalog.min(msg_id) FROM pgmq.read('far', 30, 1)))",
    "SELECT pgmq.delete('far', (SELECT pg_catalog.min(msg_id) FROM pgmq.read('far', 30, 1)))",
]


def assert_removed(c: Conn) -> None:
    """Each removal found its message and removed it."""
    for call in REMOVALS:
        assert c.execute(call.encode()).fetchone() == (True,), call


def assert_real_messages(c: Conn, call: str) -> None:
    """The call returns queued messages, not the rows of a seeded statement (payload {})."""
    rows = c.execute(call.encode()).fetchall()
    assert rows, call
    assert all(row[5] != {} for row in rows), call


def attack(dsn: str, seed: Callable[[Conn], None], kind: str) -> None:
    """Seed, then make every call that reaches the dynamic path: a consumer gets real messages
    (and removes some by msg_id), any other role is refused."""
    with psycopg.connect(dsn, autocommit=True) as c:
        seed(c)
        if kind != "consumer":
            for call in CALLS + REMOVALS:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(call.encode())
            return
        for call in CALLS:
            assert_real_messages(c, call)
        for queue, archive in (("far", True), ("far_p", False), ("capped", True), ("limited", False)):
            assert len(_settle(c, queue, archive)) == 1
        assert_removed(c)


@pytest.mark.parametrize("kind", KINDS)
def test_statements_prepared_under_the_engines_names_never_run_as_the_owner(
    users: dict[str, str], queues: tuple[str, ...], conn: Conn, kind: str
) -> None:
    attack(users[kind], hostile_seed(statement_types(conn)), kind)
    assert conn.execute(MARKER).fetchone() == (0,)


def test_the_engines_own_text_prepared_under_a_hostile_search_path_never_runs_as_the_owner(
    users: dict[str, str], queues: tuple[str, ...], conn: Conn
) -> None:
    """A guard: before 0025 the server's plan cache saved this case (a prepared statement run
    under another search_path is analysed again), which the engine no longer relies on."""
    attack(users["consumer"], seed_shadowed, "consumer")
    assert conn.execute(MARKER).fetchone() == (0,)


def test_a_statement_of_the_sessions_own_is_prepared_again_with_the_engines_text(
    queues: tuple[str, ...], dsn: str, conn: Conn
) -> None:
    """With the session's own rights the dynamic path uses a prepared statement, but only its own:
    one of another text under its name is replaced (after an upgrade, or a mistake)."""
    with psycopg.connect(dsn, autocommit=True) as owner:
        hostile_seed(statement_types(owner))(owner)
        for call in CALLS:
            assert_real_messages(owner, call)
    assert conn.execute(MARKER).fetchone() == (0,)


def test_the_sessions_own_prepared_statement_is_kept_from_call_to_call(conn: Conn) -> None:
    """The check of its text does not prepare it again on every call."""
    conn.execute("SET pgbroker.route_limit = 0")
    conn.execute("SELECT pgmq.create('dyn')")
    conn.execute("SELECT pgmq.send('dyn', '{}')")
    prepared = "SELECT name, prepare_time FROM pg_prepared_statements"
    conn.execute("SELECT * FROM pgmq.read('dyn', 0, 1)")
    first = conn.execute(prepared).fetchall()
    conn.execute("SELECT * FROM pgmq.read('dyn', 0, 1)")
    assert [name for name, _ in first] == ["pgb_read_q_dyn"]
    assert conn.execute(prepared).fetchall() == first


# Date settings under which a timestamptz's text does not read back as the same instant: the zone
# is printed by its abbreviation, which is read back by the abbreviation table: Asia/Kolkata's IST as
# Israel's (the time read back 3 h 30 min late), the POSIX zone EST-10's EST as New York's (15 h).
SKEWING_SETTINGS = [
    "SET TimeZone = 'Asia/Kolkata'; SET DateStyle = 'SQL, DMY'",
    "SET TimeZone = 'EST-10'; SET DateStyle = 'Postgres'",
]


@pytest.mark.parametrize("settings", SKEWING_SETTINGS)
@pytest.mark.parametrize("who", ["consumer", "owner"])
def test_the_dynamic_path_reads_at_the_servers_clock_whatever_the_sessions_date_settings(
    users: dict[str, str], queues: tuple[str, ...], conn: Conn, dsn: str, who: str, settings: str
) -> None:
    """The dynamic path writes the clock into the statement's text (as a typed literal): under
    these settings the clock read back was hours ahead, so a read took messages leased to another
    consumer and messages still delayed."""
    send = "SELECT * FROM pgmq.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', n) FROM unnest(%s) n), %s)"
    for name in queues:
        conn.execute("SELECT * FROM pgmq.read(%s, 600, 100)", [name])  # leased to another consumer
        conn.execute(send, [name, [1, 2, 3], 3600])  # delayed
    ready = {row[0] for name in queues for row in conn.execute(send, [name, [1, 2, 3, 1], 0])}
    with psycopg.connect(users["consumer"] if who == "consumer" else dsn, autocommit=True) as c:
        c.execute(settings.encode())
        for call in CALLS:
            # (msg_id alone: psycopg reads no timestamp under these settings)
            got = [row[0] for row in c.execute(call.replace("*", "msg_id", 1).encode()).fetchall()]
            assert len(got) == 1, (call, got)
            assert got[0] in ready, (call, got)


#: A caller's own schema and pg_temp shadowing what the engine calls, each shadow writing a row into
#: public.marker as whoever runs it; then the search_path that puts them first.
SHADOW = """
CREATE SCHEMA shadow;
CREATE FUNCTION shadow.mark() RETURNS boolean LANGUAGE sql AS
    $$ INSERT INTO public.marker VALUES (current_user) RETURNING true $$;
CREATE FUNCTION shadow.lower(text) RETURNS text LANGUAGE sql AS
    $$ SELECT 'x' FROM shadow.mark() $$;
CREATE FUNCTION shadow.cardinality(anyarray) RETURNS integer LANGUAGE sql AS
    $$ SELECT 1 FROM shadow.mark() $$;
CREATE FUNCTION shadow.now() RETURNS timestamptz LANGUAGE sql AS
    $$ SELECT pg_catalog.now() FROM shadow.mark() $$;
CREATE FUNCTION shadow.eq(bigint, bigint) RETURNS boolean LANGUAGE sql AS
    $$ SELECT $1 OPERATOR(pg_catalog.=) $2 FROM shadow.mark() $$;
CREATE OPERATOR shadow.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = shadow.eq);
CREATE FUNCTION shadow.unnest(bigint[]) RETURNS SETOF bigint LANGUAGE sql AS
    $$ SELECT pg_catalog.unnest($1) FROM shadow.mark() $$;
CREATE FUNCTION shadow.smaller(bigint, bigint) RETURNS bigint LANGUAGE sql AS
    $$ SELECT least($1, $2) FROM shadow.mark() $$;
CREATE AGGREGATE shadow.min(bigint) (SFUNC = shadow.smaller, STYPE = bigint);
CREATE AGGREGATE shadow.max(bigint) (SFUNC = shadow.smaller, STYPE = bigint);
CREATE TYPE shadow.message_record AS (x integer);
CREATE TABLE shadow.meta (queue_name varchar, is_partitioned boolean, is_unlogged boolean,
                          created_at timestamptz);
CREATE TABLE shadow.queue_policy (queue_name text);
CREATE TEMP TABLE meta (queue_name varchar, is_partitioned boolean, is_unlogged boolean,
                        created_at timestamptz);
CREATE TEMP TABLE queue_head (queue_name text);
CREATE FUNCTION pg_temp.lower(text) RETURNS text LANGUAGE sql AS
    $$ SELECT 'x' FROM shadow.mark() $$;
CREATE FUNCTION pg_temp.lower(varchar) RETURNS text LANGUAGE sql AS
    $$ SELECT 'x' FROM shadow.mark() $$;
CREATE FUNCTION pg_temp.array_position(text[], varchar) RETURNS integer LANGUAGE sql AS
    $$ SELECT 1 FROM shadow.mark() $$;
CREATE FUNCTION pg_temp.starts_with(varchar, text) RETURNS boolean LANGUAGE sql AS
    $$ SELECT true FROM shadow.mark() $$;
SET search_path = shadow, pg_temp, pg_catalog, pgmq, pgbroker;
"""


def test_shadowed_functions_operators_types_and_tables_are_never_reached(
    users: dict[str, str], queues: tuple[str, ...], conn: Conn
) -> None:
    with psycopg.connect(users["consumer"], autocommit=True) as c:
        c.execute(SHADOW)
        for call in CALLS:
            assert c.execute(call.encode()).fetchall(), call
        assert len(_settle(c, "far", True)) == 1
        assert len(_settle(c, "plain", False)) == 1
        assert_removed(c)
    assert conn.execute(MARKER).fetchone() == (0,)


def test_idempotent_sends_sessions_and_stream_reads_reach_no_shadow(
    users: dict[str, str], queues: tuple[str, ...], conn: Conn
) -> None:
    """The owner-rights paths changed on 2026-11-29 under a hostile session: a producer's idempotent
    sends with a scope (their dynamic SQL on the key tables, the PB009 path), a monitor's
    blocking_sessions, a consumer's stream reads (the liveness guard's server clocks)."""
    conn.execute("SELECT pgbroker.create_stream('clicks', 1)")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g')")
    conn.execute("SELECT pgbroker.stream_send('clicks', '{}')")
    with psycopg.connect(users["producer"], autocommit=True) as c:
        c.execute(SHADOW)
        for scope in ("a", None):
            send = "SELECT * FROM pgbroker.send_idempotent(%s, 'k', ARRAY['{}'::jsonb], scope => %s)"
            assert c.execute(send, [queues[0], scope]).fetchall()
            assert c.execute(send, [queues[0], scope]).fetchall()  # answered again
        with pytest.raises(psycopg.Error) as refused:
            c.execute("SELECT pgbroker.send_idempotent(%s, 'k', ARRAY['[1]'::jsonb])", [queues[0]])
        assert refused.value.sqlstate == "PB009"
        c.execute("GRANT USAGE ON SCHEMA shadow TO PUBLIC")  # the others' search_path finds it too
    for kind, call in (
        ("monitor", "SELECT * FROM pgbroker.blocking_sessions('0 seconds')"),
        ("consumer", "SELECT * FROM pgbroker.stream_read('clicks', 'g', 'c1', 10)"),
    ):
        with psycopg.connect(users[kind], autocommit=True) as c:
            c.execute("SET search_path = shadow, pg_temp, pg_catalog, pgmq, pgbroker")
            c.execute(call.encode()).fetchall()
    assert conn.execute(MARKER).fetchone() == (0,)


def test_a_consumer_moving_the_bounds_past_a_held_horizon_reaches_no_shadow(
    users: dict[str, str], queues: tuple[str, ...], conn: Conn
) -> None:
    # While a session holds the horizon, a read that advances the queue's bounds asks pg_locks for
    # the queue's writers (50_reads.sql): as the owner, under the consumer's search_path and
    # shadows. One read in 16 advances: 300 reads miss it with a chance of 4e-9.
    head = "SELECT ready_from FROM pgbroker.queue_head WHERE queue_name = 'plain'"
    with psycopg.connect(make_conninfo(conn.info.dsn, dbname="postgres")) as idle:
        idle.execute("SELECT pg_current_xact_id()")  # the horizon held from here
        sent = conn.execute("SELECT * FROM pgmq.send_batch('plain', array_fill('{}'::jsonb, ARRAY[20]))")
        last = [r[0] for r in sent][-1]
        with psycopg.connect(users["consumer"], autocommit=True) as c:
            c.execute(SHADOW)
            c.execute(
                """
                CREATE VIEW shadow.pg_locks AS SELECT * FROM pg_catalog.pg_locks WHERE shadow.mark();
                CREATE FUNCTION shadow.pg_backend_pid() RETURNS integer LANGUAGE sql AS
                    $$ SELECT 0 FROM shadow.mark() $$;
                CREATE FUNCTION shadow.current_database() RETURNS name LANGUAGE sql AS
                    $$ SELECT 'x'::name FROM shadow.mark() $$;
                """
            )
            assert c.execute("SELECT count(*) FROM pgmq.pop('plain', 100)").fetchone() == (26,)
            for _ in range(300):  # the candidate, taken while the horizon is held
                c.execute("SELECT * FROM pgmq.read('plain', 30, 1)").fetchall()
            time.sleep(1.2)  # the candidate's patience (50_reads.sql)
            for _ in range(300):  # its writers looked up, then the bound moved
                c.execute("SELECT * FROM pgmq.read('plain', 30, 1)").fetchall()
        assert conn.execute(head).fetchone() == (last + 1,)
    assert conn.execute(MARKER).fetchone() == (0,)


def test_a_consumer_lowering_the_bounds_reaches_no_shadow(
    users: dict[str, str], queues: tuple[str, ...], conn: Conn
) -> None:
    # set_vt lowers the queue's bounds (pgbroker._lower_head: the advancers' turn on the queue's
    # row of pgmq.meta, then its newest row of queue_head) as the owner, under the consumer's
    # search_path and shadows, a temporary queue_head among them.
    (delayed,) = [r[0] for r in conn.execute("SELECT * FROM pgmq.send('plain', '{}', 3600)")]
    conn.execute("SELECT * FROM pgmq.send('plain', '{}')")
    conn.execute("SELECT count(*) FROM pgmq.pop('plain', 100)")
    for _ in range(3):
        conn.execute("SELECT pgbroker._advance_head('plain', 'q_plain')")
    head = "SELECT (pgbroker._queue_bounds('plain')).ready_from"
    passed = conn.execute(head).fetchone()
    assert passed is not None
    assert passed[0] > delayed
    with psycopg.connect(users["consumer"], autocommit=True) as c:
        c.execute(SHADOW)
        read = "SELECT msg_id FROM pgmq.read('plain', 30, 10)"
        # Ready again (a vt before it was sent): ready_from goes back to it.
        ready_again = "SELECT count(*) FROM pgmq.set_vt('plain', %s, pg_catalog.now() - interval '1 day')"
        assert c.execute(ready_again, [delayed]).fetchone() == (1,)
        assert c.execute(read).fetchall() == [(delayed,)]
        # Delivered, then given back now: timed_from is lowered to its vt.
        given_back = "SELECT count(*) FROM pgmq.set_vt('plain', %s::bigint, 0)"
        assert c.execute(given_back, [delayed]).fetchone() == (1,)
        assert c.execute(read).fetchall() == [(delayed,)]
    assert conn.execute(MARKER).fetchone() == (0,)


# Every send of every door that takes headers, with {h} the headers of one message.
SENDS = [
    "SELECT pgmq.send('plain', '{{}}', {h})",
    "SELECT pgmq.send('plain', '{{}}', {h}, 0)",
    "SELECT pgmq.send('plain', '{{}}', {h}, now())",
    "SELECT pgmq.send_batch('plain', ARRAY['{{}}']::jsonb[], ARRAY[{h}])",
    "SELECT pgmq.send_batch('plain', ARRAY['{{}}']::jsonb[], ARRAY[{h}], 0)",
    "SELECT pgmq.send_batch('plain', ARRAY['{{}}']::jsonb[], ARRAY[{h}], now())",
    "SELECT pgmq.send_topic('plain', '{{}}', {h}, 0)",
    "SELECT pgmq.send_batch_topic('plain', ARRAY['{{}}']::jsonb[], ARRAY[{h}])",
    "SELECT pgmq.send_batch_topic('plain', ARRAY['{{}}']::jsonb[], ARRAY[{h}], 0)",
    "SELECT pgmq.send_batch_topic('plain', ARRAY['{{}}']::jsonb[], ARRAY[{h}], now())",
    "SELECT pgbroker.receive_many('plain', ARRAY['id-1'], ARRAY['{{}}']::jsonb[], ARRAY[{h}], '1 hour')",
    "SELECT pgbroker.receive_many('far', ARRAY['id-2'], ARRAY['{{}}']::jsonb[], ARRAY[{h}], '1 hour')",
    "SELECT pgmq.send('far', '{{}}', {h})",
    "SELECT pgbroker.send_idempotent('plain', 'k', ARRAY['{{}}']::jsonb[], ARRAY[{h}])",
]
RESERVED = ["x-pgbroker-dead-letter", "X-PGBROKER-DEAD-LETTER", "x-pgbroker-schedule", "x-pgbroker-stream",
            "x-pgbroker-published", "x-pgbroker-anything-new"]  # fmt: skip


@pytest.mark.parametrize("header", RESERVED)
def test_no_send_carries_a_reserved_header(
    users: dict[str, str], queues: tuple[str, ...], conn: Conn, header: str
) -> None:
    conn.execute("SELECT pgmq.bind_topic('plain', 'plain')")
    forged = sql.Literal(f'{{"{header}": {{"queue": "capped", "msg_id": 1}}}}').as_string(conn) + "::jsonb"
    with psycopg.connect(users["producer"], autocommit=True) as producer:
        for send in SENDS:
            with refused("PB007") as error:
                producer.execute(send.format(h=forged).encode())
            assert "reserved" in str(error.value), send
        # The job headers are a sender's to set.
        producer.execute("""SELECT pgmq.send('plain', '{}', '{"x-pgbroker-priority": 5}'::jsonb)""")
    conn.execute("SELECT pgbroker.create_stream('s')")
    with refused("PB007"):
        conn.execute(f"SELECT pgbroker.stream_send('s', '{{}}', {forged})")
    idempotent = f"SELECT pgbroker.stream_send_idempotent('s', 'k', ARRAY['{{}}'::jsonb], ARRAY[{forged}])"
    with refused("PB007"):
        conn.execute(idempotent)
    assert conn.execute(
        "SELECT count(*) FROM pgmq.q_plain WHERE headers ?| ARRAY[%s]", [header]
    ).fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM pgbroker.dead_letters('capped')").fetchone() == (0,)


@pytest.mark.parametrize("header", RESERVED)
def test_no_schedule_carries_a_reserved_header(conn: Conn, header: str) -> None:
    # A tick is the engine's own send, which lets the reserved headers through: a schedule's
    # headers were never checked, so whoever may add a schedule to a queue (an HTTP key with the
    # admin scope on it) forged dead letters of another queue, or a stream's retries, there.
    conn.execute("SELECT pgmq.create('jobs')")
    forged = Jsonb({header: {"queue": "capped", "msg_id": 1}})
    with refused("PB007") as error:
        conn.execute("SELECT pgbroker.schedule_add('tick', 'jobs', '* * * * *', '{}', %s)", [forged])
    assert "reserved" in str(error.value)
    conn.execute("""SELECT pgbroker.schedule_add('tick', 'jobs', '* * * * *', '{}', '{"a": 1}')""")
    with refused("PB007"):
        conn.execute(
            "SELECT pgbroker.schedule_add('tick', 'jobs', '* * * * *', '{}', %s, replace => true)", [forged]
        )
    assert conn.execute("SELECT headers FROM pgbroker.schedules").fetchall() == [({"a": 1},)]


def test_the_engines_own_headers_still_travel(conn: Conn) -> None:
    """Dead-lettering, replay and schedules write the reserved headers themselves."""
    conn.execute("SELECT pgmq.create('jobs')")
    conn.execute("SELECT pgbroker.set_policy('jobs', max_deliveries => 1)")
    conn.execute("""SELECT pgbroker.schedule_add('tick', 'jobs', '* * * * *', '{"job": 1}')""")
    conn.execute("UPDATE pgbroker.schedules SET next_run = now() - interval '1 minute'")
    conn.execute("SELECT pgbroker.schedule_tick()")
    receipt = conn.execute("SELECT receipt FROM pgbroker.read('jobs', 30, 1)").fetchone()
    assert receipt is not None
    conn.execute("SELECT pgbroker.fail('jobs', %s, 'boom')", [receipt[0]])
    letter = conn.execute("SELECT headers FROM pgbroker.dead_letters('jobs')").fetchone()
    assert letter is not None
    assert {"x-pgbroker-dead-letter", "x-pgbroker-schedule"} <= letter[0].keys()
    conn.execute("SELECT pgbroker.replay_dead_letters('jobs')")
    replayed = conn.execute("SELECT headers FROM pgmq.q_jobs").fetchall()
    assert [sorted(r[0]) for r in replayed] == [["x-pgbroker-schedule"]]


BIG = "SELECT pgmq.send('plain', jsonb_build_object('blob', repeat('x', 2000000)))"
SMALL = "SELECT pgmq.send('plain', jsonb_build_object('blob', repeat('x', 2000)))"


def test_a_session_cannot_lift_the_limits(users: dict[str, str], queues: tuple[str, ...], conn: Conn) -> None:
    role = sql.Identifier(str(conninfo_to_dict(users["producer"])["user"]))
    # A role may set its own defaults: that must not lift the limit either.
    conn.execute(sql.SQL("ALTER ROLE {} SET pgbroker.max_message_bytes = 0").format(role))
    with psycopg.connect(users["producer"], autocommit=True) as producer:
        for value in ("0", "", "99999999999"):
            producer.execute(sql.SQL("SET pgbroker.max_message_bytes = {}").format(sql.Literal(value)))
            producer.execute("SET pgbroker.route_limit = 100000")
            with refused("PB005"):
                producer.execute(BIG)
        # A session may make the limit stricter.
        producer.execute("SET pgbroker.max_message_bytes = 1000")
        with refused("PB005"):
            producer.execute(SMALL)
    # The operator's limit, for the database, holds against any session value.
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET pgbroker.max_message_bytes = 1000").format(
            sql.Identifier(conn.info.dbname)
        )
    )
    with psycopg.connect(users["producer"], autocommit=True) as producer:
        producer.execute("SET pgbroker.max_message_bytes = 0")
        with refused("PB005"):
            producer.execute(SMALL)
    assert conn.execute("SELECT count(*) FROM pgmq.q_plain WHERE message ? 'blob'").fetchone() == (0,)


def test_a_session_with_its_own_rights_takes_its_own_size_limit(dsn: str, conn: Conn) -> None:
    # Its sends run as itself, who may write the queue table directly: the catalog would guard
    # nothing, and reading it was the costly part of every send. A new session starts from the
    # database's setting.
    conn.execute("SELECT pgmq.create('plain')")
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET pgbroker.max_message_bytes = 1000").format(
            sql.Identifier(conn.info.dbname)
        )
    )
    with psycopg.connect(dsn, autocommit=True) as owner:
        with refused("PB005"):
            owner.execute(SMALL)
        owner.execute("SET pgbroker.max_message_bytes = 0")
        owner.execute(SMALL)
        owner.execute("SET pgbroker.max_message_bytes = 'lots'")
        with refused("PB007"):
            owner.execute(SMALL)
    assert conn.execute("SELECT count(*) FROM pgmq.q_plain WHERE message ? 'blob'").fetchone() == (1,)


def test_a_producer_cannot_shrink_the_routes_of_every_queue(
    users: dict[str, str], queues: tuple[str, ...], conn: Conn
) -> None:
    """The routes are the database's, written by whichever session changes a queue's policy: a
    producer does with its first prioritized send to a queue (pgbroker._prepare_job_headers). With
    its own pgbroker.route_limit of 0 it wrote routes holding no queue, and every queue of the
    database took the dynamic path for every session, until the owner's next change."""
    routed = _route_keys(conn)
    assert routed == ["plain", "capped", "limited"]
    with psycopg.connect(users["producer"], autocommit=True) as producer:
        producer.execute("SET pgbroker.route_limit = 0")
        producer.execute("""SELECT pgmq.send('plain', '{}', '{"x-pgbroker-priority": 5}'::jsonb)""")
    assert conn.execute("SELECT priorities FROM pgbroker.policy('plain')").fetchone() == (True,)
    assert _route_keys(conn) == routed
    # The owner's own session may still route fewer queues, as before.
    conn.execute("SET pgbroker.route_limit = 1")
    conn.execute("SELECT pgbroker.set_policy('capped', max_deliveries => 4)")
    assert _route_keys(conn) == ["plain"]


def test_a_hostile_session_cannot_hold_a_stream_back(users: dict[str, str], conn: Conn) -> None:
    # Any session of the database may take any advisory lock: the reads of a stream rest on none.
    # Those the engine once used to order the safe id's advances and the takers of a group, held
    # by an outsider, stopped the stream for good and kept a newcomer waiting.
    conn.execute("SELECT pgbroker.create_stream('clicks', 2)")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', 'start')")
    first = read(conn, "clicks", "g", "a", qty=10)  # a owns both partitions
    conn.execute("SET lock_timeout = '5s'")
    with psycopg.connect(users["outsider"], autocommit=True) as hostile:
        for key in ("pgbroker.stream_safe_id:clicks", "pgbroker.stream_take:clicks/g"):
            hostile.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
        ids = send(conn, "clicks", [{"n": i} for i in range(10)], [f"k{i}" for i in range(10)])
        batch = read(conn, "clicks", "g", "a", qty=10)
        assert sorted(batch.ids) == ids  # the safe id moved past the sends
        ack(conn, "clicks", "g", "a", first)
        ack(conn, "clicks", "g", "a", batch)
        assert read(conn, "clicks", "g", "b").rows == []  # b joins: nothing free yet, no wait
        assert read(conn, "clicks", "g", "a").rows == []  # a gives up what is beyond its share
        assert read(conn, "clicks", "g", "b").rows == []  # b takes it
    owners = conn.execute("SELECT owner, count(*) FROM pgbroker.stream_cursor GROUP BY owner ORDER BY 1")
    assert owners.fetchall() == [("a", 1), ("b", 1)]


def test_a_producer_cannot_poison_a_streams_acks(users: dict[str, str], conn: Conn) -> None:
    # A failed stream message is copied to its group's retry queue in the ack's transaction, by a
    # queue send that checks size and job headers. A stream send checked neither: a producer's
    # oversized message, or one with a priority that is no number, made every ack of its batch
    # fail (PB005, PB007), and the group could never move past it. Near the limit, the header the
    # retry adds (the message's place, its key, the error) must not fail the ack either.
    conn.execute("SELECT pgbroker.create_stream('clicks', 1)")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', 'start')")
    over = "jsonb_build_object('blob', repeat('x', 1100000))"
    near = "jsonb_build_object('blob', repeat('x', 1048000))"
    with psycopg.connect(users["producer"], autocommit=True) as producer:
        for call in (f"SELECT pgbroker.stream_send('clicks', {over})",
                     "SELECT pgbroker.stream_send('clicks', '{}', NULL, repeat('k', 1100000))",
                     f"SELECT pgbroker.stream_send_many('clicks', ARRAY[{over}])",
                     f"SELECT pgbroker.stream_send_idempotent('clicks', 'i', ARRAY[{over}])"):  # fmt: skip
            with refused("PB005"):
                producer.execute(call.encode())
        for job in ('{"x-pgbroker-priority": "high"}', '{"x-pgbroker-dedup-key": ""}',
                    '{"x-pgbroker-concurrency-key": 7}'):  # fmt: skip
            with refused("PB007"):
                producer.execute("SELECT pgbroker.stream_send('clicks', '{}', %s::jsonb)", [job])
        producer.execute(f"SELECT pgbroker.stream_send('clicks', {near}, NULL, 'k')".encode())
        producer.execute("""SELECT pgbroker.stream_send('clicks', '{}', '{"x-pgbroker-priority": 5}')""")
    with psycopg.connect(users["consumer"], autocommit=True) as consumer:
        batch = read(consumer, "clicks", "g", "a")
        assert len(batch.ids) == 2
        assert ack(consumer, "clicks", "g", "a", batch, failed=batch.ids, errors=["x" * 3000]) == {0: True}
    assert conn.execute("SELECT count(*) FROM pgmq.q_clicks_g_retry").fetchone() == (2,)


def test_a_consumer_cannot_copy_a_stream_to_its_retry_queue_at_will(
    users: dict[str, str], conn: Conn
) -> None:
    # The failed ids of an ack were copied to the group's retry queue if they were at or below the
    # ack's last id in a partition the consumer owned: any message ever sent, acked long ago or
    # not, as often as it was named. A consumer (an HTTP key that may read the stream) wrote a
    # megabyte message into the retry queue a thousand times a request, repeating the ack.
    conn.execute("SELECT pgbroker.create_stream('clicks', 1)")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', 'start')")
    send(conn, "clicks", [{"n": n} for n in range(4)])
    retried = (
        "SELECT array_agg((headers -> 'x-pgbroker-stream' ->> 'id')::int ORDER BY msg_id)"
        " FROM pgmq.q_clicks_g_retry"
    )
    with psycopg.connect(users["consumer"], autocommit=True) as consumer:
        first = read(consumer, "clicks", "g", "a", qty=2)
        assert first.ids == [1, 2]
        ack(consumer, "clicks", "g", "a", first, failed=[2])
        second = read(consumer, "clicks", "g", "a", qty=1)
        assert second.ids == [3]
        # Named twice, acked before (1, 2), not delivered yet (4), beyond the ack (3 at last id 2).
        parts, epochs, _ = second.ack_args()
        consumer.execute(
            "SELECT * FROM pgbroker.stream_ack('clicks', 'g', 'a', %s, %s, %s, %s)",
            (parts, epochs, [4], [3, 3, 1, 2, 4]),
        ).fetchall()
        # Again, the same ack: it settles nothing more.
        consumer.execute(
            "SELECT * FROM pgbroker.stream_ack('clicks', 'g', 'a', %s, %s, %s, %s)",
            (parts, epochs, [4], [3, 3, 1, 2, 4]),
        ).fetchall()
        # And through stream_consume, which acks and reads in one call.
        consumer.execute(
            "SELECT * FROM pgbroker.stream_consume('clicks', 'g', 'a', 1, 30, %s, %s, %s, %s)",
            (parts, epochs, [4], [1, 2, 3, 3]),
        ).fetchall()
    assert conn.execute(retried).fetchone() == ([2, 3],)


def test_a_hostile_session_cannot_hold_a_queue_head_back(users: dict[str, str], conn: Conn) -> None:
    # The same for a queue: the advance of where its reads start once took turns on an advisory
    # lock, which an outsider could hold for good; ready_from then stayed behind every message
    # consumed, and each read walked their dead entries.
    conn.execute("SELECT pgmq.create('held')")
    advance = "SELECT pgbroker._advance_head('held', 'q_held')"
    sent = conn.execute("SELECT * FROM pgmq.send_batch('held', array_fill('{}'::jsonb, ARRAY[20]))")
    ids = [r[0] for r in sent]
    with psycopg.connect(users["outsider"], autocommit=True) as hostile:
        hostile.execute("SELECT pg_advisory_lock(hashtext('pgbroker.head:q_held'))")
        conn.execute("SELECT count(*) FROM pgmq.pop('held', 15)")
        for _ in range(3):  # the head's row, then the candidates, then the bound (autocommit)
            conn.execute(advance)
        head = conn.execute("SELECT ready_from FROM pgbroker.queue_head WHERE queue_name = 'held'").fetchone()
    assert head == (ids[15],)


def test_a_hostile_session_cannot_stop_a_limited_queue(users: dict[str, str], conn: Conn) -> None:
    # The readers of a limited queue take turns: once on an advisory lock, which an outsider held
    # to stop every read of the queue (each waited for it for good).
    conn.execute("SELECT pgmq.create('capped_in_flight')")
    conn.execute("SELECT pgbroker.set_policy('capped_in_flight', max_in_flight => 5)")
    conn.execute("SELECT pgmq.send_batch('capped_in_flight', array_fill('{}'::jsonb, ARRAY[10]))")
    conn.execute("SET lock_timeout = '5s'")
    with psycopg.connect(users["outsider"], autocommit=True) as hostile:
        hostile.execute("SELECT pg_advisory_lock(hashtext('pgbroker.limits:q_capped_in_flight'))")
        read = conn.execute("SELECT count(*) FROM pgmq.read('capped_in_flight', 30, 10)").fetchone()
        popped = conn.execute("SELECT count(*) FROM pgmq.pop('capped_in_flight', 2)").fetchone()
    assert (read, popped) == ((5,), (2,))


def test_a_hostile_session_cannot_stop_maintenance(users: dict[str, str], conn: Conn) -> None:
    # Two upkeep jobs took turns on advisory try-locks, which an outsider could hold for good: the
    # rotation of the stream positions' ring (without it the ring grows by a row a partition a
    # read, for ever) and the sampler of the queues' history (no samples, stale workers kept).
    conn.execute("SELECT pgmq.create('sampled')")
    conn.execute("SELECT pgbroker.create_stream('ringed', 2)")
    conn.execute("SELECT pgbroker.create_stream_group('ringed', 'g', 'start')")
    with psycopg.connect(users["outsider"], autocommit=True) as hostile:
        for key in ("pgbroker.stream_positions_rotate", "pgbroker.queue_history"):
            hostile.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
        rotated = [conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() for _ in range(2)]
        sampled = conn.execute("SELECT pgbroker.sample_queue_history('0 s', '1 day')").fetchone()
    assert rotated == [(True,), (True,)]
    assert sampled is not None
    assert sampled[0] >= 1


def test_a_hostile_session_cannot_hold_up_the_changes_of_a_queue(users: dict[str, str], conn: Conn) -> None:
    # A queue's changes took turns on an advisory lock keyed by its name, which an outsider could
    # hold for good: every policy change, pause, notification switch and drop of the queue (and
    # the upkeep of its partitions) then waited for ever. They now take the queue's row. So did
    # every rewrite of the routes (a create, a drop, a policy change: any queue's).
    conn.execute("SELECT pgmq.create('kept')")
    conn.execute("SET lock_timeout = '5s'")
    with psycopg.connect(users["outsider"], autocommit=True) as hostile:
        for key in ("pgbroker.queue:kept", "pgbroker.routes"):
            hostile.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
        conn.execute("SELECT pgmq.create('another')")  # a new queue rewrites the routes
        conn.execute("SELECT pgbroker.set_policy('kept', max_deliveries => 3)")
        conn.execute("SELECT pgbroker.pause('kept')")
        conn.execute("SELECT pgmq.enable_notify_insert('kept')")
        conn.execute("SELECT pgmq.create_fifo_index('kept')")
        conn.execute("SELECT pgmq.disable_notify_insert('kept')")
        assert conn.execute("SELECT pgmq.drop_queue('kept')").fetchone() == (True,)


def test_a_consumer_holding_its_queue_back_holds_no_other_queues_upkeep_back(
    users: dict[str, str], pconn: Conn
) -> None:
    # A consumer's set_vt takes its queue's turn (the queue's row of pgmq.meta) to the end of its
    # transaction, which the consumer may keep open. The upkeep of every partitioned queue at once
    # waited for that row within its lock_timeout, then failed whole: no queue had its partitions
    # made ahead while one consumer of one queue sat in a transaction.
    for name in ("busy", "other"):
        pconn.execute("SELECT pgmq.create_partitioned(%s, '10', '100000', 2)", [name])
    pconn.execute("SELECT pgmq.send_batch('busy', ARRAY['{}'::jsonb])")
    pconn.execute("SELECT pgmq.send_batch('other', array_fill('{}'::jsonb, ARRAY[45]))")
    partitions = "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgmq.q_other'::regclass"
    before = pconn.execute(partitions).fetchone()
    with psycopg.connect(users["consumer"]) as consumer:  # a transaction left open
        consumer.execute("SELECT pgmq.set_vt('busy', 1, 30)")
        rows = pconn.execute("SELECT queue, action FROM pgbroker.run_maintenance(NULL, 100)").fetchall()
    assert ("busy", "deferred") in rows
    after = pconn.execute(partitions).fetchone()
    assert before is not None
    assert after is not None
    assert after[0] > before[0]


def test_a_consumer_cannot_archive_a_publish_record_past_the_size_limit(
    users: dict[str, str], conn: Conn
) -> None:
    # pgbroker.ack_published (an outbound bridge's ack) writes the consumer's publish record into
    # the archived message's headers, and nothing bounded it: a consumer wrote as much as it liked
    # into the archive with every message it acked, past the limit every send is held to.
    conn.execute("SELECT pgmq.create('outbox')")
    conn.execute("SELECT pgmq.send('outbox', '{}')")
    hostile = (
        "SELECT pgbroker.ack_published('outbox', %s, ARRAY[jsonb_build_object('r', repeat('x', 1100000))])"
    )
    with psycopg.connect(users["consumer"], autocommit=True) as consumer:
        row = consumer.execute("SELECT receipt FROM pgbroker.read('outbox', 30, 1)").fetchone()
        assert row is not None
        with refused("PB005"):
            consumer.execute(hostile, [[row[0]]])
        acked = consumer.execute(
            "SELECT pgbroker.ack_published('outbox', %s, ARRAY[jsonb_build_object('routing_key', 'k')])",
            [[row[0]]],
        ).fetchall()
    assert acked == [(1,)]


# Beats (and a read) of so many consumers named a prefix and 1..n of group g of stream clicks.
BEAT = (
    "SELECT count(*) FROM generate_series(1, %s) i,"
    " pgbroker.stream_heartbeat('clicks', 'g', %s || i, 3600, true)"
)
BEAT_READ = BEAT.replace("stream_heartbeat", "stream_read").replace("3600", "1, 3600, NULL")


def _clicks_group(conn: Conn) -> None:
    conn.execute("SELECT pgbroker.create_stream('clicks', 2)")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', 'start')")


def test_a_consumer_cannot_register_a_groups_consumers_without_end(users: dict[str, str], conn: Conn) -> None:
    # Every read or beat under a new consumer name registered a member of the group, live for its
    # lease (up to a day), with nothing bounding them: an HTTP key that may read a stream made
    # members by the million, which every read of the group aggregated and every look at the
    # workers panel (/v1/workers, whatever streams its key sees) read. A group has at most 1,000.
    _clicks_group(conn)
    with psycopg.connect(users["consumer"], autocommit=True) as consumer:
        consumer.execute(BEAT, (1000, "c"))
        for call in (BEAT, BEAT_READ):
            with refused("PB007"):
                consumer.execute(call, (1, "d"))
        consumer.execute(BEAT, (1000, "c"))  # the members there renew as before
    assert conn.execute("SELECT count(*) FROM pgbroker.stream_consumer").fetchone() == (1000,)


def test_a_consumer_cannot_pass_the_groups_limit_by_renewing_lapsed_members(
    users: dict[str, str], conn: Conn
) -> None:
    # The limit of 1,000 live members was checked when a name was new only. A member whose lease
    # ran out is not live and does not count, but its row stays (for a lease and a minute), and a
    # beat under its name made it live again unchecked: 1,000 members, lapsed, then 1,000 new ones,
    # then the first renewed, and so on, gave a group as many live members as the caller liked.
    _clicks_group(conn)
    live = "SELECT count(*) FROM pgbroker.stream_consumer WHERE expires_at > now()"
    lapse = (
        "UPDATE pgbroker.stream_consumer SET expires_at = now() - interval '1 second' WHERE consumer LIKE %s"
    )
    with psycopg.connect(users["consumer"], autocommit=True) as consumer:
        consumer.execute(BEAT, (1000, "c"))
        conn.execute(lapse, ("c%",))
        consumer.execute(BEAT, (1000, "d"))  # the c's lapsed: room for as many others
        for call in (BEAT, BEAT_READ):
            with refused("PB007"):
                consumer.execute(call, (1000, "c"))
        assert conn.execute(live).fetchone() == (1000,)
        consumer.execute(BEAT, (1000, "d"))  # the live members renew as before
        conn.execute(lapse, ("d1",))  # a lapsed member comes back once there is room again
        consumer.execute(BEAT, (1, "c"))
    assert conn.execute(live).fetchone() == (1000,)


def test_a_consumer_cannot_fill_the_workers_panel(users: dict[str, str], conn: Conn) -> None:
    # A consumer registers its queue's workers (pgbroker.worker_heartbeat), one row each for a
    # minute. Nothing bounded them: one statement registered a million made-up workers, and every
    # look at the panel (pgbroker.queue_workers, the API's /v1/workers, whichever queues its key
    # sees) read them all. A queue has at most 1,000 workers registered at once.
    conn.execute("SELECT pgmq.create('jobs')")
    beat = "SELECT count(pgbroker.worker_heartbeat('jobs', gen_random_uuid(), 'h', 1, 1, 0, 0, 0, 0))"
    with psycopg.connect(users["consumer"], autocommit=True) as consumer:
        consumer.execute(f"{beat} FROM generate_series(1, 1000)".encode())
        with refused("PB007"):
            consumer.execute(f"{beat} FROM generate_series(1, 5)".encode())
        # The workers there renew their rows as before.
        worker = conn.execute("SELECT worker_id FROM pgbroker.queue_workers LIMIT 1").fetchone()
        assert worker is not None
        consumer.execute("SELECT pgbroker.worker_heartbeat('jobs', %s, 'h', 1, 1, 0, 0, 0, 0)", worker)
    assert conn.execute("SELECT count(*) FROM pgbroker.queue_workers").fetchone() == (1000,)


def test_a_monitor_reads_the_statements_of_its_own_sessions_only(
    users: dict[str, str], dsn: str, conn: Conn
) -> None:
    # pgbroker.blocking_sessions runs as its owner, who sees every session's statement in
    # pg_stat_activity: a monitor read another role's last statement there, a payload written in
    # it included, while pg_stat_activity itself answered it "<insufficient privilege>". It sees
    # its own sessions' statements, and the owner every session's, as before.
    secret = uuid.uuid4().hex
    conn.execute("SELECT pgmq.create('jobs')")
    listed = "SELECT pid, query FROM pgbroker.blocking_sessions('0 seconds')"
    with (
        psycopg.connect(dsn) as victim,
        psycopg.connect(users["monitor"]) as own,
        psycopg.connect(users["monitor"], autocommit=True) as monitor,
    ):
        victim.execute(f"""SELECT pgmq.send('jobs', '{{"card": "{secret}"}}')""".encode())
        own.execute(b"SELECT 'my own statement', txid_current()")
        seen: dict[int, str] = dict(monitor.execute(listed).fetchall())
        assert seen[victim.info.backend_pid] == "<insufficient privilege>"
        assert seen[own.info.backend_pid] == "SELECT 'my own statement', txid_current()"
        everything = monitor.execute("SELECT * FROM pgbroker.blocking_sessions('0 seconds')").fetchall()
        assert secret not in str(everything)
        assert secret in dict(conn.execute(listed).fetchall())[victim.info.backend_pid]


def test_a_hostile_session_cannot_hold_up_the_changes_of_a_stream(users: dict[str, str], conn: Conn) -> None:
    # As for queues: a stream's changes took turns on an advisory lock keyed by its name, and an
    # outsider holding it held up every service that makes its stream and group at start.
    conn.execute("SELECT pgbroker.create_stream('kept_stream', 2)")
    conn.execute("SET lock_timeout = '5s'")
    with psycopg.connect(users["outsider"], autocommit=True) as hostile:
        for key in ("pgbroker.stream:kept_stream", "pgbroker.stream_send_router"):
            hostile.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
        conn.execute("SELECT pgbroker.create_stream('kept_stream', 2)")  # as a service starting
        conn.execute("SELECT pgbroker.create_stream('another_stream', 2)")  # rewrites the send router
        conn.execute("SELECT pgbroker.create_stream_group('kept_stream', 'g', 'start')")
        assert conn.execute("SELECT pgbroker.drop_stream('kept_stream')").fetchone() == (True,)


def test_prune_windows_are_validated_and_scoped(
    users: dict[str, str], queues: tuple[str, ...], conn: Conn
) -> None:
    for queue in ("plain", "far"):
        conn.execute(
            "SELECT pgbroker.receive_many(%s, ARRAY['a'], ARRAY['{}']::jsonb[], ARRAY[NULL::jsonb], '1 day')",
            [queue],
        )
    conn.execute("UPDATE pgbroker.inbound_seen SET seen_at = now() - interval '2 hours'")
    with psycopg.connect(users["producer"], autocommit=True) as producer:
        for window, batch in (("-1 year", 10), ("0", 10), ("59 seconds", 10), (None, 10), ("1 hour", 0),
                              ("1 hour", 10_000_000)):  # fmt: skip
            with refused("PB007"):
                producer.execute("SELECT pgbroker.prune_inbound_seen(%s::interval, %s)", [window, batch])
        assert producer.execute("SELECT pgbroker.prune_inbound_seen('1 hour', 10, 'far')").fetchone() == (1,)
    assert conn.execute("SELECT queue_name FROM pgbroker.inbound_seen").fetchall() == [("plain",)]
    with refused("PB007"):
        conn.execute("SELECT pgbroker.prune_stream_inbound_seen('-1 year')")


@pytest.mark.parametrize("name", ["a b", "tab\there", "nbsp\u00a0x", "trailing ", "line\nbreak"])
def test_names_with_whitespace_are_refused(conn: Conn, name: str) -> None:
    for create in ("SELECT pgmq.create(%s)", "SELECT pgbroker.create_stream(%s)"):
        with refused("PB001"):
            conn.execute(create, [name])


def test_an_existing_odd_name_does_not_break_the_route_writer(conn: Conn) -> None:
    """A queue named before names were checked for whitespace keeps working, and so do creates,
    drops and policies of others."""
    conn.execute("SELECT pgmq.create('odd')")
    conn.execute('ALTER TABLE pgmq.q_odd RENAME TO "q_o d"')
    conn.execute('ALTER TABLE pgmq.a_odd RENAME TO "a_o d"')
    conn.execute("UPDATE pgmq.meta SET queue_name = 'o d' WHERE queue_name = 'odd'")  # rewrites the routes
    conn.execute("SELECT pgmq.create('next')")
    conn.execute("SELECT pgbroker.set_policy('next', max_deliveries => 2)")
    conn.execute("SELECT pgmq.send('o d', '{\"n\": 1}')")
    read = conn.execute("SELECT message, receipt FROM pgbroker.read('o d', 30, 1)").fetchall()
    assert [r[0] for r in read] == [{"n": 1}]
    assert conn.execute("SELECT * FROM pgbroker.ack('o d', %s::text[], true)", [[read[0][1]]]).fetchall()
    conn.execute("SELECT pgmq.drop_queue('next')")


def test_pg_monitor_reads_no_payload_unless_the_operator_allows_it(
    conn: Conn, dsn: str, pg_admin_dsn: str
) -> None:
    user = f"mon_{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE pg_monitor").format(sql.Identifier(user)))
    try:
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("""SELECT pgmq.send('jobs', '{"secret": 1}')""")
        monitor_dsn = make_conninfo(dsn, user=user)

        def can_read_payloads() -> bool:
            with psycopg.connect(monitor_dsn, autocommit=True) as monitor:
                assert monitor.execute("SELECT queue_name FROM pgmq.meta").fetchall() == [("jobs",)]
                try:
                    monitor.execute("SELECT message FROM pgmq.q_jobs")
                except psycopg.errors.InsufficientPrivilege:
                    return False
                return True

        assert not can_read_payloads()
        conn.execute("SELECT pgbroker.grant_pg_monitor_payloads(true)")
        assert can_read_payloads()
        conn.execute("SELECT pgbroker.grant_pg_monitor_payloads(false)")
        assert not can_read_payloads()
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(user)))
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(user)))
