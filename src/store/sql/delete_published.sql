-- OUTBOX_ON_PUBLISH=delete: confirmed rows go at once, one statement per
-- batch, each only while its claim's attempt still stands (see
-- mark_published.sql, whose shape this follows for the same reason).
DELETE FROM {table} AS t
WHERE t.id = ANY (ARRAY(SELECT unnest($1::uuid[])))
  AND t.attempt_count = ($2::int[])[array_position($1::uuid[], t.id)]
