-- The function behind the optional NOTIFY trigger, which wakes idle relays
-- when rows are inserted. Whether the trigger itself is installed is a
-- setting (`OUTBOX_NOTIFY_TRIGGER`, applied by every `migrate`), because
-- NOTIFY costs producers: see docs/performance.md.
--
-- It is a hint only: relays still poll every OUTBOX_POLL_INTERVAL, so a lost
-- notification (or no trigger at all) delays rows, never loses them.
CREATE OR REPLACE FUNCTION {notify_function}() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({notify_channel_literal}, '');
    RETURN NULL;
END
$$;
