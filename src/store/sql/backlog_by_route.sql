-- `status` of a relay with routes: the unpublished rows of each route among
-- the $1 oldest (the pending index in created_at order, then a heap fetch
-- per row for its event type), so the cost is bounded as the other counts'
-- is: exact while fewer than $1 rows wait, the oldest $1 otherwise. {route}
-- is the number of the first route whose LIKE pattern ($2, in route order)
-- the event type matches, 0 for none: as the relay routes.
SELECT route, count(*) AS unpublished
FROM (
    SELECT {route} AS route
    FROM {table}
    WHERE published_at IS NULL AND quarantined_at IS NULL
    ORDER BY created_at
    LIMIT $1
) AS oldest
GROUP BY route
