-- Upgrades a seed-shaped table in place. Every statement is cheap on a large
-- table: ADD COLUMN with a constant (or now(), evaluated once) default and
-- DROP NOT NULL change only the catalog, never rewrite rows.
--
-- aggregate_id stays UUID on such tables: the relay reads it as text, so
-- converting it would rewrite the whole table under an exclusive lock for
-- nothing.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS causation_id UUID;
ALTER TABLE {table} ALTER COLUMN causation_id DROP NOT NULL;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS created_at TIMESTAMPTZ NOT NULL DEFAULT now();
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS published_at TIMESTAMPTZ;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS attempt_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now();
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS last_error TEXT;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS quarantined_at TIMESTAMPTZ;
