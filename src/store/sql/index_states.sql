-- What the catalog holds under each index name `migrate` expects on the
-- outbox table ($1: the table's name as text, $2: the bare index names),
-- one row per name: whether a relation of that name is in the table's
-- schema, whether it is an index of this table, whether that index is
-- usable (valid: a finished build; ready: maintained by writes), and its
-- schema-qualified name for a DROP. An interrupted CREATE INDEX
-- CONCURRENTLY leaves exactly such a name behind, not valid.
--
-- Catalog lookups by name (pg_class_relname_nsp_index) and by oid
-- (pg_index_indexrelid_index): a handful of rows whatever the table holds.
SELECT wanted.name,
       rel.oid IS NOT NULL AS taken,
       coalesce(ix.indrelid = $1::text::regclass, false) AS on_table,
       coalesce(ix.indisvalid AND ix.indisready, false) AS usable,
       coalesce(quote_ident(ns.nspname) || '.' || quote_ident(rel.relname), '') AS qualified
FROM unnest($2::text[]) AS wanted(name)
LEFT JOIN pg_class AS rel
       ON rel.relname = wanted.name
      AND rel.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $1::text::regclass)
LEFT JOIN pg_namespace AS ns ON ns.oid = rel.relnamespace
LEFT JOIN pg_index AS ix ON ix.indexrelid = rel.oid
