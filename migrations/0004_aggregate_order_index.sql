-- Serves OUTBOX_ORDERING=aggregate: "does this row have an unpublished
-- predecessor in its aggregate?" is one probe of this index, and the stuck
-- aggregate gauge finds each aggregate's head here. Quarantined rows stay in
-- it on purpose: a quarantined head holds its aggregate back.
CREATE INDEX IF NOT EXISTS {aggregate_index}
    ON {table} (aggregate_id, created_at, id)
    WHERE published_at IS NULL;
