-- One replica at a time counts the backlog of a table: a transaction-level
-- advisory lock, tried (never waited for) at the start of each refresh's
-- transaction and released by its commit. Keyed like retention_lock.sql
-- (the table's oid as second key), under a name of its own, so gauges and
-- retention never wait for each other. A transaction-level lock also works
-- through a transaction-pooling proxy.
SELECT pg_try_advisory_xact_lock(hashtext('outbox-relay gauges'), $1::text::regclass::oid::int4)
