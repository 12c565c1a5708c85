-- OUTBOX_ON_PUBLISH=delete: confirmed rows go at once, one statement per
-- batch, each only while its claim's attempt still stands (see
-- mark_published.sql).
DELETE FROM {table} AS t
USING unnest($1::uuid[], $2::int[]) AS c(id, attempt)
WHERE t.id = c.id
  AND t.attempt_count = c.attempt
