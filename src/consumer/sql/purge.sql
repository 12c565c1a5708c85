-- Deletes up to $3 of consumer $1's marks older than $2 milliseconds,
-- oldest first; the caller repeats it until a batch comes back short.
--
-- Plan: the subquery walks processed_message_processed_at_idx from the
-- oldest entry, filters consumer_name and stops at the LIMIT; the DELETE
-- then finds each row by its primary key. SKIP LOCKED lets replicas of a
-- consumer purge at the same time without waiting on each other.
DELETE FROM processed_message
WHERE consumer_name = $1
  AND message_id IN (
      SELECT message_id
      FROM processed_message
      WHERE consumer_name = $1
        AND processed_at < now() - $2::bigint * interval '1 millisecond'
      ORDER BY processed_at
      LIMIT $3
      FOR UPDATE SKIP LOCKED
  )
