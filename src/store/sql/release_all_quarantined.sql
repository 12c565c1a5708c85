-- `quarantine release --all`: every quarantined row, found through the
-- quarantined index, in one statement.
UPDATE {table}
SET quarantined_at = NULL,
    attempt_count = 0,
    next_attempt_at = now(),
    leased_until = NULL
WHERE quarantined_at IS NOT NULL
  AND published_at IS NULL
