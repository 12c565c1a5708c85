-- Deletes up to $3 of consumer $1's marks older than $2 milliseconds,
-- oldest first; the caller repeats it until a batch comes back short.
--
-- Plan: the array is built first (an InitPlan) from an index scan of
-- processed_message_processed_at_idx (consumer_name, processed_at), from
-- the consumer's oldest mark up to the LIMIT; the DELETE then finds those
-- rows with one scan of the primary key (message_id = ANY). Neither part
-- reads a mark it does not delete. SKIP LOCKED lets replicas of a consumer
-- purge at the same time without waiting on each other.
DELETE FROM processed_message
WHERE consumer_name = $1
  AND message_id = ANY(ARRAY(
      SELECT message_id
      FROM processed_message
      WHERE consumer_name = $1
        AND processed_at < now() - $2::bigint * interval '1 millisecond'
      ORDER BY processed_at
      LIMIT $3
      FOR UPDATE SKIP LOCKED
  ))
