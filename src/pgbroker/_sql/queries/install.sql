-- The installer's statements (_db/install.py), besides its bootstrap, which stays inline: it
-- creates the bookkeeping tables these statements read and write. The engine's own files
-- (structure/, functions/, upgrades/) are run whole, not named here.

-- name: install_lock
-- One installer at a time: a transaction-scoped advisory lock.
SELECT pg_advisory_xact_lock(%s)

-- name: install_foreign_pgmq
-- Whether the pgmq extension, a schema pgmq, and pgbroker's bookkeeping exist.
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pgmq'),
       to_regnamespace('pgmq') IS NOT NULL,
       to_regclass('pgbroker.schema_version') IS NOT NULL
           OR to_regclass('pgbroker.schema_migrations') IS NOT NULL

-- name: install_schema_owner
-- Who owns schema pgbroker (no row before the first install), whether the current user has that
-- role's privileges (an upgrade alters and replaces what it owns), and who the current user is.
SELECT n.nspowner::regrole::text, pg_catalog.pg_has_role(n.nspowner, 'USAGE'), current_user::text
FROM pg_catalog.pg_namespace n
WHERE n.nspname = 'pgbroker'

-- name: install_may_create
-- Whether the current user may create schemas in the database (a first install makes pgmq and
-- pgbroker), who it is, and which database.
SELECT pg_catalog.has_database_privilege(current_database(), 'CREATE'), current_user::text,
       current_database()::text

-- name: install_lock_set
-- The tables an upgrade or re-applied functions lock, to take at once before they change anything
-- (pgbroker._db.install): the engine's own tables and views of pgmq and pgbroker, and not a queue's or a
-- stream's (pgmq.q_*, pgmq.a_*, pgbroker.s_*), which neither touches, but for the queues whose notify
-- trigger a development database's mapping makes again (%s: mapping one).
SELECT n.nspname, c.relname
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname IN ('pgmq', 'pgbroker') AND c.relkind IN ('r', 'p', 'v', 'm') AND NOT c.relispartition
  AND (NOT (n.nspname = 'pgmq' AND c.relname ~ '^[qa]_' OR n.nspname = 'pgbroker' AND c.relname ~ '^s_')
       OR %s AND EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                         WHERE t.tgrelid = c.oid AND t.tgname = 'pgbroker_notify_insert'))
ORDER BY c.oid

-- name: install_lock_tables
-- Take the tables of install_lock_set in one statement ({tables}: their names, composed in Python).
LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE

-- name: install_lock_holders
-- The other sessions holding a lock on a table of install_lock_set (given as two arrays, schemas and
-- names), the oldest transaction first: pid, state, application, seconds in their transaction.
SELECT a.pid, a.state, a.application_name, extract(epoch FROM clock_timestamp() - a.xact_start)::integer
FROM pg_catalog.pg_stat_activity a
WHERE a.pid IN (SELECT l.pid FROM pg_catalog.pg_locks l
                JOIN pg_catalog.pg_class c ON c.oid = l.relation
                JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                WHERE l.granted AND l.locktype = 'relation' AND l.pid <> pg_backend_pid()
                  AND (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[])))
ORDER BY a.xact_start, a.pid

-- name: install_lock_capacity
-- What sizes the server's lock table (max_locks_per_transaction for each of max_connections and
-- max_prepared_transactions), and about how many locks an upgrade holds at once: one for each
-- function of the engine it writes again, one or two for each table, index and sequence of the
-- engine (not a queue's or a stream's), and some for what it makes (from 477 to 695 measured).
SELECT current_setting('max_locks_per_transaction')::int,
       current_setting('max_connections')::int + current_setting('max_prepared_transactions')::int,
       (SELECT count(*) FROM pg_catalog.pg_proc
        WHERE pronamespace IN (to_regnamespace('pgmq'), to_regnamespace('pgbroker')))
       + 2 * (SELECT count(*) FROM pg_catalog.pg_class
              WHERE relnamespace IN (to_regnamespace('pgmq'), to_regnamespace('pgbroker'))
                AND relname !~ '^[qas]_')
       + 200

-- name: install_lock_timeout
-- The session's lock_timeout, to restore after install_lock_tables.
SELECT current_setting('lock_timeout')

-- name: install_lock_pause
-- Wait between two attempts of install_lock_tables (holding no table: the attempt was rolled back).
SELECT pg_sleep(%s)

-- name: install_set_lock_timeout
-- Set lock_timeout for the rest of the transaction.
SELECT set_config('lock_timeout', %s, true)

-- name: install_history_tables
-- Whether the database records releases (schema_version) or a development history (schema_migrations).
SELECT to_regclass('pgbroker.schema_version') IS NOT NULL,
       to_regclass('pgbroker.schema_migrations') IS NOT NULL

-- name: install_release_versions
-- The releases the database records.
SELECT version, name, checksum FROM pgbroker.schema_version

-- name: install_dev_migrations
-- The numbered development migrations the database records.
SELECT version, name, checksum FROM pgbroker.schema_migrations ORDER BY version

-- name: install_record_versions
-- Record installed releases, one row per (version, name, checksum) of the three arrays.
INSERT INTO pgbroker.schema_version (version, name, checksum)
SELECT * FROM unnest(%s::text[], %s::text[], %s::text[])

-- name: install_functions_checksum
-- The checksum of the function files the database last ran.
SELECT checksum FROM pgbroker.schema_functions

-- name: install_record_functions
-- Record the checksum of the function files just run.
INSERT INTO pgbroker.schema_functions (checksum) VALUES (%s)
ON CONFLICT (singleton) DO UPDATE SET checksum = excluded.checksum, applied_at = now()

-- name: install_check_role_sets
-- Give the role sets whose roles exist their grants again when they lost some (or the functions were
-- re-applied); name the roles missing.
SELECT prefix, missing_roles, regranted FROM pgbroker._check_role_sets(%s)

-- name: install_revoke_public_definers
-- Take EXECUTE from PUBLIC on every SECURITY DEFINER function; how many had it.
SELECT pgbroker._revoke_public_definers()

-- name: install_sync_queue_grants
-- Give the queue grants' roles their privileges again and forget the grants of dropped roles.
SELECT pgbroker._sync_queue_grants()

-- name: roles_install
-- Create or bring up to date a prefix's producer, consumer and monitor roles.
SELECT role_name, functions FROM pgbroker.grant_roles(%s)

-- name: queue_grant
-- Let a role act as a kind on the queues matching a glob.
SELECT pgbroker.grant_queue_access(%s, %s, %s)

-- name: names_matching
-- How many queues and how many streams a glob covers now (a queue grant's, an API key's): none
-- may be a typo, said beside the grant or key made.
SELECT (SELECT count(*) FROM pgmq.meta WHERE lower(queue_name) LIKE pgbroker._glob_like(%s)),
       (SELECT count(*) FROM pgbroker.stream WHERE stream_name LIKE pgbroker._glob_like(%s))

-- name: queue_revoke
-- Take back a role's grants of a kind, on one glob or all.
SELECT pgbroker.revoke_queue_access(%s, %s, %s)

-- name: queue_grant_list
-- Every queue grant, by role, kind and pattern.
SELECT role_name, role_kind, pattern, granted_at FROM pgbroker.list_queue_grants()
