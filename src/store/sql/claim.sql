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
-- `interrupted` marks a row whose last attempt ended without an outcome:
-- its lease ran out (every outcome clears it), or it was given back after
-- one (`defer` keeps the attempts before it, and only a failure sets
-- last_error). The relay publishes such a row alone, so that a row that
-- kills the relay is not retried with batch-mates that then share its
-- attempts (see relay/decide.rs, isolate_interrupted).
--
-- Plan: two range scans that stop at the LIMIT, one per claim path (see
-- migrations/0008_hot_lease.sql), so the cost of a claim does not depend
-- on what else is in the table:
--
-- * `tried`: the retry index (rows that failed before) from its start up
--   to now(): only rows whose backoff has run out, oldest due first; rows
--   still backing off lie past now() in that index and are never read;
-- * `untried`: the fresh index (rows that never failed) in (created_at, id)
--   order, for what the tried rows left of the batch.
--
-- Neither index knows the lease (leased_until, so that leasing is a HOT
-- update): both paths check it on the heap row, and walk past the rows in
-- flight, at most the batches the relays are publishing. A lease that ran
-- out (a dead relay's) makes its row due where it lies. next_attempt_at is
-- checked on the fresh path too: a never-failed row has it at its insert,
-- and an older relay's lease is honoured.
--
-- ($5, $6), when not NULL, is where the fresh path starts in its
-- (created_at, id) order: a relay catching up passes the last row its
-- full claims took, so that the claim descends the index to it instead of
-- stepping over the entries of every row published since the last VACUUM
-- (published rows leave their entries in the fresh index until then, at
-- its start, which a claim from the start walks: measured at 3 ms a claim
-- with 200,000 of them) and over the rows the relay's other workers have
-- in flight. Rows older than that point which become due again (given back
-- after an outage, left by a dead relay, released) are found by the next
-- claim from the start, which the relay makes at least once a second (see
-- relay/claim_start.rs). NULL reads from the start: the lowest key there
-- is, rather than an `IS NULL` test, so that the start stays an index
-- condition in a generic plan (claim_generic_begin.sql), which cannot
-- fold such a test away.
--
-- Tried rows go first: they are nearly always the older events, and the
-- oldest unpublished age is what the main alert watches. SKIP LOCKED
-- passes over rows another replica is claiming at this moment. Published
-- and quarantined rows are in neither index. The payload is rendered as
-- JSON text once, here: its length is the byte budget's measure and the
-- text is the message body.
--
-- Every column is read through its shared cast (see casts.rs, which the
-- admin commands use too), so a table in an older shape (created_at
-- without time zone, a BIGINT attempt_count, a UUID aggregate_id) works
-- as it is.
--
-- The route filter placeholder is empty, or the condition that leaves out
-- the rows routed to destinations that are down (see route_filter in
-- store/mod.rs). It is a filter on the scanned rows, not an index
-- condition: while a destination is down, claims read past its waiting
-- rows (a heap fetch each, in the untried path those older than what is
-- taken) without locking or updating them; nothing is written for them
-- until the destination is back.
--
-- The window end placeholder is empty, or, in a routed claim, where its
-- fresh path stops (inclusive; NULL: nowhere): a claim that leaves some
-- destination's rows out reads the fresh index in bounded windows (see
-- relay/windows.rs), so that no claim steps over more than a window of
-- the waiting rows, however many there are. Written like the start, so
-- that it stays an index condition in a generic plan.
--
-- The finish placeholder after WITH is empty, or claim_finish.sql: the
-- worker's previous batch recorded in this same statement. Both paths'
-- last condition then keeps the rows it records out of the claim: were
-- one's lease to run out first, this statement would otherwise both
-- record and claim it, in an order PostgreSQL does not define.
WITH {finish}tried AS (
    SELECT id, ctid, created_at, {read:payload} AS body,
           (leased_until IS NOT NULL OR (last_error IS NULL AND attempt_count > 0)) AS interrupted
    FROM {table}
    WHERE published_at IS NULL
      AND quarantined_at IS NULL
      AND last_error IS NOT NULL
      AND next_attempt_at <= now()
      AND (leased_until IS NULL OR leased_until <= now()){not_finished}{route_filter}
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
untried AS (
    SELECT id, ctid, created_at, {read:payload} AS body,
           (leased_until IS NOT NULL OR (last_error IS NULL AND attempt_count > 0)) AS interrupted
    FROM {table}
    WHERE published_at IS NULL
      AND quarantined_at IS NULL
      AND last_error IS NULL
      AND next_attempt_at <= now()
      AND (leased_until IS NULL OR leased_until <= now()){not_finished}{route_filter}
      AND (created_at, id) >= (COALESCE($5::timestamptz, '-infinity'),
                               COALESCE($6::uuid, '00000000-0000-0000-0000-000000000000')){window_end}
    ORDER BY created_at, id
    LIMIT $1 - (SELECT count(*) FROM tried)
    FOR UPDATE SKIP LOCKED
),
due AS (
    SELECT id, ctid, created_at, body, interrupted FROM tried
    UNION ALL
    SELECT id, ctid, created_at, body, interrupted FROM untried
)
