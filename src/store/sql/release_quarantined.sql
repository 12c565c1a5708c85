-- `quarantine release <ID>...`: back in the queue, due now, with a fresh
-- attempt budget. last_error is kept as the row's history until the next
-- failure replaces it. Rows that are not quarantined (any more) are left
-- alone, so a release can be repeated safely; RETURNING tells the command
-- which of the given ids were released.
UPDATE {table}
SET quarantined_at = NULL,
    attempt_count = 0,
    next_attempt_at = now(),
    leased_until = NULL
WHERE id = ANY($1::uuid[])
  AND quarantined_at IS NOT NULL
  AND published_at IS NULL
RETURNING id
