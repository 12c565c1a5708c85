-- Retention: deletes up to $2 rows published more than $1 milliseconds ago,
-- oldest first.
--
-- The inner select walks the published index from its old end and stops
-- after $2 entries; SKIP LOCKED passes over rows someone else holds (a
-- replay in progress) instead of waiting for them. The ids come back as an
-- array (an InitPlan), so the delete itself is primary-key lookups: a join
-- on a sub-select could let the planner prefer a full scan of the table.
-- Unpublished and quarantined rows have published_at NULL and are never in
-- that index, so they cannot be picked.
DELETE FROM {table}
WHERE id = ANY(ARRAY(
    SELECT id
    FROM {table}
    WHERE published_at IS NOT NULL
      AND published_at < now() - $1::bigint * interval '1 millisecond'
    ORDER BY published_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))
