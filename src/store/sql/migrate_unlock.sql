-- Releases the lock of migrate_try_lock.sql.
SELECT pg_advisory_unlock(hashtext('outbox-relay migrate'))
