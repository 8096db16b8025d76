"""Cron schedules in the engine (sql/functions/78_schedules.sql): the cron grammar, next ticks in
time zones across daylight saving changes, one message per tick however many schedulers tick at
once, catching up on the last missed tick only, pause and resume, refused sends, and the
Scheduler loop of the clients.

Ticks are driven with explicit times (pgbroker.schedule_tick(as_of)), so these tests do not wait
for the clock; tests/system/test_scheduler_processes.py runs real scheduler processes on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pgbroker import Broker, Queue
from pgbroker.embedded import EmbeddedPostgres
from pgbroker.errors import InvalidArgument, QueueNotFound
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.schedules._scheduler import Scheduler
from tests.support.faults import freezable, impatient, sessions_frozen, table_locked, terminate_sessions
from tests.support.roles import role_logins
from tests.support.tables import Conn


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def ticks(conn: Conn, cron: str, timezone: str, start: datetime, n: int) -> list[str]:
    """The next n ticks after start, as wall-clock times in the zone with their UTC offset."""
    out = []
    moment = start
    for _ in range(n):
        row = conn.execute(
            "SELECT t, to_char(t AT TIME ZONE %s, 'YYYY-MM-DD HH24:MI')"
            " FROM pgbroker.cron_next(%s, %s, %s) t",
            [timezone, cron, timezone, moment],
        ).fetchone()
        assert row is not None
        moment = row[0]
        out.append(f"{row[1]} ({moment.astimezone(UTC):%H:%MZ})")
    return out


# -- the cron grammar ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "after", "expected"),
    [
        ("*/5 * * * *", "2024-06-03 10:02", "2024-06-03 10:05"),
        ("0 9 * * mon-fri", "2024-06-07 10:00", "2024-06-10 09:00"),  # Friday after 9: Monday
        ("30 8 1 jan,jul *", "2024-01-02 00:00", "2024-07-01 08:30"),
        ("0 0 29 2 *", "2024-03-01 00:00", "2028-02-29 00:00"),
        ("0 0 1,15 * wed", "2024-06-02 00:00", "2024-06-05 00:00"),  # both days restricted: either
        ("0 0 * * 7", "2024-06-03 00:00", "2024-06-09 00:00"),  # 7 is Sunday
        ("5/20 */6 * * *", "2024-06-03 00:30", "2024-06-03 00:45"),
        ("10-20/5 1-2 * * *", "2024-06-03 01:16", "2024-06-03 01:20"),
        ("@hourly", "2024-06-03 10:59", "2024-06-03 11:00"),
        ("@weekly", "2024-06-03 10:00", "2024-06-09 00:00"),
        ("@monthly", "2024-06-03 10:00", "2024-07-01 00:00"),
    ],
)
def test_cron_next_follows_the_fields(conn: Conn, cron: str, after: str, expected: str) -> None:
    row = conn.execute("SELECT pgbroker.cron_next(%s, 'UTC', %s)", [cron, utc(after)]).fetchone()
    assert row is not None
    assert row[0] == utc(expected)


@pytest.mark.parametrize(
    ("cron", "problem"),
    [
        ("* * * *", "expected 5 fields, got 4"),
        ("60 * * * *", "minute: 60 is outside 0-59"),
        ("* 24 * * *", "hour: 24 is outside 0-23"),
        ("* * 0 * *", "day of month: 0 is outside 1-31"),
        ("* * * foo *", "month: 'foo' is not a value"),
        ("* * * * 8", "day of week: 8 is outside 0-7"),
        ("*/0 * * * *", "minute: a step must be at least 1"),
        ("5-1 * * * *", "minute: range 5-1 runs backwards"),
        ("1,,2 * * * *", "minute: cannot read ''"),
    ],
)
def test_a_bad_cron_expression_is_refused_with_what_is_wrong(
    broker: Broker, queue: Queue, cron: str, problem: str
) -> None:
    with pytest.raises(InvalidArgument, match=problem) as caught:
        broker.add_schedule("s", queue.name, cron, {})
    assert caught.value.hint is not None
    assert "Five fields" in caught.value.hint
    assert broker.schedules() == []


def test_a_schedule_that_never_fires_is_refused(broker: Broker, queue: Queue) -> None:
    with pytest.raises(InvalidArgument, match="never fires"):
        broker.add_schedule("feb30", queue.name, "0 0 30 2 *", {})


@pytest.mark.parametrize(
    ("name", "queue_name", "timezone", "headers", "error", "problem"),
    [
        ("bad name", "jobs", "UTC", None, InvalidArgument, "invalid schedule name"),
        ("ok", "missing", "UTC", None, QueueNotFound, 'queue "missing" does not exist'),
        ("ok", "jobs", "Mars/Olympus", None, InvalidArgument, "unknown time zone 'Mars/Olympus'"),
        ("ok", "jobs", "EST5EDT,M3.2.0,M11.1.0", None, InvalidArgument, "unknown time zone"),
        ("ok", "jobs", "UTC", [1], InvalidArgument, "headers must be a mapping"),
    ],
)
def test_bad_schedule_arguments_are_refused_and_change_nothing(
    broker: Broker,
    queue: Queue,
    name: str,
    queue_name: str,
    timezone: str,
    headers: object,
    error: type[Exception],
    problem: str,
) -> None:
    with pytest.raises(error, match=problem):
        broker.add_schedule(name, queue_name, "* * * * *", {}, timezone=timezone, headers=headers)  # type: ignore[arg-type]
    assert broker.schedules() == []


# -- daylight saving time ----------------------------------------------------------------------


def test_a_frequent_schedule_keeps_real_time_through_the_repeated_hour(conn: Conn) -> None:
    # New York, 2024-11-03: 02:00 EDT becomes 01:00 EST; 01:00-01:59 happens twice.
    assert ticks(conn, "*/30 * * * *", "America/New_York", utc("2024-11-03 04:10"), 6) == [
        "2024-11-03 00:30 (04:30Z)",
        "2024-11-03 01:00 (05:00Z)",
        "2024-11-03 01:30 (05:30Z)",
        "2024-11-03 01:00 (06:00Z)",
        "2024-11-03 01:30 (06:30Z)",
        "2024-11-03 02:00 (07:00Z)",
    ]


def test_a_fixed_time_in_the_repeated_hour_fires_once(conn: Conn) -> None:
    assert ticks(conn, "30 1 * * *", "America/New_York", utc("2024-11-02 12:00"), 2) == [
        "2024-11-03 01:30 (05:30Z)",  # the first 01:30 (EDT)
        "2024-11-04 01:30 (06:30Z)",
    ]


def test_a_time_skipped_by_the_clocks_going_forward_fires_after_the_change(conn: Conn) -> None:
    # New York, 2024-03-10: 02:00 EST becomes 03:00 EDT; 02:30 does not exist that day.
    assert ticks(conn, "30 2 * * *", "America/New_York", utc("2024-03-09 12:00"), 2) == [
        "2024-03-10 03:30 (07:30Z)",
        "2024-03-11 02:30 (06:30Z)",
    ]
    assert ticks(conn, "*/30 * * * *", "America/New_York", utc("2024-03-10 06:10"), 3) == [
        "2024-03-10 01:30 (06:30Z)",
        "2024-03-10 03:00 (07:00Z)",
        "2024-03-10 03:30 (07:30Z)",
    ]


def test_ticks_are_wall_clock_times_of_the_zone(conn: Conn) -> None:
    # 09:00 in Berlin is 07:00Z in summer and 08:00Z in winter.
    assert ticks(conn, "0 9 * * *", "Europe/Berlin", utc("2024-10-26 12:00"), 2) == [
        "2024-10-27 09:00 (08:00Z)",
        "2024-10-28 09:00 (08:00Z)",
    ]
    assert ticks(conn, "0 9 * * *", "Europe/Berlin", utc("2024-10-25 12:00"), 1) == [
        "2024-10-26 09:00 (07:00Z)"
    ]


# -- ticks -----------------------------------------------------------------------------------------


def next_run(broker: Broker, name: str) -> datetime:
    [schedule] = [s for s in broker.schedules() if s.name == name]
    return schedule.next_run


def test_each_tick_sends_one_message_with_the_tick_in_its_headers(broker: Broker, queue: Queue) -> None:
    added = broker.add_schedule(
        "report", queue.name, "*/5 * * * *", {"kind": "report"}, headers={"team": "ops"}
    )
    first = added.next_run
    assert first > datetime.now(UTC)
    assert first.minute % 5 == 0
    assert first.second == 0
    assert broker.run_due_schedules(first - timedelta(seconds=1)) == []
    [tick] = broker.run_due_schedules(first)
    assert (tick.schedule_name, tick.tick, tick.error) == ("report", first, None)
    assert broker.run_due_schedules(first + timedelta(minutes=1)) == []  # the same tick: sent already
    [sent] = queue.peek()
    assert sent.msg_id == tick.msg_id
    assert sent.message == {"kind": "report"}
    assert sent.headers == {
        "team": "ops",
        "x-pgbroker-schedule": {"name": "report", "tick": first.strftime("%Y-%m-%dT%H:%M:%SZ")},
    }
    [schedule] = broker.schedules()
    assert (schedule.last_run, schedule.last_msg_id, schedule.next_run) == (
        first,
        tick.msg_id,
        first + timedelta(minutes=5),
    )


def test_a_scheduler_that_was_away_sends_the_last_missed_tick_only(broker: Broker, queue: Queue) -> None:
    first = broker.add_schedule("every-minute", queue.name, "* * * * *", "tick").next_run
    away_until = first + timedelta(hours=5, minutes=7, seconds=30)
    [tick] = broker.run_due_schedules(away_until)
    assert tick.tick == first + timedelta(hours=5, minutes=7)
    assert next_run(broker, "every-minute") == first + timedelta(hours=5, minutes=8)
    assert len(queue.peek(100)) == 1
    # A rare schedule too: a monthly one found 3 months late sends the third month's tick.
    monthly = broker.add_schedule("monthly", queue.name, "0 0 1 * *", "month").next_run
    broker.remove_schedule("every-minute")
    [tick] = broker.run_due_schedules(monthly + timedelta(days=95))
    assert tick.tick.month == (monthly.month + 3 - 1) % 12 + 1
    assert tick.tick.day == 1


def test_concurrent_tickers_send_each_tick_exactly_once(dsn: str, broker: Broker, queue: Queue) -> None:
    first = broker.add_schedule("race", queue.name, "* * * * *", {}).next_run
    for other in range(3):
        broker.add_schedule(f"race-{other}", queue.name, "* * * * *", {})
    sent: list[tuple[str, datetime]] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def ticker() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for minute in range(30):
                start.wait() if minute == 0 else None
                rows = conn.execute(
                    "SELECT schedule_name, tick FROM pgbroker.schedule_tick(%s)",
                    [first + timedelta(minutes=minute)],
                ).fetchall()
                with lock:
                    sent.extend(rows)

    threads = [threading.Thread(target=ticker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(sent) == len(set(sent))
    assert len(queue.peek(1000)) == len(sent)
    # Every schedule's last tick was sent; a tick may be caught up (one for several) only when
    # every ticker moved past it before one sent it, never twice.
    for name in ["race", "race-0", "race-1", "race-2"]:
        assert (name, first + timedelta(minutes=29)) in sent


def test_a_tick_held_by_a_scheduler_is_sent_by_another_when_the_first_dies(
    dsn: str, broker: Broker, queue: Queue
) -> None:
    first = broker.add_schedule("held", queue.name, "* * * * *", {}).next_run
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT * FROM pgbroker.schedule_tick(%s)", [first])  # sent, not committed
        assert broker.run_due_schedules(first) == []  # skipped: held by the other
        holder.rollback()  # the holder dies mid-tick
    [tick] = broker.run_due_schedules(first)
    assert tick.tick == first
    assert len(queue.peek()) == 1


def test_a_paused_schedule_sends_nothing_and_resumes_from_the_next_tick(broker: Broker, queue: Queue) -> None:
    first = broker.add_schedule("p", queue.name, "* * * * *", {}).next_run
    assert broker.pause_schedule("p").paused
    assert broker.pause_schedule("p").paused  # idempotent
    assert broker.run_due_schedules(first + timedelta(hours=1)) == []
    assert broker.schedule_next_wake() is None
    resumed = broker.resume_schedule("p")
    assert not resumed.paused
    assert resumed.next_run > datetime.now(UTC)
    assert broker.resume_schedule("p") == resumed  # resuming a running schedule changes nothing
    assert queue.peek() == []
    with pytest.raises(InvalidArgument, match='schedule "nope" does not exist'):
        broker.pause_schedule("nope")


def test_a_refused_send_is_recorded_and_the_schedule_moves_on(broker: Broker, queue: Queue) -> None:
    first = broker.add_schedule("full", queue.name, "* * * * *", {}).next_run
    queue.set_policy(max_depth=1)
    queue.send("filler")
    [tick] = broker.run_due_schedules(first)
    assert tick.msg_id is None
    assert tick.error is not None
    assert "max_depth" in tick.error
    [schedule] = broker.schedules()
    assert schedule.last_error == tick.error
    assert schedule.next_run == first + timedelta(minutes=1)
    broker.drop_queue(queue.name)
    [tick] = broker.run_due_schedules(first + timedelta(minutes=1))
    assert tick.error is not None
    assert "does not exist" in tick.error


def test_add_replace_and_remove(broker: Broker, queue: Queue) -> None:
    broker.add_schedule("s", queue.name, "* * * * *", 1)
    with pytest.raises(InvalidArgument, match='schedule "s" already exists'):
        broker.add_schedule("s", queue.name, "*/2 * * * *", 2)
    replaced = broker.add_schedule("s", queue.name, "0 12 * * *", 2, timezone="Asia/Tokyo", replace=True)
    assert (replaced.cron, replaced.timezone, replaced.message) == ("0 12 * * *", "Asia/Tokyo", 2)
    assert replaced.next_run.astimezone(UTC).hour == 3  # noon in Tokyo
    assert broker.remove_schedule("s") is True
    assert broker.remove_schedule("s") is False
    assert broker.schedules() == []


# -- the scheduler loop ---------------------------------------------------------------------------


def test_the_scheduler_wakes_when_a_schedule_is_added_and_sends_its_tick(dsn: str, queue: Queue) -> None:
    async def scenario() -> float:
        async with AsyncBroker(dsn) as broker:
            scheduler = Scheduler()
            running = asyncio.create_task(scheduler.run(broker))
            await asyncio.sleep(0.5)  # asleep: no schedules at all (it would sleep 30 s)
            # A schedule whose first tick is already due (as if added long ago): the NOTIFY of
            # the change wakes the scheduler at once.
            async with broker.connection() as conn:
                await conn.execute(
                    "SELECT pgbroker.schedule_add('now', 'jobs', '* * * * *', '{}');"
                    " UPDATE pgbroker.schedules"
                    " SET next_run = now() - interval '1 second', updated_at = now()"
                )
            loop = asyncio.get_running_loop()
            started = loop.time()
            while not await broker.queue("jobs").peek():
                await asyncio.sleep(0.02)
                assert loop.time() - started < 5
            scheduler.stop()
            await running
            assert scheduler.stats.sent == 1
            return loop.time() - started

    assert asyncio.run(scenario()) < 5


def test_the_scheduler_stops_alone_on_a_database_without_schedules(empty_dsn: str) -> None:
    """A worker on a database not yet upgraded keeps running: only its scheduler stops."""

    async def scenario() -> None:
        async with AsyncBroker(empty_dsn) as broker:
            await asyncio.wait_for(Scheduler().run(broker), timeout=10)

    asyncio.run(scenario())


def test_a_scheduler_under_a_role_that_may_not_run_schedules_stops_saying_who_may(
    dsn: str, conn: Conn, pg_admin_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every worker runs a scheduler: one running as a consumer warned '(this role may not run
    schedules)' at every start, saying neither who sends the schedules nor how to leave it out."""
    caplog.set_level(logging.WARNING, logger="pgbroker.scheduler")

    async def scenario(consumer_dsn: str) -> None:
        async with AsyncBroker(consumer_dsn) as broker:
            await asyncio.wait_for(Scheduler().run(broker), timeout=30)

    with role_logins(dsn, conn, pg_admin_dsn) as logins:
        asyncio.run(scenario(logins["consumer"]))
    [stopped] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scheduler.stopped")]
    assert "as the role that ran pgbroker install" in stopped
    assert "pgbroker worker --no-scheduler" in stopped


def test_the_scheduler_outlives_a_pool_that_found_no_connection_in_time(dsn: str, queue: Queue) -> None:
    """Every pooled connection is busy past the pool's timeout (PoolTimeout, no PgbrokerError):
    the scheduler waits and tries again, and sends the tick once a connection is free."""

    async def scenario() -> None:
        async with AsyncBroker(dsn, max_connections=1, pool_timeout=0.5) as broker:
            async with broker.connection() as busy:
                await busy.execute(
                    "SELECT pgbroker.schedule_add('now', 'jobs', '* * * * *', '{}');"
                    " UPDATE pgbroker.schedules SET next_run = now() - interval '1 second'"
                )
                scheduler = Scheduler()
                running = asyncio.create_task(scheduler.run(broker))
                await asyncio.sleep(2)  # its calls time out meanwhile
            loop = asyncio.get_running_loop()
            started = loop.time()
            while not await broker.queue("jobs").peek():
                assert not running.done(), running.exception()
                assert loop.time() - started < 30
                await asyncio.sleep(0.05)
            scheduler.stop()
            await running
            assert scheduler.stats.errors >= 1

    asyncio.run(scenario())


def test_the_scheduler_rides_out_a_lock_timeout_and_cut_sessions(dsn: str, queue: Queue) -> None:
    """Watchdog (issue 23, item 2): a role with a 200 ms lock_timeout while a maintenance
    transaction locks pgbroker.schedules, then every session of the database terminated; the
    scheduler waits, retries, and sends a tick that fell due meanwhile."""

    async def scenario() -> None:
        async with AsyncBroker(impatient(dsn), max_connections=2) as broker:
            scheduler = Scheduler(max_sleep=0.5)
            running = asyncio.create_task(scheduler.run(broker))

            def faults() -> None:
                with table_locked(dsn, "pgbroker.schedules"):
                    time.sleep(3)  # the scheduler's calls meet the lock meanwhile
                terminate_sessions(dsn)
                add_a_due_schedule(dsn)

            await asyncio.to_thread(faults)
            assert not running.done(), running.exception()
            loop = asyncio.get_running_loop()
            started = loop.time()
            while not await broker.queue("jobs").peek():
                assert not running.done(), running.exception()
                assert loop.time() - started < 60
                await asyncio.sleep(0.05)
            scheduler.stop()
            await running
            assert scheduler.stats.errors >= 1  # the faults were met

    asyncio.run(scenario())


def test_the_scheduler_rides_out_a_server_restart(cluster: EmbeddedPostgres) -> None:
    """Watchdog (issue 23, item 2): Postgres restarts under a running scheduler (every session
    and its LISTEN connection cut, connections refused a while); it retries, and sends a tick
    that falls due after the restart."""
    dsn = cluster.dsn()
    with Broker(dsn) as broker:
        broker.create_queue("jobs")

    async def scenario() -> None:
        async with AsyncBroker(dsn, max_connections=2) as broker:
            scheduler = Scheduler(max_sleep=0.5)
            running = asyncio.create_task(scheduler.run(broker))
            await asyncio.sleep(1)
            await asyncio.to_thread(cluster.restart)
            await asyncio.sleep(1)
            assert not running.done(), running.exception()
            await asyncio.to_thread(add_a_due_schedule, cluster.dsn())
            loop = asyncio.get_running_loop()
            started = loop.time()
            while not await broker.queue("jobs").peek():
                assert not running.done(), running.exception()
                assert loop.time() - started < 60
                await asyncio.sleep(0.05)
            scheduler.stop()
            await running

    asyncio.run(scenario())


def test_the_scheduler_gives_up_on_sessions_that_hang_and_sends_the_tick(
    dsn: str, queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """Every session the scheduler holds stops answering (its backends frozen with SIGSTOP, as a
    hung server, a stuck pooler or a network that drops packets without a word would leave them),
    then a tick falls due: the scheduler gives its call up (warned) and sends the tick on a new
    session, once. It waited for the answer for as long as the hang lasted (for good behind a
    stuck pooler), saying nothing and sending no tick."""
    caplog.set_level(logging.WARNING, logger="pgbroker.scheduler")

    async def scenario() -> None:
        async with AsyncBroker(freezable(dsn), max_connections=2) as broker:
            scheduler = Scheduler(max_sleep=0.5, answer_within=2)
            running = asyncio.create_task(scheduler.run(broker))
            await asyncio.sleep(1)  # listening, and asking now and then
            with sessions_frozen(dsn) as frozen:
                assert frozen
                await asyncio.to_thread(add_a_due_schedule, dsn)
                loop = asyncio.get_running_loop()
                started = loop.time()
                while not await asyncio.to_thread(queue.peek):
                    assert not running.done(), running.exception()
                    assert loop.time() - started < 60, "no tick sent while the sessions hang"
                    await asyncio.sleep(0.05)
            scheduler.stop()
            await asyncio.wait_for(running, 60)
            assert scheduler.stats.sent == 1

    asyncio.run(scenario())
    assert any(r.getMessage().startswith("scheduler.retry") for r in caplog.records)
    assert len(queue.peek(10)) == 1


def add_a_due_schedule(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pgbroker.schedule_add('now', 'jobs', '* * * * *', '{}');"
            " UPDATE pgbroker.schedules SET next_run = now() - interval '1 second'"
        )
