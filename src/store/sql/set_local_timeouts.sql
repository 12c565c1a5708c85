-- Bounds every statement of the current transaction on the server side
-- ($1 in milliseconds): a statement that runs too long, or waits too long
-- for a lock, is cancelled by PostgreSQL itself rather than left running on
-- a pooled connection after the client stopped waiting. Local to the
-- transaction, so it never leaks to the relay's other statements.
SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $1, true)
