-- The session advisory lock that serialises `migrate` runs on a database,
-- without waiting: true if this session now holds it. The same key as
-- migrate_lock_transaction.sql, so both kinds of run exclude each other.
SELECT pg_try_advisory_lock(hashtext('outbox-relay migrate'))
