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

-- name: install_lock_tables
-- Take every table of pgmq and pgbroker (partitions through their parents) in ACCESS EXCLUSIVE mode,
-- in one statement: before an upgrade changes anything, so that it never waits for a lock while
-- holding others (pgbroker._db.install).
DO $$
DECLARE
    tables text;
BEGIN
    SELECT string_agg(c.oid::regclass::text, ', ' ORDER BY c.oid) INTO tables
    FROM pg_catalog.pg_class c
    WHERE c.relnamespace IN (to_regnamespace('pgmq'), to_regnamespace('pgbroker'))
      AND c.relkind IN ('r', 'p') AND NOT c.relispartition;
    IF tables IS NOT NULL THEN
        EXECUTE 'LOCK TABLE ' || tables || ' IN ACCESS EXCLUSIVE MODE';
    END IF;
END;
$$

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

-- name: queue_revoke
-- Take back a role's grants of a kind, on one glob or all.
SELECT pgbroker.revoke_queue_access(%s, %s, %s)

-- name: queue_grant_list
-- Every queue grant, by role, kind and pattern.
SELECT role_name, role_kind, pattern, granted_at FROM pgbroker.list_queue_grants()
