-- Claims up to $1 due rows and leases them for $2 milliseconds.
--
-- The lease is committed before anything is published, so no transaction
-- stays open across the broker round trip, and a relay that dies mid-batch
-- leaves rows that become due again when the lease runs out. The attempt is
-- counted here, not after the publish: a row whose publish kills the relay
-- still moves towards quarantine.
--
-- Plan: an index scan of the partial pending index in (created_at, id)
-- order, next_attempt_at checked on the heap row (which FOR UPDATE reads
-- anyway), stopped by the LIMIT; SKIP LOCKED passes over rows another
-- replica is claiming. Published and quarantined rows are not in that index
-- at all. The UPDATE touches no indexed column, so it is a HOT update.
WITH due AS (
    SELECT id
    FROM {table}
    WHERE published_at IS NULL
      AND quarantined_at IS NULL
      AND next_attempt_at <= now()
    ORDER BY created_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} AS t
SET attempt_count = t.attempt_count + 1,
    next_attempt_at = now() + $2::bigint * interval '1 millisecond'
FROM due
WHERE t.id = due.id
RETURNING t.id, t.causation_id, t.event_type::text, t.aggregate_id::text,
          t.payload::text, t.created_at, t.attempt_count
