-- The type of the outbox table's aggregate_id column as DDL writes it ($1:
-- the quoted, possibly qualified table name), which the ordered claims
-- cast the aggregates they are given back to (see claim_ordered.sql).
-- format_type quotes what needs quoting. No row when the table does not
-- exist or has no such column.
SELECT format_type(a.atttypid, a.atttypmod)
FROM pg_attribute AS a
WHERE a.attrelid = to_regclass($1)
  AND a.attname = 'aggregate_id'
  AND a.attnum > 0
  AND NOT a.attisdropped
