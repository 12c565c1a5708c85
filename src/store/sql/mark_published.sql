-- Confirmed rows, one statement per batch. Each row is matched with the
-- attempt its claim counted: once the lease has run out and another claim
-- has taken the row, this late outcome touches nothing (that claim records
-- its own). The published_at guard keeps it off a row an operator has
-- already dealt with.
--
-- Written so that the only plan is primary-key probes for the ids, since
-- it runs under a generic plan, inside claims and on its own (see
-- claim_generic_begin.sql), which may have been made on an empty table:
-- no join on id (a join made a full scan of the primary key in the key's
-- order look useful: 200,000 rows read to mark 100), the attempt looked
-- up by position instead, and the guard written as num_nulls, which
-- implies no partial index's predicate (`published_at IS NULL` made a full
-- scan of the aggregate index a candidate, and on an empty table the
-- chosen one). The ids come through a sub-select for the reason given at
-- NOT_FINISHED in store/mod.rs.
UPDATE {table} AS t
SET published_at = now()
WHERE t.id = ANY (ARRAY(SELECT unnest($1::uuid[])))
  AND t.attempt_count = ($2::int[])[array_position($1::uuid[], t.id)]
  AND num_nulls(t.published_at) = 1
