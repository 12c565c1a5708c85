-- `replay`: rows published in [$1, $2) (now when $2 is NULL), optionally of
-- one event type ($3), become unpublished and due now, so the relay
-- publishes them again under the same ids. One set-based statement: a
-- range scan of the published index. Rows retention has already deleted
-- are gone and cannot be replayed. The event type is compared as the
-- claim reads it, as text, whatever the column's type (an enum, say).
UPDATE {table}
SET published_at = NULL,
    attempt_count = 0,
    next_attempt_at = now(),
    leased_until = NULL,
    quarantined_at = NULL
WHERE published_at IS NOT NULL
  AND published_at >= $1::timestamptz
  AND published_at < COALESCE($2::timestamptz, now())
  AND ($3::text IS NULL OR {read:event_type} = $3::text)
