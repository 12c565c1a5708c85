-- Whether the outbox table ($1: its quoted, possibly qualified name) is
-- natively partitioned (relkind 'p'). The relay looks this up itself, so
-- `run`, retention and the admin commands need no setting for it; only
-- `migrate --partitioned` creates such a table.
SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass($1))
