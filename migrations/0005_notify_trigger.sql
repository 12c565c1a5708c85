-- Wakes idle relays when rows are inserted, so a quiet relay publishes
-- within milliseconds without polling the table hard. A hint only: relays
-- still poll every OUTBOX_POLL_INTERVAL, so a lost notification (or no
-- trigger at all) delays rows, never loses them.
--
-- FOR EACH STATEMENT: one NOTIFY per INSERT statement, however many rows;
-- PostgreSQL also folds identical notifications of one transaction into
-- one. NOTIFY does take a global lock while the producer commits: see the
-- README's Performance section for what it costs, and drop the trigger
-- (`DROP TRIGGER {notify_trigger_name} ON {table}`) to trade idle latency
-- for producer throughput.
CREATE OR REPLACE FUNCTION {notify_function}() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({notify_channel_literal}, '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS {notify_trigger} ON {table};
CREATE TRIGGER {notify_trigger}
    AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {notify_function}();
