-- `quarantine list`: one page of quarantined rows, oldest quarantine
-- first, in (quarantined_at, id) order: $3 rows after the keyset ($1, $2),
-- or from the start when $1 is NULL. A page never repeats or skips a row
-- that stays quarantined, however many are quarantined or released
-- between pages.
--
-- Plan: an index scan of the quarantined index from quarantined_at >= $1
-- (the planner derives that bound from the row comparison), with an
-- incremental sort on id among rows quarantined at the same instant (one
-- quarantine statement stamps its whole batch alike), stopped by the LIMIT.
-- The relay plans each execution for its parameters, so the `$1 IS NULL`
-- branch folds away. Only a group of equal quarantined_at is ever sorted.
--
-- The columns are read through the claim's casts (see casts.rs), so an
-- older table shape (a BIGINT attempt_count, quarantined_at without time
-- zone) lists as the spec table does; the filter and the order use the
-- bare quarantined_at, which the index holds. A timestamp compares
-- with the timestamptz cursor in the session's time zone, as it is read.
SELECT id, {read:event_type}, {read:attempt_count}, {read:last_error}, {read:quarantined_at}
FROM {table}
WHERE quarantined_at IS NOT NULL AND published_at IS NULL
  AND ($1::timestamptz IS NULL OR (quarantined_at, id) > ($1::timestamptz, $2::uuid))
ORDER BY quarantined_at, id
LIMIT $3
