-- Confirmed rows, one statement per batch. Each row is matched with the
-- attempt its claim counted: once the lease has run out and another claim
-- has taken the row, this late outcome touches nothing (that claim records
-- its own). The published_at guard keeps it off a row an operator has
-- already dealt with.
UPDATE {table} AS t
SET published_at = now()
FROM unnest($1::uuid[], $2::int[]) AS c(id, attempt)
WHERE t.id = c.id
  AND t.attempt_count = c.attempt
  AND t.published_at IS NULL
