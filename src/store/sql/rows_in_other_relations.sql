-- Whether the outbox table ($1: its quoted, possibly qualified name) keeps
-- rows in relations other than itself: its partitions, when it is
-- natively partitioned, or the tables that inherit from it. A row's
-- address (ctid) names it only within its own relation, so claims of such
-- a table lease their rows by key (LEASED_BY_KEY in store/mod.rs).
SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = $1::text::regclass)
    OR EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent = $1::text::regclass)
