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
SELECT id, event_type::text, attempt_count, last_error, quarantined_at
FROM {table}
WHERE quarantined_at IS NOT NULL AND published_at IS NULL
  AND ($1::timestamptz IS NULL OR (quarantined_at, id) > ($1::timestamptz, $2::uuid))
ORDER BY quarantined_at, id
LIMIT $3
