-- The backlog counts of each outbox table in this schema, as the replica
-- that last computed them stored them. Counting costs up to a few hundred
-- thousand index entries, so one replica at a time does it (see
-- src/store/sql/gauges_lock.sql) and the others show what it stored, which
-- keeps the database's work the same however many replicas run. One row per
-- table, rewritten in place every few seconds.
--
-- A table of its own rather than columns on the outbox table: producers
-- never see it, and its writes never touch the outbox table's locks.
CREATE TABLE IF NOT EXISTS {gauges_table} (
    table_name             TEXT PRIMARY KEY,
    unpublished            BIGINT NOT NULL,
    unpublished_exact      BOOLEAN NOT NULL,
    quarantined            BIGINT NOT NULL,
    quarantined_exact      BOOLEAN NOT NULL,
    stuck_aggregates       BIGINT NOT NULL,
    stuck_aggregates_exact BOOLEAN NOT NULL,
    refreshed_at           TIMESTAMPTZ NOT NULL
);
