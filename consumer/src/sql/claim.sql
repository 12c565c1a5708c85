-- Marks message $2 processed by consumer $1, inside the consumer's own
-- transaction; one row affected means this is the first time.
--
-- A concurrent transaction that inserted the same key first makes this one
-- wait on the primary key until it ends: if it commits, nothing is added
-- here (a duplicate); if it rolls back, the row is added here (first).
INSERT INTO processed_message (consumer_name, message_id)
VALUES ($1, $2)
ON CONFLICT DO NOTHING
