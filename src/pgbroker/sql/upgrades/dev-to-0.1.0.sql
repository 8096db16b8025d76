-- From a development database (pgbroker.schema_migrations 1..24, installed
-- before the engine was written once) to the 0.1.0 baseline.
--
-- Its tables and types are already the baseline's (test_migrations.py proves
-- it: the database it upgrades is built by those migrations, kept in
-- tests/data/dev_migrations/); only the installer's bookkeeping changes. The
-- installer then records version 0.1.0 and re-applies the function files, as
-- after any upgrade.
--
-- Folding in a development migration that came after 0024: add its table and
-- type changes here, written so that they also run on a database that
-- already has them (IF NOT EXISTS, or a check of the catalog), since
-- development databases may stand at 24 or at that migration; add its line to
-- dev-history.txt and its file to tests/data/dev_migrations/.

DROP TABLE pgbroker.schema_migrations;
