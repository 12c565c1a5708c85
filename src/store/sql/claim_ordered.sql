-- OUTBOX_ORDERING=aggregate: claims due rows that are the head of their
-- aggregate, i.e. have no unpublished predecessor, and leases them for $2
-- milliseconds, within the same row and byte budgets ($1, $3, $4) as
-- claim.sql (see there for the two claim paths, the lease, the budget and
-- the casts); like it, completed by claim_lease.sql. The order within an
-- aggregate is (created_at, id), or (sequence_number, created_at, id) when
-- the table has a producer-written sequence_number column; the relay fills
-- {predecessor_key} and {row_key} accordingly.
--
-- The route filter is as in claim.sql. It leaves out a row, never its
-- predecessors: a successor routed elsewhere still waits for them.
--
-- A predecessor that is in flight (leased), backing off or quarantined is
-- unpublished, so its successors wait: a row is never published before its
-- predecessor's publish has committed, on any replica. Which claim path a
-- row is on does not matter to that check, which reads the aggregate index
-- (every unpublished row, quarantined ones included). Only the stuck
-- aggregate waits; the walk goes on to other aggregates' heads.
--
-- Plan: the two range scans of claim.sql; each candidate costs one probe
-- of the aggregate index (aggregate_id, created_at, id) WHERE published_at
-- IS NULL for the anti-join. Leased and backing-off rows are not walked,
-- but untried rows behind a stuck head are, on every claim, so a very long
-- stuck aggregate makes claims slower; the stuck-aggregate gauge shows it.
WITH tried AS (
    SELECT t.id, t.created_at, {read:t.payload} AS body,
           (t.leased_until IS NOT NULL OR (t.last_error IS NULL AND t.attempt_count > 0)) AS interrupted
    FROM {table} AS t
    WHERE t.published_at IS NULL
      AND t.quarantined_at IS NULL
      AND t.last_error IS NOT NULL
      AND t.next_attempt_at <= now()
      AND (t.leased_until IS NULL OR t.leased_until <= now()){route_filter}
      AND NOT EXISTS (
          SELECT 1
          FROM {table} AS p
          WHERE p.aggregate_id = t.aggregate_id
            AND p.published_at IS NULL
            AND {predecessor_key} < {row_key}
      )
    ORDER BY t.next_attempt_at
    LIMIT $1
    FOR UPDATE OF t SKIP LOCKED
),
untried AS (
    SELECT t.id, t.created_at, {read:t.payload} AS body,
           (t.leased_until IS NOT NULL OR (t.last_error IS NULL AND t.attempt_count > 0)) AS interrupted
    FROM {table} AS t
    WHERE t.published_at IS NULL
      AND t.quarantined_at IS NULL
      AND t.last_error IS NULL
      AND t.next_attempt_at <= now()
      AND (t.leased_until IS NULL OR t.leased_until <= now()){route_filter}
      AND NOT EXISTS (
          SELECT 1
          FROM {table} AS p
          WHERE p.aggregate_id = t.aggregate_id
            AND p.published_at IS NULL
            AND {predecessor_key} < {row_key}
      )
    ORDER BY t.created_at, t.id
    LIMIT $1 - (SELECT count(*) FROM tried)
    FOR UPDATE OF t SKIP LOCKED
),
due AS (
    SELECT id, created_at, body, interrupted FROM tried
    UNION ALL
    SELECT id, created_at, body, interrupted FROM untried
)
