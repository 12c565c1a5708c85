-- Rows the broker or the network failed (an alarm, a lost connection,
-- throttling, no confirm in time): not the rows' fault, so the attempt the
-- claim counted is given back and the lease ended: the row is due again at
-- once (a HOT update, as the lease was: next_attempt_at is left as it
-- was, which is in the past for any claimed row). Claims
-- wait for the sink to be ready again anyway, and then the rows go first.
-- A crash mid-publish never gets here, so a row that keeps killing the
-- relay still reaches quarantine. Each row only while its claim's attempt
-- still stands (see mark_published.sql), which also keeps a retried
-- statement from giving an attempt back twice.
UPDATE {table} AS t
SET attempt_count = t.attempt_count - 1,
    leased_until = NULL
FROM unnest($1::uuid[], $2::int[]) AS f(id, attempt)
WHERE t.id = f.id
  AND t.attempt_count = f.attempt
  AND t.published_at IS NULL
