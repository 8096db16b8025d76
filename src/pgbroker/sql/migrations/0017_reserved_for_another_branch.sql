-- pgbroker migration 0017: a placeholder in branch schedules-peek only.
--
-- Migrations must run 1..n without gaps, and this branch's migration is 0018
-- while 0016 and 0017 belong to branches developed at the same time. When
-- merging, delete this file: the other branch brings the real 0017.
SELECT 1;
