-- Where the window of a routed claim from ($1, $2) ends (NULL: from the
-- oldest row; see relay/windows.rs): the $3-th row of the fresh index from
-- there, in (created_at, id) order, or its newest row when fewer remain,
-- and how many rows that is. A claim that leaves a down destination's
-- rows out stops there, so that it steps over a window's worth of them at
-- most, however many are waiting.
--
-- Plan: a range scan of the fresh index that stops at the LIMIT (the rows
-- are counted whatever they hold, so the window is bounded by the entries
-- a claim steps over, not by how many it could take), then a sort of
-- those $3 keys for the last. The key is read as the claim reads it.
SELECT {read:created_at}, id, count(*) OVER ()
FROM (
    SELECT created_at, id
    FROM {table}
    WHERE published_at IS NULL
      AND quarantined_at IS NULL
      AND last_error IS NULL
      AND (created_at, id) >= (COALESCE($1::timestamptz, '-infinity'),
                               COALESCE($2::uuid, '00000000-0000-0000-0000-000000000000'))
    ORDER BY created_at, id
    LIMIT $3
) AS window_rows
ORDER BY created_at DESC, id DESC
LIMIT 1
