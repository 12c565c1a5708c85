-- The claim walks unpublished, unquarantined rows in (created_at, id) order
-- and stops after a batch; so do the oldest-age gauge (first entry) and the
-- backlog count (index-only scan). Published rows, usually the vast
-- majority, are not in this index at all.
--
-- next_attempt_at and attempt_count are deliberately in no index: the
-- claim's UPDATE changes only them, so it can be a HOT update (no new index
-- entries), which roughly halves the write cost of a claim. The free space
-- HOT needs on each page is what the fillfactor below keeps.
CREATE INDEX IF NOT EXISTS {pending_index}
    ON {table} (created_at, id)
    WHERE published_at IS NULL AND quarantined_at IS NULL;

-- Leave room on each page for the claim's and the mark's new row versions
-- (a catalog change; it applies to pages written from now on).
ALTER TABLE {table} SET (fillfactor = 80);

-- Quarantined rows are few; the gauge and `quarantine list` read them here.
CREATE INDEX IF NOT EXISTS {quarantined_index}
    ON {table} (quarantined_at)
    WHERE quarantined_at IS NOT NULL AND published_at IS NULL;

-- Retention deletes, and replay re-queues, by published_at.
CREATE INDEX IF NOT EXISTS {published_index}
    ON {table} (published_at)
    WHERE published_at IS NOT NULL;
