-- Rows that will not succeed by retrying: out of attempts, or rejected by
-- the sink. They leave the pending index and wait for an operator. Each
-- row only while its claim's attempt still stands (see mark_published.sql).
-- last_error is cut to the column's own length: the start-up check takes a
-- producer's varchar of any length, and one reason longer than it would
-- fail this statement for the whole batch, whose rows would then be
-- retried and fail the same way for ever. A varchar(n)'s typmod is n + 4
-- (on the column, or on its domain); text has none, and the relay's
-- reasons are at most 1,000 characters already (last_errors in mod.rs).
-- One catalog lookup per statement, on failure paths only.
UPDATE {table} AS t
SET last_error = left(f.error, COALESCE((
        SELECT CASE WHEN a.atttypmod > 4 THEN a.atttypmod - 4
                    WHEN ty.typtypmod > 4 THEN ty.typtypmod - 4 END
        FROM pg_attribute AS a
        JOIN pg_type AS ty ON ty.oid = a.atttypid
        WHERE a.attrelid = '{table}'::regclass AND a.attname = 'last_error'), 1000)),
    quarantined_at = now(),
    leased_until = NULL
FROM unnest($1::uuid[], $2::int[], $3::text[]) AS f(id, attempt, error)
WHERE t.id = f.id
  AND t.attempt_count = f.attempt
  AND t.published_at IS NULL
