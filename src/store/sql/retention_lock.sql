-- One replica at a time runs retention on a table: a transaction-level
-- advisory lock, tried (never waited for) at the start of each batch's own
-- transaction and released by its commit. The second key is the table's
-- oid, so `t` and `public.t` are one lock and two outbox tables in one
-- database are cleaned independently; the two-key form does not collide
-- with the one-key lock `migrate` takes.
SELECT pg_try_advisory_xact_lock(hashtext('outbox-relay retention'), $1::text::regclass::oid::int4)
