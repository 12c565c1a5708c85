-- Consumer-side deduplication for messages published by outbox-relay.
--
-- outbox-relay publishes at least once: a relay that crashes after the
-- broker confirmed a message and before it recorded that, a broker that
-- redelivers an unacknowledged message, or an operator's `replay` all hand
-- a consumer the same message (the same id) again. A consumer makes its
-- effect happen once by recording each message id it has applied, in the
-- same transaction as the effect:
--
--     BEGIN;
--     INSERT INTO processed_message (consumer_name, message_id)
--     VALUES ($1, $2) ON CONFLICT DO NOTHING;     -- 1 row: first time
--     -- ... apply the effect only if the insert added a row ...
--     COMMIT;                                     -- then ack the message
--
-- The mark commits with the effect and rolls back with it, so a crash
-- anywhere leaves either both or neither. Two deliveries of one id racing
-- each other serialise on the primary key: the second insert waits for the
-- first transaction and then adds nothing (or, if the first rolled back,
-- adds the row itself).
--
-- consumer_name lets several consumers (services, or independent handlers
-- in one service) share the table, each deduplicating on its own.
--
-- Apply it with `outbox_consumer::migrate`, or run this file with
-- your own migration tool: it is idempotent.
CREATE TABLE IF NOT EXISTS processed_message (
    consumer_name TEXT NOT NULL,
    message_id    UUID NOT NULL,
    processed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, message_id)
);

-- Retention deletes a consumer's oldest marks in bounded batches (see
-- `Deduplicator::purge_older_than`): this index hands them over in
-- processed_at order, so a batch reads only the rows it deletes instead of
-- sorting the consumer's whole history. Keep marks longer than any message
-- can come back: the broker's redelivery window and the furthest back an
-- operator may `replay`.
CREATE INDEX IF NOT EXISTS processed_message_processed_at_idx
    ON processed_message (consumer_name, processed_at);
