-- How many characters last_error takes (reschedule.sql and quarantine.sql
-- cut each reason to it): the start-up check takes a producer's varchar
-- of any length, and one reason longer than it would fail the recording
-- statement for the whole batch, whose rows would then be retried and fail
-- the same way for ever. A varchar(n)'s typmod is n + 4 (on the column, or
-- on its domain); text has none, and the relay's reasons are at most
-- 1,000 characters already (last_errors in mod.rs). One catalog lookup
-- per statement, on failure paths only.
COALESCE((
        SELECT CASE WHEN a.atttypmod > 4 THEN a.atttypmod - 4
                    WHEN ty.typtypmod > 4 THEN ty.typtypmod - 4 END
        FROM pg_attribute AS a
        JOIN pg_type AS ty ON ty.oid = a.atttypid
        WHERE a.attrelid = '{table}'::regclass AND a.attname = 'last_error'), 1000)
