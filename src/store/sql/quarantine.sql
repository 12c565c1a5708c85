-- Rows that will not succeed by retrying: out of attempts, or rejected by
-- the sink. They leave the pending index and wait for an operator.
UPDATE {table} AS t
SET last_error = f.error,
    quarantined_at = now()
FROM unnest($1::uuid[], $2::text[]) AS f(id, error)
WHERE t.id = f.id
  AND t.published_at IS NULL
