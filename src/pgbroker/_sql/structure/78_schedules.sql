-- Schedules: durable cron schedules that send a message to a queue at every
-- tick.
-- The tables and types of this concern, created once; functions/78_schedules.sql
-- holds its functions and the header that explains them.

CREATE TABLE pgbroker.schedules (
    name        text PRIMARY KEY,
    queue_name  text NOT NULL,
    cron        text NOT NULL,
    timezone    text NOT NULL,
    message     jsonb NOT NULL,
    headers     jsonb,
    paused      boolean NOT NULL DEFAULT false,
    next_run    timestamptz NOT NULL,
    last_run    timestamptz,
    last_msg_id bigint,
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
-- Schedulers look for the earliest due tick.
CREATE INDEX schedules_next_run_idx ON pgbroker.schedules (next_run) WHERE NOT paused;

------------------------------------------------------------------------------
-- Cron expressions
------------------------------------------------------------------------------

-- A parsed cron expression: the values each field allows, and whether the
-- day fields were unrestricted ('*...'), which decides how they combine.
CREATE TYPE pgbroker.cron_fields AS (
    minutes     integer[],
    hours       integer[],
    days        integer[],
    months      integer[],
    weekdays    integer[],
    any_day     boolean,
    any_weekday boolean
);
