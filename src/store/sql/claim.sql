-- Claims due rows and leases them for $2 milliseconds (this file selects
-- and locks the candidates; claim_lease.sql, appended, budgets and leases): at most $1 rows,
-- and no more than $3 bytes of payload (always at least one row). A
-- payload larger than $4 bytes (the most the sink can ever publish) is not
-- returned: the relay quarantines that row without loading it.
--
-- The lease is committed before anything is published, so no transaction
-- stays open across the broker round trip, and a relay that dies mid-batch
-- leaves rows that become due again when the lease runs out. The attempt is
-- counted here, not after the publish: a row whose publish kills the relay
-- still moves towards quarantine. The returned attempt_count identifies
-- this claim: every outcome is recorded only where it still matches.
--
-- Plan: an index scan of the partial pending index in (created_at, id)
-- order, next_attempt_at checked on the heap row (which FOR UPDATE reads
-- anyway), stopped by the LIMIT; SKIP LOCKED passes over rows another
-- replica is claiming. Published and quarantined rows are not in that index
-- at all. The UPDATE touches no indexed column, so it is a HOT update.
-- Rows locked by `due` but cut by the byte budget are not updated, and
-- their locks end with the statement.
--
-- Every column is cast to the type the relay reads, so a table in an older
-- shape (created_at without time zone, a BIGINT attempt_count, a UUID
-- aggregate_id) works as it is.
WITH due AS (
    SELECT id, created_at, octet_length(payload::text) AS payload_bytes
    FROM {table}
    WHERE published_at IS NULL
      AND quarantined_at IS NULL
      AND next_attempt_at <= now()
    ORDER BY created_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
