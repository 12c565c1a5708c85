-- OUTBOX_ORDERING=aggregate: claims up to $1 due rows that are the head of
-- their aggregate, i.e. have no unpublished predecessor, and leases them for
-- $2 milliseconds (see claim.sql for the lease). The order within an
-- aggregate is (created_at, id), or (sequence_number, created_at, id) when
-- the table has a producer-written sequence_number column; the relay fills
-- {predecessor_key} and {row_key} accordingly.
--
-- A predecessor that is in flight (leased), backing off or quarantined is
-- unpublished, so its successors wait: a row is never published before its
-- predecessor's publish has committed, on any replica. Only the stuck
-- aggregate waits; the walk goes on to other aggregates' heads.
--
-- Plan: the pending index in (created_at, id) order as in claim.sql; each
-- candidate costs one probe of the aggregate index (aggregate_id,
-- created_at, id) WHERE published_at IS NULL for the anti-join. Rows behind
-- a stuck head are walked past on every claim, so a very long stuck
-- aggregate makes claims slower; the stuck-aggregate gauge shows it.
WITH due AS (
    SELECT t.id
    FROM {table} AS t
    WHERE t.published_at IS NULL
      AND t.quarantined_at IS NULL
      AND t.next_attempt_at <= now()
      AND NOT EXISTS (
          SELECT 1
          FROM {table} AS p
          WHERE p.aggregate_id = t.aggregate_id
            AND p.published_at IS NULL
            AND {predecessor_key} < {row_key}
      )
    ORDER BY t.created_at, t.id
    LIMIT $1
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE {table} AS t
SET attempt_count = t.attempt_count + 1,
    next_attempt_at = now() + $2::bigint * interval '1 millisecond'
FROM due
WHERE t.id = due.id
RETURNING t.id, t.causation_id, t.event_type::text, t.aggregate_id::text,
          t.payload::text, t.created_at, t.attempt_count
