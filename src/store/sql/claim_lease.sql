-- The second half of both claims (claim.sql, claim_ordered.sql): cuts
-- their locked candidates `due` (id, created_at and the payload as JSON
-- text, `body`) at the byte budget $3 (always the first row) and leases
-- what is left for $2 milliseconds, counting the attempt. A payload larger
-- than $4 bytes is not returned, only its size. Candidate rows cut here
-- are not updated; their locks end with the claim's transaction, which
-- commits at once.
--
-- The rows are leased in a statement of their own, `leased`, which finds
-- them where the candidates' scans locked them (see
-- LEASED_BY_ROW_VERSION in store/mod.rs): on a plain table by their row
-- versions' addresses (ctid), a TID scan that reads no index at all; on
-- a partitioned one, where an address names a row only within its
-- partition, by primary key, one index scan of the batch's keys. Either
-- way there is one path, whatever the planner estimates. Joined to the
-- candidates instead, the lease took a probe per row. Under a custom plan
-- that join hashed the whole table (a sequential scan, 45 ms) whenever
-- the table was small and the two claim paths' estimates added up to
-- more than a batch; under a generic plan (claim_generic_begin.sql) each
-- probe also searched the batch's keys again. What the lease returns is
-- then joined to the candidates for their bodies: two sets of at most a
-- batch, hashed. Together 0.55 ms less of a 1.77 ms claim of 100 rows,
-- and the addresses about 0.16 ms less again (see docs/performance.md,
-- "The lease on its own, and ordered claims on a generic plan", and
-- "A lease by row address").
--
-- Each column is read through its shared cast (see casts.rs), as the
-- admin commands read it. The eleventh column, on every row, is how many
-- candidates the byte budget left out: a claim that left none, leased
-- every row it locked and took fewer rows than $1 read all it could (see
-- relay/windows.rs).
--
-- Every budgeted candidate comes back, the ones the lease did not find
-- with `leased` false, their id and size but no columns of the lease nor
-- their body: a row changed after the
-- statement's snapshot, every row once a plain table has been
-- converted to a partitioned one under a claim written for the plain one,
-- or the rows of tables that began to inherit from it (see
-- LEASED_BY_ROW_VERSION). The relay publishes none of them, and looks at
-- the table's kind again at once, so that a conversion or a new
-- inheritor does not hold claims up until the next periodic look.
--
-- Neither column set here is in an index (migrations/0008_hot_lease.sql):
-- the lease is a HOT update when the row's page has room, which the
-- table's fillfactor keeps. {headers} is the producer's optional headers
-- column read the same way, or `NULL::text` on a table without it.
budgeted AS (
    SELECT id, ctid, body, payload_bytes, interrupted
    FROM (
        SELECT id, ctid, body, payload_bytes, interrupted,
               row_number() OVER w AS position,
               sum(payload_bytes) OVER w AS running_bytes
        FROM (SELECT id, ctid, created_at, body, interrupted, octet_length(body)::bigint AS payload_bytes FROM due) AS measured
        WINDOW w AS (ORDER BY created_at, id)
    ) AS d
    WHERE position = 1 OR running_bytes <= $3::bigint
),
leased AS (
    UPDATE {table} AS t
    SET attempt_count = t.attempt_count + 1,
        leased_until = now() + $2::bigint * interval '1 millisecond'
    WHERE {leased_rows}
    RETURNING t.id, {read:t.causation_id} AS causation_id, {read:t.event_type} AS event_type,
              {read:t.aggregate_id} AS aggregate_id, {read:t.created_at} AS created_at,
              {read:t.attempt_count} AS attempt_count, {headers} AS headers
)
SELECT b.id, l.causation_id, l.event_type, l.aggregate_id,
       CASE WHEN l.id IS NOT NULL AND b.payload_bytes <= $4::bigint THEN b.body END,
       b.payload_bytes, l.created_at, l.attempt_count, l.headers, b.interrupted,
       (SELECT count(*) FROM due) - (SELECT count(*) FROM budgeted),
       l.id IS NOT NULL AS leased
FROM budgeted AS b
LEFT JOIN leased AS l ON l.id = b.id
