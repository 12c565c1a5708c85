-- The backlog as `status` and the table gauges report it, at a cost that
-- does not grow with the table: every part stops after a fixed number of
-- index entries. $1: the count cap, $2: the stuck-aggregate scan cap, $3 and
-- $4: the pending and quarantined indexes' qualified names (for their
-- statistics). Each sub-select repeats the WHERE clause of a partial index
-- word for word, so the planner can prove the index covers it and never
-- reads published rows:
--
-- * oldest age: min(created_at) is the first entry of the pending index,
--   which leads with created_at: exact, one entry (see gauges_read.sql);
-- * unpublished and quarantined: index-only scans of the pending and the
--   quarantined index that stop after $1 entries; exact below the cap. At
--   the cap the relay reports the index's entry count as of its last VACUUM
--   or ANALYZE (pg_class.reltuples: the planner's own estimate), never
--   less than the cap;
-- * stuck aggregates (whose head, their oldest unpublished row, has failed
--   or is quarantined; held back with OUTBOX_ORDERING=aggregate): among the
--   $2 oldest pending rows (pending index, heap read for last_error) and
--   the $2 oldest quarantined rows (quarantined index), the failed ones
--   with no unpublished predecessor, one probe of the aggregate index each.
--   A stuck head is the oldest row of its aggregate, so it is found among
--   the oldest rows; exact when both scans ended before their cap, a lower
--   bound otherwise.
--
-- Ages use the database clock, the clock created_at was written with;
-- GREATEST keeps a producer clock running ahead from showing a negative
-- age, COALESCE gives 0 on an empty backlog.
SELECT
    (SELECT COALESCE(GREATEST(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0), 0)
       FROM {table}
      WHERE published_at IS NULL AND quarantined_at IS NULL) AS oldest_unpublished_age_seconds,
    (SELECT count(*)
       FROM (SELECT 1
               FROM {table}
              WHERE published_at IS NULL AND quarantined_at IS NULL
              LIMIT $1) AS capped) AS unpublished_counted,
    (SELECT reltuples::float8 FROM pg_class WHERE oid = to_regclass($3::text)) AS unpublished_estimate,
    (SELECT count(*)
       FROM (SELECT 1
               FROM {table}
              WHERE quarantined_at IS NOT NULL AND published_at IS NULL
              LIMIT $1) AS capped) AS quarantined_counted,
    (SELECT reltuples::float8 FROM pg_class WHERE oid = to_regclass($4::text)) AS quarantined_estimate,
    pending.scanned AS pending_scanned,
    pending.stuck + quarantined.stuck AS stuck_aggregates,
    quarantined.scanned AS quarantined_scanned
FROM
    (SELECT count(*) AS scanned,
            count(*) FILTER (
                WHERE h.last_error IS NOT NULL
                  AND NOT EXISTS (
                      SELECT 1
                      FROM {table} AS p
                      WHERE p.aggregate_id = h.aggregate_id
                        AND p.published_at IS NULL
                        AND (p.created_at, p.id) < (h.created_at, h.id)
                  )
            ) AS stuck
       FROM (SELECT aggregate_id, created_at, id, last_error
               FROM {table}
              WHERE published_at IS NULL AND quarantined_at IS NULL
              ORDER BY created_at, id
              LIMIT $2) AS h) AS pending,
    (SELECT count(*) AS scanned,
            count(*) FILTER (
                WHERE NOT EXISTS (
                      SELECT 1
                      FROM {table} AS p
                      WHERE p.aggregate_id = h.aggregate_id
                        AND p.published_at IS NULL
                        AND (p.created_at, p.id) < (h.created_at, h.id)
                  )
            ) AS stuck
       FROM (SELECT aggregate_id, created_at, id
               FROM {table}
              WHERE quarantined_at IS NOT NULL AND published_at IS NULL
              ORDER BY quarantined_at
              LIMIT $2) AS h) AS quarantined
