-- Rows a claim took and gives back unpublished, before anything is sent,
-- because a batch-mate whose last attempt was interrupted is published
-- alone (relay/decide.rs, isolate_interrupted): each gets the claim's
-- attempt back, as defer.sql gives it, and is due at once. A row whose
-- own last attempt was interrupted keeps a lease, one that has already
-- run out, so that the next claim still knows it as such (claim.sql,
-- `interrupted`): for a row that has failed before (last_error set) the
-- lease is the only sign. The others end their lease as defer.sql does.
-- Each row only while its claim's attempt still stands (see
-- mark_published.sql).
UPDATE {table} AS t
SET attempt_count = t.attempt_count - 1,
    leased_until = CASE WHEN f.interrupted THEN now() END
FROM unnest($1::uuid[], $2::int[], $3::bool[]) AS f(id, attempt, interrupted)
WHERE t.id = f.id
  AND t.attempt_count = f.attempt
  AND t.published_at IS NULL
