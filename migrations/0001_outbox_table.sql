-- The outbox table in the shape producers write to. A table that already
-- exists (the seed design) is left as it is here; 0002 adds what it lacks.
CREATE TABLE IF NOT EXISTS {table} (
    id              UUID PRIMARY KEY,
    causation_id    UUID,
    event_type      VARCHAR(150) NOT NULL,
    aggregate_id    TEXT NOT NULL,
    payload         JSONB NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at    TIMESTAMPTZ,
    attempt_count   INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error      TEXT,
    quarantined_at  TIMESTAMPTZ
);
