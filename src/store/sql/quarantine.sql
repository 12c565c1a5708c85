-- Rows that will not succeed by retrying: out of attempts, or rejected by
-- the sink. They leave the pending index and wait for an operator. Each
-- row only while its claim's attempt still stands (see mark_published.sql).
-- last_error is cut to the column's own length (last_error_room.sql).
UPDATE {table} AS t
SET last_error = left(f.error, {last_error_room}),
    quarantined_at = now(),
    leased_until = NULL
FROM unnest($1::uuid[], $2::int[], $3::text[]) AS f(id, attempt, error)
WHERE t.id = f.id
  AND t.attempt_count = f.attempt
  AND t.published_at IS NULL
