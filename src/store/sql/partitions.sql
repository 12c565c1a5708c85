-- The partitions of the outbox table ($1: its quoted name): each one's
-- name as PostgreSQL quotes it (format %I, so it can be used in DDL as
-- it is), whether it is the DEFAULT partition, and its range. The bounds
-- are read back from their text form in this same session, so time zone
-- and date style round-trip; a MINVALUE or MAXVALUE bound reads as NULL
-- and such a partition is left alone.
SELECT format('%I.%I', n.nspname, c.relname) AS qualified,
       b.bound = 'DEFAULT' AS is_default,
       (regexp_match(b.bound, 'FROM \(''([^'']*)''\)'))[1]::timestamptz AS lower_bound,
       (regexp_match(b.bound, 'TO \(''([^'']*)''\)'))[1]::timestamptz AS upper_bound
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) AS b
WHERE i.inhparent = to_regclass($1)
ORDER BY lower_bound NULLS FIRST
