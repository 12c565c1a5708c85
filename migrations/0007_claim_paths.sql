-- Two claim paths, so that a claim reads only rows it can take, whatever
-- waits in the table (the pending index of 0003 stays, for the oldest-age
-- gauge and the backlog count, which need every unpublished row in
-- created_at order):
--
-- * untried rows (attempt_count 0: new, released from quarantine,
--   replayed, or given their attempt back after an outage) in
--   (created_at, id) order, the order the claim takes them in;
-- * rows already tried (attempt_count > 0: leased by a claim right now,
--   backing off after a failure, or left by a relay that died mid-publish)
--   by next_attempt_at: the claim reads the range that is due and stops,
--   so rows that are leased or backing off, whose next_attempt_at lies in
--   the future, are never walked. Published and quarantined rows are in
--   neither.
--
-- The price: a claim moves a row from the first path to the second
-- (attempt_count) and sets next_attempt_at, both now indexed, so claims,
-- reschedules and refunds are no longer HOT updates: each adds entries to
-- every index whose predicate the new row version meets (primary key,
-- pending, aggregate, tried). docs/performance.md has the measurements;
-- a claim behind 500,000 backing-off rows went from hundreds of
-- milliseconds to a few.
--
-- A negative attempt_count (never written by the relay) counts as untried,
-- so that no row is in neither path.
CREATE INDEX IF NOT EXISTS {untried_index}
    ON {table} (created_at, id)
    WHERE published_at IS NULL AND quarantined_at IS NULL AND attempt_count <= 0;

CREATE INDEX IF NOT EXISTS {tried_index}
    ON {table} (next_attempt_at)
    WHERE published_at IS NULL AND quarantined_at IS NULL AND attempt_count > 0;
