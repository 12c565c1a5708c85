-- OUTBOX_ORDERING=aggregate: claims due rows that are the head of their
-- aggregate, i.e. have no unpublished predecessor, and leases them for $2
-- milliseconds, within the same row and byte budgets ($1, $3, $4) as
-- claim.sql (see there for the lease, the budget and the casts). The order within an
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
    SELECT t.id, t.created_at, octet_length(t.payload::text) AS payload_bytes
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
),
budgeted AS (
    SELECT id, payload_bytes
    FROM (
        SELECT id, payload_bytes,
               row_number() OVER w AS position,
               sum(payload_bytes) OVER w AS running_bytes
        FROM due
        WINDOW w AS (ORDER BY created_at, id)
    ) AS d
    WHERE position = 1 OR running_bytes <= $3::bigint
)
UPDATE {table} AS t
SET attempt_count = t.attempt_count + 1,
    next_attempt_at = now() + $2::bigint * interval '1 millisecond'
FROM budgeted AS b
WHERE t.id = b.id
RETURNING t.id, t.causation_id::uuid, t.event_type::text, t.aggregate_id::text,
          CASE WHEN b.payload_bytes <= $4::bigint THEN t.payload::text END,
          b.payload_bytes::bigint, t.created_at::timestamptz, t.attempt_count::int4
