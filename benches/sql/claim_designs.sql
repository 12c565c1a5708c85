-- What the claim designs of issue #28 cost PostgreSQL, statements alone:
-- one session, no broker, no relay. Each design drains its own table of
-- :rows rows (the relay's columns and indexes, ~300-byte payloads) in
-- batches of 100, :rounds times, in turn, and reports the session's own
-- CPU (from /proc, so run it on the database's host as a superuser), its
-- wall time and the WAL it wrote, per event; medians over the rounds.
--
--   psql -q -h 127.0.0.1 -U postgres -d postgres -v rows=50000 -v rounds=3 \
--        -f benches/sql/claim_designs.sql
--
-- It works in a schema of its own, claim_designs, and drops it at the
-- end. The statements follow the designs, not the relay's SQL word for
-- word (no route filter, no retry path, one worker): they measure what
-- each design writes and reads per batch.
--
-- * row_lock: one transaction per batch, rows locked FOR UPDATE across
--   it, one UPDATE marks them (the benchmark's lean loop);
-- * lease: today's claim (src/store/sql/claim.sql and claim_lease.sql):
--   a committed lease on every row, then the mark matched on the attempt;
-- * lease_ff50: the same on a table with fillfactor 50, room on each page
--   for every row's lease to be a HOT update;
-- * journal: one row per claimed batch instead of a lease per row: lock
--   the candidates, then record the batch for those that no live batch
--   holds (a second statement, so a second snapshot), commit; the mark
--   deletes the batch and marks its rows.
--
-- The lease and journal designs are planned for their parameters every
-- time (plan_cache_mode = force_custom_plan), as the relay plans its
-- statements; the row lock reuses its plans, as a prepared loop does.
\set ON_ERROR_STOP on
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS claim_designs CASCADE;
CREATE SCHEMA claim_designs;
SET search_path = claim_designs;
SET enable_bitmapscan = off;

CREATE TABLE journal (
    batch bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ids uuid[] NOT NULL,
    leased_until timestamptz NOT NULL
);
CREATE TABLE results (design text, round int, cpu_us numeric, wall_us numeric, wal_bytes numeric, left_over bigint);

-- A table of the relay's shape (migrations/0001 to 0008), filled.
CREATE PROCEDURE fill(t text, n int, fillfactor int) LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TABLE IF EXISTS %I', t);
    EXECUTE format($f$CREATE TABLE %I (
        id uuid PRIMARY KEY, causation_id uuid, event_type varchar(150) NOT NULL,
        aggregate_id text NOT NULL, payload jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
        attempt_count int NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(),
        last_error text, quarantined_at timestamptz, leased_until timestamptz
    ) WITH (fillfactor = %s)$f$, t, fillfactor);
    EXECUTE format('CREATE INDEX ON %I (created_at, id) WHERE published_at IS NULL AND quarantined_at IS NULL', t);
    EXECUTE format('CREATE INDEX ON %I (next_attempt_at) WHERE published_at IS NULL AND quarantined_at IS NULL AND last_error IS NOT NULL', t);
    EXECUTE format('CREATE INDEX ON %I (quarantined_at) WHERE quarantined_at IS NOT NULL AND published_at IS NULL', t);
    EXECUTE format('CREATE INDEX ON %I (published_at) WHERE published_at IS NOT NULL', t);
    EXECUTE format('CREATE INDEX ON %I (aggregate_id, created_at, id) WHERE published_at IS NULL', t);
    EXECUTE format('CREATE INDEX ON %I (created_at, id) WHERE published_at IS NULL AND quarantined_at IS NULL AND last_error IS NULL', t);
    EXECUTE format($f$INSERT INTO %I (id, event_type, aggregate_id, payload, created_at)
        SELECT gen_random_uuid(), 'order.created', 'order-' || (g %% 1000),
               jsonb_build_object('order', g, 'note', repeat('x', 260)),
               now() - interval '1 hour' + g * interval '1 microsecond'
        FROM generate_series(1, %s) AS g$f$, t, n);
    EXECUTE format('ANALYZE %I', t);
END $$;

CREATE FUNCTION session_cpu_ticks() RETURNS bigint LANGUAGE sql AS $$
    SELECT split_part(stat, ' ', 12)::bigint + split_part(stat, ' ', 13)::bigint
    FROM (SELECT split_part(pg_read_file('/proc/' || pg_backend_pid() || '/stat'), ') ', 2) AS stat) AS s
$$;

CREATE PROCEDURE drain_row_lock() LANGUAGE plpgsql AS $$
DECLARE ids uuid[]; bodies text[];
BEGIN
    LOOP
        SELECT array_agg(id), array_agg(body) INTO ids, bodies FROM (
            SELECT id, causation_id, event_type::text, aggregate_id, payload::text AS body, created_at
            FROM row_lock
            WHERE published_at IS NULL AND quarantined_at IS NULL AND next_attempt_at <= now()
            ORDER BY created_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) AS s;
        EXIT WHEN ids IS NULL;
        UPDATE row_lock SET published_at = now() WHERE id = ANY (ids);
        COMMIT;
    END LOOP;
    COMMIT;
END $$;

CREATE PROCEDURE drain_lease(t text) LANGUAGE plpgsql AS $$
DECLARE ids uuid[]; attempts int[]; bodies text[];
BEGIN
    SET LOCAL plan_cache_mode = force_custom_plan;
    LOOP
        EXECUTE format($f$
        WITH untried AS (
            SELECT id, created_at, payload::text AS body FROM %1$I
            WHERE published_at IS NULL AND quarantined_at IS NULL AND last_error IS NULL
              AND next_attempt_at <= now() AND (leased_until IS NULL OR leased_until <= now())
            ORDER BY created_at, id LIMIT 100 FOR UPDATE SKIP LOCKED),
        budgeted AS (
            SELECT id, body FROM (
                SELECT id, body, row_number() OVER w AS position, sum(octet_length(body)) OVER w AS running
                FROM untried WINDOW w AS (ORDER BY created_at, id)) AS d
            WHERE position = 1 OR running <= 16777216),
        leased AS (
            UPDATE %1$I AS t
            SET attempt_count = t.attempt_count + 1, leased_until = now() + interval '1 minute'
            FROM budgeted AS b
            WHERE t.id = ANY (ARRAY(SELECT id FROM budgeted)) AND t.id = b.id
            RETURNING t.id, t.causation_id, t.event_type::text, t.aggregate_id, b.body, t.created_at, t.attempt_count)
        SELECT array_agg(id), array_agg(attempt_count), array_agg(body) FROM leased$f$, t)
        INTO ids, attempts, bodies;
        COMMIT;
        SET LOCAL plan_cache_mode = force_custom_plan;
        EXIT WHEN ids IS NULL;
        EXECUTE format($f$
        UPDATE %I AS t SET published_at = now()
        FROM unnest($1, $2) AS c(id, attempt)
        WHERE t.id = c.id AND t.attempt_count = c.attempt AND t.published_at IS NULL$f$, t)
        USING ids, attempts;
        COMMIT;
        SET LOCAL plan_cache_mode = force_custom_plan;
    END LOOP;
END $$;

CREATE PROCEDURE drain_journal() LANGUAGE plpgsql AS $$
DECLARE ids uuid[]; bodies text[]; b bigint;
BEGIN
    SET LOCAL plan_cache_mode = force_custom_plan;
    LOOP
        SELECT array_agg(id), array_agg(body) INTO ids, bodies FROM (
            SELECT id, causation_id, event_type::text, aggregate_id, payload::text AS body, created_at
            FROM journaled
            WHERE published_at IS NULL AND quarantined_at IS NULL AND last_error IS NULL
              AND next_attempt_at <= now()
              AND id <> ALL (ARRAY(SELECT unnest(j.ids) FROM journal AS j WHERE j.leased_until > now()))
            ORDER BY created_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) AS s;
        EXIT WHEN ids IS NULL;
        INSERT INTO journal (ids, leased_until)
        SELECT array_agg(c), now() + interval '1 minute' FROM unnest(ids) AS c
        WHERE c <> ALL (ARRAY(SELECT unnest(j.ids) FROM journal AS j WHERE j.leased_until > now()))
        RETURNING batch INTO b;
        COMMIT;
        SET LOCAL plan_cache_mode = force_custom_plan;
        WITH done AS (DELETE FROM journal WHERE batch = b RETURNING journal.ids)
        UPDATE journaled SET published_at = now()
        WHERE id = ANY (ARRAY(SELECT unnest(done.ids) FROM done)) AND published_at IS NULL;
        COMMIT;
        SET LOCAL plan_cache_mode = force_custom_plan;
    END LOOP;
    COMMIT;
END $$;

-- One round of one design: fill its table, drain it, record the cost.
CREATE PROCEDURE measure(design text, round int, n int) LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; c0 bigint; w0 pg_lsn; left_over bigint;
    t text := CASE design WHEN 'row_lock' THEN 'row_lock' WHEN 'journal' THEN 'journaled' ELSE design END;
BEGIN
    CALL fill(t, n, CASE design WHEN 'lease_ff50' THEN 50 ELSE 80 END);
    TRUNCATE journal;
    COMMIT;
    t0 := clock_timestamp(); c0 := session_cpu_ticks(); w0 := pg_current_wal_lsn();
    CASE design
        WHEN 'row_lock' THEN CALL drain_row_lock();
        WHEN 'journal' THEN CALL drain_journal();
        ELSE CALL drain_lease(t);
    END CASE;
    EXECUTE format('SELECT count(*) FROM %I WHERE published_at IS NULL', t) INTO left_over;
    INSERT INTO results VALUES (design, round,
        (session_cpu_ticks() - c0) * 1e6 / 100 / n,  -- clock ticks of 10 ms
        extract(epoch FROM clock_timestamp() - t0) * 1e6 / n,
        pg_wal_lsn_diff(pg_current_wal_lsn(), w0) / n,
        left_over);
    EXECUTE format('DROP TABLE %I', t);
    COMMIT;
END $$;

SELECT set_config('claim_designs.rows', :'rows', false), set_config('claim_designs.rounds', :'rounds', false) \gset
DO $$
BEGIN
    FOR r IN 1 .. current_setting('claim_designs.rounds')::int LOOP
        CALL measure('row_lock', r, current_setting('claim_designs.rows')::int);
        CALL measure('lease', r, current_setting('claim_designs.rows')::int);
        CALL measure('lease_ff50', r, current_setting('claim_designs.rows')::int);
        CALL measure('journal', r, current_setting('claim_designs.rows')::int);
    END LOOP;
END $$;

SELECT design,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY cpu_us)::numeric, 1) AS "CPU µs/event",
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY wall_us)::numeric, 1) AS "wall µs/event",
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY wal_bytes)::numeric) AS "WAL bytes/event",
       string_agg(round(cpu_us, 1)::text, ', ' ORDER BY round) AS "CPU each round",
       sum(left_over) AS "left unpublished"
FROM results
GROUP BY design
ORDER BY array_position(ARRAY['row_lock', 'lease', 'lease_ff50', 'journal'], design);

-- A design that left rows behind measured less than a drain.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM results WHERE left_over <> 0) THEN
        RAISE EXCEPTION 'a design left rows unpublished: see "left unpublished"';
    END IF;
END $$;

RESET search_path;
DROP SCHEMA claim_designs CASCADE;
