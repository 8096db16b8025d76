-- Schedules: durable cron schedules that send a message to a queue at every
-- tick.
--
-- A schedule is a row: a standard five-field cron expression read in an IANA
-- time zone, the queue, the message and its headers, and next_run, the next
-- tick. Everything that decides what is sent and when is here, in SQL, so a
-- schedule behaves the same whichever language or process runs the ticks:
--   pgbroker.schedule_add / schedule_remove / schedule_pause /
--   schedule_resume / schedule_list    manage them;
--   pgbroker.schedule_tick()           sends the due ticks (schedulers call it);
--   pgbroker.schedule_next_wake()      seconds until the next due tick;
--   pgbroker.cron_next(cron, tz, t)    the first tick after t.
--
-- Exactly one message per tick, however many schedulers run. schedule_tick
-- locks a due schedule's row (FOR UPDATE SKIP LOCKED), sends, and moves
-- next_run past the tick, in one transaction: the row is the claim. Another
-- scheduler skips a row that is locked, and one that reaches the row after
-- the commit finds next_run in the future (Postgres re-checks the WHERE
-- clause on the row's newest version), so a tick is sent at most once. A
-- scheduler that fails mid-tick rolls back its transaction, leaving the tick
-- due for the next scheduler: no tick is lost while one scheduler runs.
--
-- Missed ticks: a tick is sent when a scheduler first runs at or after it.
-- When no scheduler ran for a while, the first one to come back sends ONE
-- message, for the last tick that was missed (its header names that tick),
-- and none for the earlier ones; next_run then moves to the first tick after
-- now. A paused schedule sends nothing; resume computes next_run from the
-- time of resuming, so ticks that fell in the pause are not caught up.
--
-- Failures: a send the queue refuses (the queue was dropped, is at its
-- max_depth, ...) is recorded in last_error and that tick is skipped; the
-- schedule keeps running.
--
-- Every message carries the header x-pgbroker-schedule: {"name": ..., "tick":
-- ...}, with the tick's time (UTC, ISO 8601): a consumer that must not act
-- twice on one tick can key on it.
--
-- Cron: minute hour day-of-month month day-of-week; each field '*', a
-- number, a range 'a-b', a step '*/n' or 'a-b/n' or 'a/n' (a to the end, every
-- n), or a comma-separated list of those; months and weekdays also by
-- English three-letter names (jan-dec, sun-sat; weekday 0 and 7 are Sunday);
-- and the shorthands @yearly (@annually), @monthly, @weekly, @daily
-- (@midnight), @hourly. As in Vixie cron, when both day-of-month and
-- day-of-week are restricted (neither starts with '*'), a day matching either
-- one fires.
--
-- Time zones and daylight saving time. Ticks are wall-clock times in the
-- schedule's time zone. When the clocks go forward, a wall-clock time that
-- does not exist that day fires at the same distance after the change (02:30
-- in a zone that jumps from 02:00 to 03:00 fires at 03:30), once. When the
-- clocks go back and an hour is repeated, a schedule with a fixed hour (hour
-- field not '*') fires once, at the first occurrence of its time; a schedule
-- whose hour field is '*' keeps firing through the repeated hour, every
-- minute it names, in real time (*/15 fires every 15 minutes throughout).

-- Notifications on this channel tell schedulers that schedules changed.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.schedules_channel()
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'pgbroker_schedules'::text;
$$;

CREATE OR REPLACE FUNCTION pgbroker._cron_error(cron text, problem text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION 'invalid cron expression %: %', quote_literal(cron), problem
        USING ERRCODE = 'PB007',
              HINT = 'Five fields: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12 or jan-dec) '
                     'day-of-week (0-7 or sun-sat), each *, n, a-b, */n, a-b/n or a list of those; '
                     'e.g. ''*/5 * * * *'', ''0 9 * * mon-fri''; or @hourly, @daily, @weekly, @monthly, @yearly.';
END;
$$;

-- One value of a field: a number, or a name (names[1] stands for lo).
CREATE OR REPLACE FUNCTION pgbroker._cron_value(cron text, what text, token text, lo integer, hi integer, names text[])
RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    value integer;
BEGIN
    IF token ~ '^[0-9]{1,4}$' THEN
        value := token::integer;
    ELSIF array_position(names, token) IS NOT NULL THEN
        value := lo + array_position(names, token) - 1;
    ELSE
        PERFORM pgbroker._cron_error(cron, format('%s: %L is not a value', what, token));
    END IF;
    IF value NOT BETWEEN lo AND hi THEN
        PERFORM pgbroker._cron_error(cron, format('%s: %s is outside %s-%s', what, value, lo, hi));
    END IF;
    RETURN value;
END;
$$;

-- The sorted values a field allows.
CREATE OR REPLACE FUNCTION pgbroker._cron_field(cron text, what text, field text, lo integer, hi integer,
                                     names text[] DEFAULT NULL)
RETURNS integer[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    part text;
    m text[];
    first integer;
    last integer;
    step integer;
    allowed integer[] := '{}';
BEGIN
    FOREACH part IN ARRAY string_to_array(lower(field), ',') LOOP
        m := regexp_match(part, '^(\*|([0-9a-z]+)(-([0-9a-z]+))?)(/([0-9]{1,4}))?$');
        IF m IS NULL THEN
            PERFORM pgbroker._cron_error(cron, format('%s: cannot read %L', what, part));
        END IF;
        IF m[1] = '*' THEN
            first := lo;
            last := hi;
        ELSE
            first := pgbroker._cron_value(cron, what, m[2], lo, hi, names);
            -- 'a/n' runs from a to the end of the range.
            last := CASE WHEN m[4] IS NOT NULL THEN pgbroker._cron_value(cron, what, m[4], lo, hi, names)
                         WHEN m[6] IS NOT NULL THEN hi ELSE first END;
        END IF;
        step := coalesce(m[6]::integer, 1);
        IF step < 1 THEN
            PERFORM pgbroker._cron_error(cron, format('%s: a step must be at least 1', what));
        END IF;
        IF first > last THEN
            PERFORM pgbroker._cron_error(cron, format('%s: range %s runs backwards', what, part));
        END IF;
        allowed := allowed || ARRAY(SELECT generate_series(first, last, step));
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT v FROM unnest(allowed) v ORDER BY v);
END;
$$;

-- Parse a cron expression, or fail (PB007) saying what is wrong with it.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.cron_parse(cron text)
RETURNS pgbroker.cron_fields LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    expanded text := CASE lower(btrim(cron))
        WHEN '@yearly' THEN '0 0 1 1 *' WHEN '@annually' THEN '0 0 1 1 *'
        WHEN '@monthly' THEN '0 0 1 * *' WHEN '@weekly' THEN '0 0 * * 0'
        WHEN '@daily' THEN '0 0 * * *' WHEN '@midnight' THEN '0 0 * * *'
        WHEN '@hourly' THEN '0 * * * *' ELSE btrim(cron) END;
    fields text[] := regexp_split_to_array(expanded, '\s+');
    parsed pgbroker.cron_fields;
BEGIN
    IF cron IS NULL OR array_length(fields, 1) IS DISTINCT FROM 5 THEN
        PERFORM pgbroker._cron_error(coalesce(cron, 'NULL'),
            format('expected 5 fields, got %s', coalesce(array_length(fields, 1), 0)));
    END IF;
    parsed.minutes := pgbroker._cron_field(cron, 'minute', fields[1], 0, 59);
    parsed.hours := pgbroker._cron_field(cron, 'hour', fields[2], 0, 23);
    parsed.days := pgbroker._cron_field(cron, 'day of month', fields[3], 1, 31);
    parsed.months := pgbroker._cron_field(cron, 'month', fields[4], 1, 12,
        ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec']);
    -- Sunday is 0 and 7 ('sun' is 0).
    parsed.weekdays := ARRAY(SELECT DISTINCT v % 7 FROM unnest(pgbroker._cron_field(cron, 'day of week',
        fields[5], 0, 7, ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'])) v ORDER BY 1);
    parsed.any_day := fields[3] LIKE '*%';
    parsed.any_weekday := fields[5] LIKE '*%';
    RETURN parsed;
END;
$$;

-- The first wall-clock time after ``after`` (a local time) that the fields
-- allow; NULL when there is none within ten years (say, February 30th).
-- Whole months, days and hours that cannot match are skipped in one step.
CREATE OR REPLACE FUNCTION pgbroker._cron_next_local(c pgbroker.cron_fields, after timestamp)
RETURNS timestamp LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t timestamp := date_trunc('minute', after) + interval '1 minute';
    give_up timestamp := after + interval '10 years';
    day_ok boolean;
    next_hour integer;
    next_minute integer;
BEGIN
    WHILE t < give_up LOOP
        IF NOT extract(month FROM t)::integer = ANY (c.months) THEN
            t := date_trunc('month', t) + interval '1 month';
            CONTINUE;
        END IF;
        IF c.any_day OR c.any_weekday THEN
            day_ok := extract(day FROM t)::integer = ANY (c.days) AND extract(dow FROM t)::integer = ANY (c.weekdays);
        ELSE
            day_ok := extract(day FROM t)::integer = ANY (c.days) OR extract(dow FROM t)::integer = ANY (c.weekdays);
        END IF;
        IF NOT day_ok THEN
            t := date_trunc('day', t) + interval '1 day';
            CONTINUE;
        END IF;
        SELECT min(h) INTO next_hour FROM unnest(c.hours) h WHERE h >= extract(hour FROM t);
        IF next_hour IS NULL THEN
            t := date_trunc('day', t) + interval '1 day';
            CONTINUE;
        END IF;
        IF next_hour > extract(hour FROM t) THEN
            t := date_trunc('day', t) + make_interval(hours => next_hour);
        END IF;
        SELECT min(m) INTO next_minute FROM unnest(c.minutes) m WHERE m >= extract(minute FROM t);
        IF next_minute IS NULL THEN
            t := date_trunc('hour', t) + interval '1 hour';
            CONTINUE;
        END IF;
        RETURN date_trunc('hour', t) + make_interval(mins => next_minute);
    END LOOP;
    RETURN NULL;
END;
$$;

-- The zone's offset from UTC at an instant.
CREATE OR REPLACE FUNCTION pgbroker._utc_offset(instant timestamptz, timezone text)
RETURNS interval LANGUAGE sql STABLE AS $$
    SELECT (instant AT TIME ZONE timezone) - (instant AT TIME ZONE 'UTC');
$$;

-- The first instant after ``after`` at which the zone's clocks show
-- ``wall``. A wall time repeated when the clocks go back: its first
-- occurrence still to come. One skipped when they go forward: Postgres reads
-- it with the offset before the change, which lands as far after the change.
CREATE OR REPLACE FUNCTION pgbroker._cron_instant(wall timestamp, timezone text, after timestamptz)
RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
DECLARE
    later timestamptz := wall AT TIME ZONE timezone;  -- Postgres picks the later of two
    shift interval := pgbroker._utc_offset(later - interval '1 day', timezone)
                      - pgbroker._utc_offset(later, timezone);
BEGIN
    IF shift > interval '0' AND ((later - shift) AT TIME ZONE timezone) = wall AND later - shift > after THEN
        RETURN later - shift;
    END IF;
    RETURN later;
END;
$$;

-- The first tick of a cron expression after an instant, in a time zone
-- (see the top of this file for daylight saving time); NULL when it never
-- fires within ten years.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.cron_next(cron text, timezone text, after timestamptz)
RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
DECLARE
    c pgbroker.cron_fields := pgbroker.cron_parse(cron);
    wall timestamp := after AT TIME ZONE timezone;
    tick timestamptz;
    before_change interval := pgbroker._utc_offset(after, timezone);
    lo timestamptz;
    hi timestamptz;
    mid timestamptz;
    repeated timestamptz;
BEGIN
    LOOP
        wall := pgbroker._cron_next_local(c, wall);
        IF wall IS NULL THEN
            RETURN NULL;
        END IF;
        tick := pgbroker._cron_instant(wall, timezone, after);
        EXIT WHEN tick > after;
    END LOOP;
    -- Every hour allowed, and the clocks go back before the tick: the repeated
    -- wall times after the change come first. Find the change (to the minute)
    -- and the first tick from its wall time on.
    IF cardinality(c.hours) = 24 AND pgbroker._utc_offset(tick, timezone) < before_change THEN
        lo := after;
        hi := tick;
        WHILE hi - lo > interval '1 minute' LOOP
            mid := lo + (hi - lo) / 2;
            IF pgbroker._utc_offset(mid, timezone) = before_change THEN lo := mid; ELSE hi := mid; END IF;
        END LOOP;
        hi := date_trunc('minute', hi);
        IF pgbroker._utc_offset(hi, timezone) = before_change THEN
            hi := hi + interval '1 minute';
        END IF;
        repeated := pgbroker._cron_next_local(c, (hi AT TIME ZONE timezone) - interval '1 minute')
                    AT TIME ZONE timezone;
        IF repeated > after AND repeated < tick THEN
            tick := repeated;
        END IF;
    END IF;
    RETURN tick;
END;
$$;

-- The last tick at or before ``now_`` of a schedule whose next_run is due:
-- the tick a scheduler that was away catches up on (one call in the usual
-- case; after an absence, windows that grow until one holds a tick).
CREATE OR REPLACE FUNCTION pgbroker._last_due_tick(s pgbroker.schedules, now_ timestamptz)
RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
DECLARE
    latest timestamptz;
    probe timestamptz;
    window_ interval;
BEGIN
    IF pgbroker.cron_next(s.cron, s.timezone, s.next_run) > now_ THEN
        RETURN s.next_run;
    END IF;
    FOREACH window_ IN ARRAY ARRAY['2 minutes', '2 hours', '2 days', '64 days', '800 days', '11 years']::interval[] LOOP
        latest := NULL;
        probe := pgbroker.cron_next(s.cron, s.timezone, greatest(s.next_run, now_ - window_));
        WHILE probe <= now_ LOOP
            latest := probe;
            probe := pgbroker.cron_next(s.cron, s.timezone, probe);
        END LOOP;
        IF latest IS NOT NULL THEN
            RETURN latest;
        END IF;
    END LOOP;
    RETURN s.next_run;
END;
$$;

------------------------------------------------------------------------------
-- Managing schedules
------------------------------------------------------------------------------

-- Add a schedule that sends ``message`` (with ``headers``) to the queue at
-- every tick of ``cron`` in ``timezone`` (an IANA name, e.g.
-- 'Europe/Berlin'). A schedule of that name is refused (PB007), unless
-- ``replace``: then it is redefined (its next tick computed again, paused as
-- it was).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.schedule_add(
    name text, queue_name text, cron text, message jsonb, headers jsonb DEFAULT NULL,
    timezone text DEFAULT 'UTC', replace boolean DEFAULT false)
RETURNS pgbroker.schedules LANGUAGE plpgsql AS $$
DECLARE
    first_tick timestamptz;
    added pgbroker.schedules;
BEGIN
    PERFORM pgbroker._check_arg(name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$',
        format('invalid schedule name %s', coalesce(quote_literal(name), 'NULL')),
        'Use 1 to 100 letters, digits, _ . : or -, starting with a letter or digit.');
    PERFORM pgbroker._table(queue_name);
    PERFORM pgbroker._check_arg(message IS NOT NULL, 'a schedule needs a message (JSON)',
        'Pass the payload each tick sends, e.g. ''{}''.');
    PERFORM pgbroker._check_arg(headers IS NULL OR jsonb_typeof(headers) = 'object',
        'headers must be a JSON object', 'Pass headers as {"key": value, ...}.');
    -- Checked here, the door: a tick is the engine's send, which checks neither the size nor
    -- the reserved headers (its own x-pgbroker-schedule is one).
    PERFORM pgbroker._check_message_size(pg_column_size(message) + coalesce(pg_column_size(headers), 0));
    IF headers IS NOT NULL THEN
        PERFORM pgbroker._check_reserved_headers(ARRAY[headers]);
    END IF;
    PERFORM pgbroker._check_arg(
        timezone IS NOT NULL AND EXISTS (SELECT 1 FROM pg_timezone_names z WHERE z.name = timezone),
        format('unknown time zone %s', coalesce(quote_literal(timezone), 'NULL')),
        'Use an IANA time zone name, e.g. ''UTC'', ''Europe/Berlin'', ''America/New_York''.');
    first_tick := pgbroker.cron_next(cron, timezone, now());
    PERFORM pgbroker._check_arg(first_tick IS NOT NULL,
        format('cron expression %L never fires', cron), 'Check the day of month against the month.');
    INSERT INTO pgbroker.schedules AS s (name, queue_name, cron, timezone, message, headers, next_run)
    VALUES (schedule_add.name, pgbroker._stored_name(queue_name), cron, timezone, message, headers, first_tick)
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
        SET queue_name = excluded.queue_name, cron = excluded.cron, timezone = excluded.timezone,
            message = excluded.message, headers = excluded.headers, next_run = excluded.next_run,
            updated_at = clock_timestamp()
        WHERE replace
    RETURNING * INTO added;
    IF added IS NULL THEN
        RAISE EXCEPTION 'schedule "%" already exists', name
            USING ERRCODE = 'PB007',
                  HINT = 'Remove it first, or add it with replace (pgbroker schedule add --replace).';
    END IF;
    RETURN added;
END;
$$;

-- Every schedule, by name.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.schedule_list()
RETURNS SETOF pgbroker.schedules LANGUAGE sql STABLE AS $$
    SELECT * FROM pgbroker.schedules ORDER BY name;
$$;

CREATE OR REPLACE FUNCTION pgbroker._schedule_missing(name text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'schedule "%" does not exist', name
        USING ERRCODE = 'PB007', HINT = 'List the schedules: pgbroker schedule list.';
END;
$$;

-- Remove a schedule; false when there was none of that name.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.schedule_remove(name text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pgbroker.schedules s WHERE s.name = schedule_remove.name;
    RETURN FOUND;
END;
$$;

-- Stop sending a schedule's ticks (idempotent).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.schedule_pause(name text)
RETURNS pgbroker.schedules LANGUAGE plpgsql AS $$
DECLARE
    changed pgbroker.schedules;
BEGIN
    UPDATE pgbroker.schedules s SET paused = true, updated_at = clock_timestamp()
    WHERE s.name = schedule_pause.name
    RETURNING * INTO changed;
    IF changed IS NULL THEN
        PERFORM pgbroker._schedule_missing(name);
    END IF;
    RETURN changed;
END;
$$;

-- Send a paused schedule's ticks again, from the first tick after now (the
-- ticks of the pause are not caught up). Resuming a running schedule changes
-- nothing.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.schedule_resume(name text)
RETURNS pgbroker.schedules LANGUAGE plpgsql AS $$
DECLARE
    changed pgbroker.schedules;
BEGIN
    UPDATE pgbroker.schedules s
    SET paused = false, next_run = pgbroker.cron_next(s.cron, s.timezone, now()), updated_at = clock_timestamp()
    WHERE s.name = schedule_resume.name AND s.paused
    RETURNING * INTO changed;
    IF changed IS NULL THEN
        SELECT * INTO changed FROM pgbroker.schedules s WHERE s.name = schedule_resume.name;
        IF changed IS NULL THEN
            PERFORM pgbroker._schedule_missing(name);
        END IF;
    END IF;
    RETURN changed;
END;
$$;

------------------------------------------------------------------------------
-- Running schedules
------------------------------------------------------------------------------

-- Send every due tick, as of ``as_of`` (default: now; tests pass a time), and
-- move each schedule to its next tick; returns a row per schedule that was
-- due: the tick, and the msg_id sent or the error that refused it. Schedules
-- another scheduler holds right now are skipped (it is sending them).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.schedule_tick(as_of timestamptz DEFAULT NULL)
RETURNS TABLE (schedule_name text, tick timestamptz, msg_id bigint, error text) LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := coalesce(as_of, now());
    s pgbroker.schedules;
BEGIN
    FOR s IN
        SELECT * FROM pgbroker.schedules d WHERE NOT d.paused AND d.next_run <= now_
        ORDER BY d.next_run FOR UPDATE SKIP LOCKED
    LOOP
        schedule_name := s.name;
        tick := pgbroker._last_due_tick(s, now_);
        error := NULL;
        BEGIN
            SELECT sent INTO msg_id FROM pgbroker._send_many(s.queue_name, ARRAY[s.message],
                ARRAY[coalesce(s.headers, '{}'::jsonb) || jsonb_build_object('x-pgbroker-schedule',
                    jsonb_build_object('name', s.name,
                                       'tick', to_char(tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')))],
                NULL, true) sent;
        EXCEPTION WHEN OTHERS THEN
            msg_id := NULL;
            error := SQLERRM;
        END;
        UPDATE pgbroker.schedules d
        SET last_run = tick, last_msg_id = msg_id, last_error = error,
            next_run = coalesce(pgbroker.cron_next(d.cron, d.timezone, tick), 'infinity')
        WHERE d.name = s.name;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Seconds until the next tick of any running schedule (0 when one is due),
-- or NULL when there is none: how long a scheduler may sleep.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.schedule_next_wake()
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN min(next_run) IS NOT NULL
                THEN greatest(0, extract(epoch FROM min(next_run) - clock_timestamp()))::double precision END
    FROM pgbroker.schedules WHERE NOT paused;
$$;

-- Tell schedulers that schedules changed (not on ticks: those change only
-- next_run and the last_* columns).
CREATE OR REPLACE FUNCTION pgbroker._schedules_changed()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(pgbroker.schedules_channel(), '');
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER schedules_added_or_removed AFTER INSERT OR DELETE ON pgbroker.schedules
    FOR EACH STATEMENT EXECUTE FUNCTION pgbroker._schedules_changed();
CREATE OR REPLACE TRIGGER schedules_changed AFTER UPDATE ON pgbroker.schedules
    FOR EACH ROW WHEN (OLD.updated_at IS DISTINCT FROM NEW.updated_at)
    EXECUTE FUNCTION pgbroker._schedules_changed();
