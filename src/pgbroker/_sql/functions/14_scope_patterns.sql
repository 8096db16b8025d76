-- Scope patterns: the glob of a queue grant as a LIKE pattern (15_scopes.sql
-- explains queue grants).
--
-- Apart from 15_scopes.sql because structure/15_scopes.sql needs it:
-- pgbroker.queue_grant computes its like_pattern column with this function,
-- so it exists before the table is created.

-- * any characters, ? one, in lower case; \, % and _ taken literally.
CREATE OR REPLACE FUNCTION pgbroker._glob_like(pattern text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT replace(replace(replace(replace(replace(lower(pattern),
        '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'), '?', '_');
$$;
