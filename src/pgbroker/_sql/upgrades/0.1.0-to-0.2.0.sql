-- From 0.1.0 to 0.2.0: what this release changes in tables and types, and a
-- DROP for each function it removes or re-signatures. Each change is its own
-- block, with the reason; the installer then re-applies the function files.

-- Attempt history (issue 24): pgbroker.fail takes the consumer's traceback,
-- kept with the error of each failed attempt (65_failures.sql).
DROP FUNCTION IF EXISTS pgbroker.fail(text, text[], text);
DROP FUNCTION IF EXISTS pgbroker.fail(text, text, text);
