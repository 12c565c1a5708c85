-- Rows published in the last $1 milliseconds (`status`: the last hour).
-- A range scan of the published index over the recent end only; the
-- explicit IS NOT NULL matches that index's predicate.
SELECT count(*)
FROM {table}
WHERE published_at IS NOT NULL
  AND published_at >= now() - $1::bigint * interval '1 millisecond'
