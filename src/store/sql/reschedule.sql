-- Failed rows of a batch: keep the reason and back off. The delay of each
-- row is computed by the relay (jittered exponential, see retry.rs), so the
-- statement stays one set-based UPDATE whatever the mix of attempts.
UPDATE {table} AS t
SET last_error = f.error,
    next_attempt_at = now() + f.delay_ms * interval '1 millisecond'
FROM unnest($1::uuid[], $2::text[], $3::bigint[]) AS f(id, error, delay_ms)
WHERE t.id = f.id
  AND t.published_at IS NULL
