-- `migrate --partitioned`: the outbox table partitioned by range of
-- created_at, before 0001 runs (whose CREATE TABLE IF NOT EXISTS then
-- leaves it as it is). A partitioned table's primary key must hold the
-- partition key, so it is (id, created_at): PostgreSQL no longer enforces
-- that an id is unique across partitions on its own (ids are UUIDs that
-- producers write; see docs/operations.md).
--
-- The DEFAULT partition takes any row no range partition covers (a clock
-- far ahead, maintenance behind), so a producer's INSERT never fails for
-- want of a partition; retention moves such rows into their partition
-- when it creates it. Storage parameters belong on the partitions, which
-- get the fillfactor of 0009 when they are created.
CREATE TABLE IF NOT EXISTS {table} (
    id              UUID NOT NULL,
    causation_id    UUID,
    event_type      VARCHAR(150) NOT NULL,
    aggregate_id    TEXT NOT NULL,
    payload         JSONB NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at    TIMESTAMPTZ,
    attempt_count   INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error      TEXT,
    quarantined_at  TIMESTAMPTZ,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

CREATE TABLE IF NOT EXISTS {default_partition} PARTITION OF {table} DEFAULT
    WITH (fillfactor = 50);
