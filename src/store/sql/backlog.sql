-- The three backlog gauges (and `status`) in one round trip. Each
-- sub-select repeats the WHERE clause of a partial index word for word, so
-- the planner can prove the index covers it and never reads published rows:
--
-- * unpublished: an index-only scan of the pending index (its entries are
--   exactly the unpublished, unquarantined rows, due or backing off);
-- * oldest age: min(created_at) becomes a one-entry scan of the same index,
--   which leads with created_at;
-- * quarantined: a scan of the quarantined index, usually empty;
-- * stuck aggregates: aggregates whose head (oldest unpublished row) has
--   failed or is quarantined; with OUTBOX_ORDERING=aggregate these are held
--   back. A scan of the aggregate index (unpublished rows only) with one
--   probe of the same index per failed row.
--
-- The age is computed with the database clock, the clock created_at was
-- written with; GREATEST keeps a producer clock running ahead from showing a
-- negative age, COALESCE gives 0 on an empty backlog.
SELECT
    (SELECT count(*)
       FROM {table}
      WHERE published_at IS NULL AND quarantined_at IS NULL) AS unpublished,
    (SELECT COALESCE(GREATEST(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0), 0)
       FROM {table}
      WHERE published_at IS NULL AND quarantined_at IS NULL) AS oldest_unpublished_age_seconds,
    (SELECT count(*)
       FROM {table}
      WHERE quarantined_at IS NOT NULL AND published_at IS NULL) AS quarantined,
    (SELECT count(*)
       FROM {table} AS h
      WHERE h.published_at IS NULL
        AND (h.quarantined_at IS NOT NULL OR h.last_error IS NOT NULL)
        AND NOT EXISTS (
            SELECT 1
            FROM {table} AS p
            WHERE p.aggregate_id = h.aggregate_id
              AND p.published_at IS NULL
              AND (p.created_at, p.id) < (h.created_at, h.id)
        )) AS stuck_aggregates
