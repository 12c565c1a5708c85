-- `quarantine list`: served by the quarantined index, oldest first.
SELECT id, event_type::text, attempt_count, last_error, quarantined_at
FROM {table}
WHERE quarantined_at IS NOT NULL AND published_at IS NULL
ORDER BY quarantined_at, id
