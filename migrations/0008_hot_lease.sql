-- The lease in a column of its own that no index names, so that leasing a
-- row (and giving its attempt back after an outage) is a HOT update: a new
-- row version on the same page and no index entry at all. Before this,
-- the lease moved a row between the claim paths of 0007 (attempt_count in
-- their predicates) and set their key (next_attempt_at): every claimed row
-- cost entries in four indexes and one more dead row version that only
-- VACUUM could clear. docs/performance.md has the measurements.
--
-- The claim paths split on whether a row has failed instead, which only a
-- failure changes:
--
-- * never failed (last_error NULL): new rows, and rows a dead relay left
--   leased, in (created_at, id) order, the order the claim takes them in.
--   Rows in flight stay in this index: a claim walks past them, at most
--   the batches in flight (workers × batch size per replica), checking
--   their lease on the heap;
-- * failed (last_error set): rows backing off or due for a retry, by
--   next_attempt_at, so that a claim reads only the due range and never
--   walks rows still backing off, however many there are.
--
-- Published and quarantined rows are in neither. The indexes of 0007 go,
-- once these are built: kept, they would keep attempt_count and
-- next_attempt_at's changes out of HOT.
--
-- While old and new relays run side by side (a rolling upgrade), an old
-- relay does not see a new one's lease and may publish a row that is in
-- flight: a duplicate under the same id, never a loss. A new relay honours
-- an old one's lease (next_attempt_at in the future).
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS leased_until TIMESTAMPTZ;

CREATE INDEX IF NOT EXISTS {fresh_index}
    ON {table} (created_at, id)
    WHERE published_at IS NULL AND quarantined_at IS NULL AND last_error IS NULL;

CREATE INDEX IF NOT EXISTS {retry_index}
    ON {table} (next_attempt_at)
    WHERE published_at IS NULL AND quarantined_at IS NULL AND last_error IS NOT NULL;

DROP INDEX IF EXISTS {untried_index};

DROP INDEX IF EXISTS {tried_index};
