-- Failed rows of a batch: keep the reason and back off (which puts the
-- row on the retry claim path, ordered by next_attempt_at, and ends its
-- lease). The delay of each
-- row is computed by the relay (jittered exponential, see retry.rs), so the
-- statement stays one set-based UPDATE whatever the mix of attempts. Each
-- row only while its claim's attempt still stands (see mark_published.sql).
-- last_error is cut to the column's own length (last_error_room.sql).
UPDATE {table} AS t
SET last_error = left(f.error, {last_error_room}),
    next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
    leased_until = NULL
FROM unnest($1::uuid[], $2::int[], $3::text[], $4::bigint[]) AS f(id, attempt, error, delay_ms)
WHERE t.id = f.id
  AND t.attempt_count = f.attempt
  AND t.published_at IS NULL
