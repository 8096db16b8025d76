-- pgbroker migration 0025: reserved for branch sec-sql's migration 0025, which
-- replaces this file when the branches merge (0026_queue_scopes.sql follows
-- it). It changes nothing.
SELECT 1;
