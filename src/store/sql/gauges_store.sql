-- Stores the counts this replica just computed for table $1 (under the
-- gauges lock), stamped with the database clock at the start of its
-- transaction; returns the stamp as Unix seconds.
INSERT INTO {gauges_table} AS g
    (table_name, unpublished, unpublished_exact, quarantined, quarantined_exact,
     stuck_aggregates, stuck_aggregates_exact, refreshed_at)
VALUES ($1::text, $2, $3, $4, $5, $6, $7, now())
ON CONFLICT (table_name) DO UPDATE
SET unpublished = EXCLUDED.unpublished,
    unpublished_exact = EXCLUDED.unpublished_exact,
    quarantined = EXCLUDED.quarantined,
    quarantined_exact = EXCLUDED.quarantined_exact,
    stuck_aggregates = EXCLUDED.stuck_aggregates,
    stuck_aggregates_exact = EXCLUDED.stuck_aggregates_exact,
    refreshed_at = EXCLUDED.refreshed_at
RETURNING EXTRACT(EPOCH FROM g.refreshed_at)::float8
