-- Serialises `migrate` runs through a transaction pooler, where a session
-- lock would stay on a server connection other clients then get: held
-- until the migration's transaction ends, waiting at most 10 s for
-- another run (the setting is set first, left to right). The same key as
-- migrate_try_lock.sql, so both kinds of run exclude each other.
SELECT set_config('lock_timeout', '10s', true),
       pg_advisory_xact_lock(hashtext('outbox-relay migrate'))
