-- What every replica reads on each gauge refresh: the oldest unpublished
-- age, computed here (the first entry of the pending index, as in
-- backlog.sql: it drives the main alert, so it never waits for another
-- replica), and the counts stored for this table ($1) with whether they are
-- younger than $2 milliseconds. No row yet: all NULL but the age.
SELECT
    (SELECT COALESCE(GREATEST(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0), 0)
       FROM {table}
      WHERE published_at IS NULL AND quarantined_at IS NULL) AS oldest_unpublished_age_seconds,
    g.unpublished, g.unpublished_exact,
    g.quarantined, g.quarantined_exact,
    g.stuck_aggregates, g.stuck_aggregates_exact,
    EXTRACT(EPOCH FROM g.refreshed_at)::float8 AS refreshed_at,
    g.refreshed_at > now() - $2::bigint * interval '1 millisecond' AS fresh
FROM (SELECT 1) AS one
LEFT JOIN {gauges_table} AS g ON g.table_name = $1::text
