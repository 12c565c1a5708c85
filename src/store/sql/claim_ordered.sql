-- OUTBOX_ORDERING=aggregate: claims due rows that are the head of their
-- aggregate, i.e. have no unpublished predecessor, and leases them for $2
-- milliseconds, within the same row and byte budgets ($1, $3, $4) as
-- claim.sql (see there for the two claim paths, the lease, the budget and
-- the casts); like it, completed by claim_lease.sql. The order within an
-- aggregate is (created_at, id), or (sequence_number, created_at, id) when
-- the table has a producer-written sequence_number column; the relay fills
-- {predecessor_key}, {row_key} and {head_order} accordingly.
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
-- end placeholder is where it stops, as in claim.sql: the relay's ordered
-- claims, routed or not, read the fresh index in windows (relay/windows.rs).
-- Behind an aggregate whose head is in flight, every other row of it is
-- one no claim can take, and a claim from the oldest row stepped over all
-- of them, with a probe for its predecessor each: 75-125 ms a claim while
-- 20,000 rows of 50 aggregates drained (see docs/performance.md), and
-- past statement_timeout with a few million. NULL reads from the oldest
-- row, as the operator's commands and a probe do.
--
-- A window's tail moves past the rows it could not take, and in an ordered
-- claim that includes every successor of a row in flight: one becomes a
-- head only once its predecessor's publish is recorded, by then behind
-- where the claims read. Left to the sweeps, each such row would wait
-- about a second, and every aggregate's next event with it. So `following`
-- takes, behind the start ($5, $6), the heads of the aggregates whose rows
-- the relay has just published ($7, their aggregate_ids as the relay reads
-- them, as text). Each is cast back to the column's own type, which the
-- relay looks up and fills in as {aggregate_type}, so that finding an
-- aggregate's head is one probe of the aggregate index: its first
-- unpublished row in the aggregate's order ({head_order}), taken if that
-- row is fresh, due, free and behind the start; if it is not, no row of
-- the aggregate is a head. Behind the start only, so that no row is both
-- there and in the window; rows that failed before come from `tried`.
-- The cast is of each value, so that it works for a column of an array
-- or composite type too. A head at or past the start is left there, on
-- its index entry, before its row is read: the window will reach it, and
-- most heads are there (a successor lies anywhere after its predecessor,
-- mostly ahead of where the claims read). Tested on the row instead, such
-- heads cost a primary-key probe each: 41% of this path's buffers, 15% of
-- the claim's (see docs/performance.md, "Ordered claims"). The heads
-- found (`heads`) are then read from the table as the relay fills in
-- the placeholder before `num_nulls`: on a plain table by primary key, `id = ANY(ARRAY(...))`, one index scan of
-- at most a batch of keys; on a partitioned one joined on id and
-- created_at, so that each is read from its own partition alone (an
-- array of keys is looked up in every partition; PostgreSQL 15 does not
-- prune partitions by one at run time). Their conditions are written so
-- that they imply no index's predicate (one `num_nulls` test, not two or
-- three `IS NULL` tests): with an earlier form of this path PostgreSQL
-- read the fresh index from the oldest row to the start instead, every
-- waiting row each claim, whenever the table's statistics were behind
-- (measured: 20,000 of them), and under a generic plan the whole
-- aggregate index. A head's place behind the start is tested on its
-- index entry only: an event's id and created_at never change.
--
-- On a plain table the relay runs this statement under a generic plan
-- on a direct connection (claim_generic_begin.sql), which saves planning
-- it for every batch (0.4-0.7 ms). So each of its scans has one sensible
-- path whatever the table held when the plan was made: the predecessor
-- test stays a subquery run per candidate (`OFFSET 0` keeps PostgreSQL
-- from turning it into a join, which a plan made on an empty table
-- filtered over the whole aggregate index), and `heads` and `published`
-- are read only through lateral probes and the array of keys. A
-- partitioned table's statement is planned for every batch.
--
-- Plan: two range scans of claim.sql that stop at their LIMIT, and for
-- each aggregate given one probe of the aggregate index (aggregate_id,
-- created_at, id) WHERE published_at IS NULL, and one of the primary key
-- if its head lies behind the start;
-- each range candidate costs one probe of the aggregate index for its
-- predecessor. With a sequence_number column an aggregate's head is found
-- by sorting its unpublished rows instead. Leased and backing-off rows
-- are not walked, but untried rows behind a stuck head are, on every
-- claim from the oldest row, so a very long stuck aggregate makes those
-- claims slower; the stuck-aggregate gauge shows it.
WITH tried AS (
    SELECT t.id, t.ctid, t.created_at, {read:t.payload} AS body,
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
          OFFSET 0
      )
    ORDER BY t.next_attempt_at
    LIMIT $1
    FOR UPDATE OF t SKIP LOCKED
),
heads AS (
    SELECT head_entry.id, head_entry.created_at
    FROM (SELECT DISTINCT given::{aggregate_type} AS aggregate_id
          FROM unnest($7::text[]) AS given) AS published
    CROSS JOIN LATERAL (
        SELECT first.id, first.created_at
        FROM {table} AS first
        WHERE first.aggregate_id = published.aggregate_id
          AND first.published_at IS NULL
        ORDER BY {head_order}
        LIMIT 1
    ) AS head_entry
    WHERE (head_entry.created_at, head_entry.id)
          < (COALESCE($5::timestamptz, '-infinity'),
             COALESCE($6::uuid, '00000000-0000-0000-0000-000000000000'))
),
following AS (
    SELECT t.id, t.ctid, t.created_at, {read:t.payload} AS body,
           (t.leased_until IS NOT NULL OR (t.last_error IS NULL AND t.attempt_count > 0)) AS interrupted
    {heads_read} num_nulls(t.published_at, t.quarantined_at, t.last_error) = 3
      AND t.next_attempt_at <= now()
      AND (t.leased_until IS NULL OR t.leased_until <= now()){route_filter}
    ORDER BY t.created_at, t.id
    LIMIT $1 - (SELECT count(*) FROM tried)
    FOR UPDATE OF t SKIP LOCKED
),
untried AS (
    SELECT t.id, t.ctid, t.created_at, {read:t.payload} AS body,
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
          OFFSET 0
      )
    ORDER BY t.created_at, t.id
    LIMIT $1 - (SELECT count(*) FROM tried) - (SELECT count(*) FROM following)
    FOR UPDATE OF t SKIP LOCKED
),
due AS (
    SELECT id, ctid, created_at, body, interrupted FROM tried
    UNION ALL
    SELECT id, ctid, created_at, body, interrupted FROM following
    UNION ALL
    SELECT id, ctid, created_at, body, interrupted FROM untried
)
