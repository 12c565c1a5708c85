-- The outbox table's columns, for the start-up check of their types
-- ($1: the quoted, possibly qualified table name, resolved like the
-- relay's own statements resolve it). For each: its name, its type as DDL
-- writes it, the name of the type clients receive (a domain's base type),
-- and whether NULL is ruled out, by the column or by its domain. No rows
-- when the table does not exist.
SELECT a.attname::text,
       format_type(a.atttypid, a.atttypmod),
       base.typname::text,
       a.attnotnull OR t.typnotnull
FROM pg_attribute AS a
JOIN pg_type AS t ON t.oid = a.atttypid
JOIN pg_type AS base ON base.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
WHERE a.attrelid = to_regclass($1)
  AND a.attnum > 0
  AND NOT a.attisdropped
ORDER BY a.attnum
