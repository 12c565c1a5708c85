-- Rows the broker or the network failed (an alarm, a lost connection,
-- throttling, no confirm in time): not the rows' fault, so the attempt the
-- claim counted is given back, and the row is due again at once: claims
-- wait for the sink to be ready again anyway, and then the rows go first.
-- A crash mid-publish never gets here, so a row that keeps killing the
-- relay still reaches quarantine. Each row only while its claim's attempt
-- still stands (see mark_published.sql), which also keeps a retried
-- statement from giving an attempt back twice.
UPDATE {table} AS t
SET attempt_count = t.attempt_count - 1,
    next_attempt_at = now()
FROM unnest($1::uuid[], $2::int[]) AS f(id, attempt)
WHERE t.id = f.id
  AND t.attempt_count = f.attempt
  AND t.published_at IS NULL
