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
-- ($5, $6), when not NULL, is where the fresh path starts, and the window
-- end placeholder is where it stops, as in claim.sql: a routed claim reads
-- the fresh index in windows (relay/windows.rs). An unrouted one passes
-- NULL and reads from the oldest row, as it always did.
--
-- A window's tail moves past the rows it could not take, and in an ordered
-- claim that includes every successor of a row in flight: one becomes a
-- head only once its predecessor's publish is recorded, by then behind
-- where the claims read. Left to the sweeps, each such row would wait
-- about a second, and every aggregate's next event with it. So `following`
-- takes the heads among the fresh rows behind the start ($5, $6) of the
-- aggregates whose rows the relay has just published ($7, as text: each
-- is turned back into the column's own type through the table's row type,
-- so that the condition is one probe of the aggregate index for each,
-- whatever that type is). Behind the start only, so that no row is both
-- there and in the window; rows that failed before come from `tried`.
-- Unquarantined and never failed are written as one `num_nulls` test, not
-- as the two `IS NULL` tests of the fresh index's predicate: written so,
-- the fresh index could serve the path too, and PostgreSQL chose it, a
-- range from the oldest row to the start filtered by aggregate, every
-- waiting row read again (measured: 20,000 of them each claim, whenever
-- the table's statistics were behind). Only the aggregate index's
-- predicate is implied now, so the path reads the given aggregates alone.
--
-- Plan: three range scans that stop at their LIMIT; each candidate costs
-- one probe of the aggregate index (aggregate_id, created_at, id) WHERE
-- published_at IS NULL for the anti-join, and `following` reads the
-- unpublished rows of the aggregates it is given from the same index.
-- Leased and backing-off rows are not walked, but untried rows behind a
-- stuck head are, on every claim from the oldest row, so a very long stuck
-- aggregate makes those claims slower; the stuck-aggregate gauge shows it.
WITH following AS (
    SELECT t.id, t.created_at, {read:t.payload} AS body,
           (t.leased_until IS NOT NULL OR (t.last_error IS NULL AND t.attempt_count > 0)) AS interrupted
    FROM {table} AS t
    WHERE t.aggregate_id = ANY (ARRAY(
              SELECT (json_populate_record(NULL::{table}, json_build_object('aggregate_id', published))).aggregate_id
              FROM unnest($7::text[]) AS published))
      AND t.published_at IS NULL
      AND num_nulls(t.quarantined_at, t.last_error) = 2
      AND t.next_attempt_at <= now()
      AND (t.leased_until IS NULL OR t.leased_until <= now()){route_filter}
      AND (t.created_at, t.id) < (COALESCE($5::timestamptz, '-infinity'),
                                  COALESCE($6::uuid, '00000000-0000-0000-0000-000000000000'))
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
tried AS (
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
    LIMIT $1 - (SELECT count(*) FROM following)
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
      AND (t.created_at, t.id) >= (COALESCE($5::timestamptz, '-infinity'),
                                   COALESCE($6::uuid, '00000000-0000-0000-0000-000000000000')){window_end}
      AND NOT EXISTS (
          SELECT 1
          FROM {table} AS p
          WHERE p.aggregate_id = t.aggregate_id
            AND p.published_at IS NULL
            AND {predecessor_key} < {row_key}
      )
    ORDER BY t.created_at, t.id
    LIMIT $1 - (SELECT count(*) FROM following) - (SELECT count(*) FROM tried)
    FOR UPDATE OF t SKIP LOCKED
),
due AS (
    SELECT id, created_at, body, interrupted FROM following
    UNION ALL
    SELECT id, created_at, body, interrupted FROM tried
    UNION ALL
    SELECT id, created_at, body, interrupted FROM untried
)
