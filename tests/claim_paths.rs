//! The claim's two paths (migrations/0008_hot_lease.sql): due rows are
//! claimed, and nothing else is touched, however many rows are backing
//! off, leased (by this relay or an older one), quarantined or published
//! ahead of them; the claim reads the fresh and retry indexes, never the
//! table. Correctness only: how
//! long a claim takes behind 500,000 rows is measured by the benchmark.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::TestDb;
use outbox_relay::store::{render_column_reads, ClaimBudget, ClaimStart, DatabaseSettings, Ordering, Store};
use uuid::Uuid;

fn store(db: &TestDb) -> Store {
    let database = DatabaseSettings {
        database_url: db.url.clone(),
        table: "outbox_event".into(),
        database_pooler: "none".to_owned(),
    }
    .validate()
    .expect("valid settings");
    Store::new(&database, 2)
}

fn budget(rows: u32) -> ClaimBudget {
    ClaimBudget {
        rows,
        bytes: 16 * 1024 * 1024,
        max_payload: 16 * 1024 * 1024,
    }
}

const LEASE: Duration = Duration::from_secs(600);

/// Rows this many per kind stand ahead of the due ones (older created_at).
const AHEAD: i64 = 3000;

/// Fills the table, set-based, with rows the claim must leave alone, all
/// created a day ago, each kind its own event type and aggregate range:
/// backing off (tried, due in an hour), leased (claimed, lease running),
/// leased by a relay older than the lease column (next_attempt_at ahead),
/// quarantined and published. Then `due_tried` retries whose backoff has
/// run out (created an hour ago, due 1..n seconds ago, the oldest due
/// first) and `due_untried` new rows; returns their ids in that order.
async fn seed(db: &TestDb, due_tried: usize, due_untried: usize) -> (Vec<Uuid>, Vec<Uuid>) {
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                       attempt_count, next_attempt_at, leased_until, last_error, quarantined_at, published_at)
             SELECT gen_random_uuid(), kind, kind || '-' || (n % 50), jsonb_build_object('n', n),
                    now() - interval '1 day' + n * interval '1 millisecond',
                    CASE kind WHEN 'backing-off' THEN 3 WHEN 'quarantined' THEN 10 ELSE 1 END,
                    CASE kind WHEN 'backing-off' THEN now() + interval '1 hour'
                              WHEN 'leased-earlier' THEN now() + interval '10 minutes'
                              ELSE now() - interval '1 day' END,
                    CASE WHEN kind = 'leased' THEN now() + interval '10 minutes' END,
                    CASE WHEN kind IN ('backing-off', 'quarantined') THEN 'refused' END,
                    CASE WHEN kind = 'quarantined' THEN now() END,
                    CASE WHEN kind = 'published' THEN now() END
             FROM generate_series(1, $1::bigint) AS n,
                  unnest(ARRAY['backing-off', 'leased', 'leased-earlier', 'quarantined', 'published']) AS kind",
            &[&AHEAD],
        )
        .await
        .expect("rows ahead");
    let tried: Vec<Uuid> = (0..due_tried).map(|_| Uuid::new_v4()).collect();
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                       attempt_count, next_attempt_at, last_error)
             SELECT id, 'retry', 'retry-' || n, '{}'::jsonb, now() - interval '1 hour' + n * interval '1 millisecond',
                    2, now() - ($2::bigint - n + 1) * interval '1 second', 'refused'
             FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n)",
            &[&tried, &(due_tried as i64)],
        )
        .await
        .expect("due retries");
    let untried: Vec<Uuid> = (0..due_untried).map(|_| Uuid::new_v4()).collect();
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT id, 'new', 'new-' || n, '{}'::jsonb, now() + n * interval '1 millisecond'
             FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n)",
            &[&untried],
        )
        .await
        .expect("new rows");
    db.client
        .batch_execute("VACUUM ANALYZE outbox_event")
        .await
        .expect("analyze");
    (tried, untried)
}

/// What must hold of the rows ahead after any number of claims: each kind
/// as it was seeded.
async fn assert_rows_ahead_untouched(db: &TestDb) {
    for (kind, state) in [
        (
            "backing-off",
            "attempt_count = 3 AND next_attempt_at > now() + interval '50 minutes' AND published_at IS NULL AND quarantined_at IS NULL",
        ),
        (
            "leased",
            "attempt_count = 1 AND leased_until > now() + interval '5 minutes' AND published_at IS NULL AND quarantined_at IS NULL",
        ),
        (
            "leased-earlier",
            "attempt_count = 1 AND next_attempt_at > now() + interval '5 minutes' AND published_at IS NULL AND quarantined_at IS NULL",
        ),
        ("quarantined", "attempt_count = 10 AND quarantined_at IS NOT NULL"),
        ("published", "attempt_count = 1 AND published_at IS NOT NULL"),
    ] {
        assert_eq!(
            db.count(&format!("event_type = '{kind}' AND {state}")).await,
            AHEAD,
            "{kind} rows untouched"
        );
    }
}

fn ids(claimed: &outbox_relay::store::Claimed) -> Vec<Uuid> {
    claimed.events.iter().map(|e| e.id).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn due_rows_are_claimed_past_rows_backing_off_leased_quarantined_and_published_ahead() {
    let db = TestDb::migrated().await;
    let (tried, untried) = seed(&db, 5, 5).await;
    let store = store(&db);

    // Retries first, the longest due first: the row budget is spent on
    // them before new rows.
    let first = store.claim(budget(3), LEASE, Ordering::None).await.unwrap();
    let first_ids: HashSet<Uuid> = ids(&first).into_iter().collect();
    assert_eq!(first_ids, tried[..3].iter().copied().collect::<HashSet<_>>());
    assert!(first.events.iter().all(|e| e.attempt_count == 3));

    // Then the rest of the retries and the new rows, in (created_at, id)
    // order (the retries are older).
    let second = store.claim(budget(100), LEASE, Ordering::None).await.unwrap();
    let expected: Vec<Uuid> = tried[3..].iter().chain(&untried).copied().collect();
    assert_eq!(ids(&second), expected);
    let attempts: Vec<i32> = second.events.iter().map(|e| e.attempt_count).collect();
    assert_eq!(attempts, [3, 3, 1, 1, 1, 1, 1]);
    assert!(second.unpublishable.is_empty());
    // No row here had an attempt end without an outcome: all go in full
    // batches.
    assert!(first.interrupted.is_empty(), "{:?}", first.interrupted);
    assert!(second.interrupted.is_empty(), "{:?}", second.interrupted);

    // Everything due is leased now: nothing more to claim.
    let third = store.claim(budget(100), LEASE, Ordering::None).await.unwrap();
    assert!(third.events.is_empty(), "claimed {:?}", ids(&third));
    assert_rows_ahead_untouched(&db).await;
    assert_eq!(
        db.count("event_type IN ('retry', 'new') AND leased_until > now() + interval '5 minutes'")
            .await,
        10,
        "every due row leased once"
    );
}

/// The claim tells which rows' last attempt ended without an outcome (a
/// lease that ran out, or attempts without a recorded failure), on both
/// paths and in both orderings, and rows given back unpublished stay so:
/// the relay publishes each of them alone (relay/decide.rs).
#[tokio::test(flavor = "multi_thread")]
async fn rows_whose_last_attempt_was_interrupted_stay_known_when_given_back() {
    let db = TestDb::migrated().await;
    let store = store(&db);
    let (failed, died, fresh) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                       attempt_count, next_attempt_at, leased_until, last_error)
             VALUES ($1, 'failed', 'a', '{}', now() - interval '3 minutes',
                     2, now() - interval '2 minutes', now() - interval '1 minute', 'nack'),
                    ($2, 'died', 'b', '{}', now() - interval '2 minutes',
                     1, now() - interval '2 minutes', now() - interval '1 minute', NULL),
                    ($3, 'fresh', 'c', '{}', now() - interval '1 minute',
                     0, now() - interval '1 minute', NULL, NULL)",
            &[&failed, &died, &fresh],
        )
        .await
        .unwrap();
    let interrupted: HashSet<Uuid> = [failed, died].into_iter().collect();

    let claimed = store.claim(budget(10), LEASE, Ordering::None).await.unwrap();
    assert_eq!(ids(&claimed).len(), 3);
    assert_eq!(
        claimed.interrupted.iter().copied().collect::<HashSet<_>>(),
        interrupted
    );

    let (given, attempts): (Vec<Uuid>, Vec<i32>) =
        claimed.events.iter().map(|e| (e.id, e.attempt_count)).unzip();
    let flags: Vec<bool> = given.iter().map(|id| interrupted.contains(id)).collect();
    assert_eq!(store.give_back(&given, &attempts, &flags).await.unwrap(), 3);

    let again = store.claim(budget(10), LEASE, Ordering::Aggregate).await.unwrap();
    assert_eq!(
        again.interrupted.iter().copied().collect::<HashSet<_>>(),
        interrupted
    );
    let attempts: Vec<(Uuid, i32)> = again.events.iter().map(|e| (e.id, e.attempt_count)).collect();
    assert_eq!(
        attempts,
        [(failed, 3), (died, 2), (fresh, 1)],
        "each attempt given back once"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_move_between_the_paths_as_claims_and_outcomes_change_them() {
    let db = TestDb::migrated().await;
    let (_, untried) = seed(&db, 0, 4).await;
    let store = store(&db);
    let claimed = store.claim(budget(100), LEASE, Ordering::None).await.unwrap();
    assert_eq!(ids(&claimed), untried);
    let attempts: Vec<i32> = claimed.events.iter().map(|e| e.attempt_count).collect();

    // One each: published, quarantined, backing off, given back after an
    // outage. Only the refunded row is due again, as an untried row.
    let error = ["refused"];
    store.mark_published(&untried[..1], &attempts[..1]).await.unwrap();
    store
        .quarantine(&untried[1..2], &attempts[1..2], &error)
        .await
        .unwrap();
    store
        .reschedule(
            &untried[2..3],
            &attempts[2..3],
            &error,
            &[Duration::from_secs(3600)],
        )
        .await
        .unwrap();
    store.defer(&untried[3..], &attempts[3..]).await.unwrap();
    let again = store.claim(budget(100), LEASE, Ordering::None).await.unwrap();
    assert_eq!(ids(&again), untried[3..]);
    assert_eq!(again.events[0].attempt_count, 1, "the refunded attempt");

    // A lease that has run out (a relay that died mid-publish) makes its
    // row due again where it lies, counted once more.
    db.client
        .execute(
            "UPDATE outbox_event SET leased_until = now() - interval '1 second' WHERE id = $1",
            &[&untried[3]],
        )
        .await
        .unwrap();
    let after_crash = store.claim(budget(100), LEASE, Ordering::None).await.unwrap();
    assert_eq!(ids(&after_crash), untried[3..]);
    assert_eq!(after_crash.events[0].attempt_count, 2);
    assert_rows_ahead_untouched(&db).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ordered_claims_take_due_heads_from_both_paths_and_never_a_successor() {
    let db = TestDb::migrated().await;
    let (tried, untried) = seed(&db, 2, 2).await;
    // A successor for one due retry and one new row, and a row behind a
    // backing-off head: none of them may go while its predecessor waits.
    let successors: Vec<Uuid> = db
        .column(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(), 'successor', aggregate_id, '{}'::jsonb, now() + interval '1 minute'
             FROM outbox_event
             WHERE id = ANY($1::uuid[]) OR id = (SELECT id FROM outbox_event WHERE event_type = 'backing-off' LIMIT 1)
             RETURNING id",
            &[&vec![tried[0], untried[0]]],
        )
        .await;
    assert_eq!(successors.len(), 3);
    let store = store(&db);

    let claimed = store
        .claim(budget(100), LEASE, Ordering::Aggregate)
        .await
        .unwrap();
    let expected: Vec<Uuid> = tried.iter().chain(&untried).copied().collect();
    assert_eq!(ids(&claimed), expected, "the due heads, and only them");
    let again = store
        .claim(budget(100), LEASE, Ordering::Aggregate)
        .await
        .unwrap();
    assert!(again.events.is_empty(), "claimed {:?}", ids(&again));
    assert_rows_ahead_untouched(&db).await;
}

/// A claim's candidates and claim_lease.sql as Store renders them for the
/// migrated (plain) table without a headers column.
fn render(candidates: &str) -> String {
    render_column_reads(
        &format!(
            "{candidates},\n{}",
            include_str!("../src/store/sql/claim_lease.sql")
        )
        .replace("{heads_read}", HEADS_BY_KEY)
        .replace("{leased_rows}", LEASED_BY_ROW_VERSION)
        .replace("{table}", "\"outbox_event\"")
        .replace("{predecessor_key}", "(p.created_at, p.id)")
        .replace("{row_key}", "(t.created_at, t.id)")
        .replace("{head_order}", "first.created_at, first.id")
        .replace("{aggregate_type}", "text")
        .replace("{headers}", "NULL::text"),
    )
}

/// As [`render`], for a table with a `sequence_number` column, whose
/// ordered claims order an aggregate's rows by it first.
fn render_by_sequence(candidates: &str) -> String {
    render(
        &candidates
            .replace(
                "{predecessor_key}",
                "(COALESCE(p.sequence_number, -9223372036854775808), p.created_at, p.id)",
            )
            .replace(
                "{row_key}",
                "(COALESCE(t.sequence_number, -9223372036854775808), t.created_at, t.id)",
            )
            .replace(
                "{head_order}",
                "COALESCE(first.sequence_number, -9223372036854775808), first.created_at, first.id",
            ),
    )
}

/// How an ordered claim reads the heads it found on a plain table, as
/// Store renders it.
const HEADS_BY_KEY: &str =
    "FROM {table} AS t\n    WHERE t.id = ANY (ARRAY(SELECT head.id FROM heads AS head))\n      AND";

/// How a claim leases its rows on a plain table, as Store renders it.
const LEASED_BY_ROW_VERSION: &str =
    "t.ctid = ANY (ARRAY(SELECT ctid FROM budgeted))\n      AND t.tableoid = '{table}'::regclass";

/// Where a routed claim's window ends, as Store renders it for a claim
/// that records nothing.
const WINDOW_END: &str = "\n      AND (created_at, id) <= (COALESCE($9::timestamptz, 'infinity'),\n                               COALESCE($10::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))";

/// What keeps a claim's recorded rows out of it, as Store renders it.
const NOT_FINISHED: &str =
    "\n      AND (leased_until IS NULL OR id <> ALL (ARRAY(SELECT unnest($7::uuid[]))))";

#[tokio::test(flavor = "multi_thread")]
async fn claims_read_the_claim_path_indexes_and_never_the_table() {
    let db = TestDb::migrated().await;
    seed(&db, 5, 5).await;
    let store = store(&db);
    let claim = include_str!("../src/store/sql/claim.sql")
        .replace("{route_filter}", "")
        .replace("{window_end}", "");
    // The claim of a relay with two routes while one destination is down,
    // as Store renders it: the filter's parameters after the others, then
    // where its window ends.
    let route_filter = "\n      AND CASE WHEN event_type LIKE ($7::text[])[1] THEN ($8::bool[])[1] \
                        WHEN event_type LIKE ($7::text[])[2] THEN ($8::bool[])[2] ELSE ($8::bool[])[3] END";
    let routed = include_str!("../src/store/sql/claim.sql")
        .replace("{route_filter}", route_filter)
        .replace("{window_end}", WINDOW_END);
    let window_end = (
        Some(chrono::Utc::now() - chrono::TimeDelta::minutes(1)),
        Some(Uuid::new_v4()),
    );
    let (patterns, take) = (
        vec!["order.%".to_owned(), "payment.%".to_owned()],
        vec![false, true, true],
    );
    // The claim that marks the previous batch first, as Store renders it.
    let mark = include_str!("../src/store/sql/mark_published.sql")
        .replace("$1::uuid[]", "$7::uuid[]")
        .replace("$2::int[]", "$8::int[]");
    let finish = include_str!("../src/store/sql/claim_finish.sql").replace("{record}", &mark);
    let (rows, lease, bytes, max_payload) = (100i64, 600_000i64, 1i64 << 24, 1i64 << 24);
    let (confirmed, attempts) = (vec![Uuid::new_v4()], vec![1i32]);
    // Planned on a connection of the relay's own pool, with its planner
    // settings; plain EXPLAIN does not run the statement.
    let client = store.client().await.expect("pooled connection");
    // A claim of a worker catching up starts at a point in the fresh
    // index (see relay/claim_start.rs); the others from its start.
    let catching_up = (
        Some(chrono::Utc::now() - chrono::TimeDelta::minutes(5)),
        Some(Uuid::new_v4()),
    );
    // The ordered claims' filter and window end follow their start and
    // the aggregates just published, whose next rows they look for.
    let ordered_route_filter = route_filter
        .replace("event_type", "t.event_type")
        .replace("$8", "$9")
        .replace("$7", "$8");
    let ordered_window_end = WINDOW_END.replace("$10", "$11").replace("$9", "$10");
    let published = vec!["aggregate-1".to_owned(), "aggregate-2".to_owned()];
    for (what, sql, records, filtered) in [
        (
            "claim",
            render(&claim.replace("{finish}", "").replace("{not_finished}", "")),
            false,
            false,
        ),
        (
            "claim with a route filter",
            render(&routed.replace("{finish}", "").replace("{not_finished}", "")),
            false,
            true,
        ),
        (
            "claim after a mark",
            render(
                &claim
                    .replace("{finish}", &finish)
                    .replace("{not_finished}", NOT_FINISHED),
            ),
            true,
            false,
        ),
        (
            "ordered claim",
            render(
                &include_str!("../src/store/sql/claim_ordered.sql")
                    .replace("{route_filter}", "")
                    .replace(
                        "{window_end}",
                        &WINDOW_END
                            .replace("$9::timestamptz", "$8::timestamptz")
                            .replace("$10::uuid", "$9::uuid"),
                    ),
            ),
            false,
            false,
        ),
        (
            "ordered claim with a route filter",
            render(
                &include_str!("../src/store/sql/claim_ordered.sql")
                    .replace("{route_filter}", &ordered_route_filter)
                    .replace("{window_end}", &ordered_window_end),
            ),
            false,
            true,
        ),
    ] {
        type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
        let mut params: Vec<Param<'_>> = vec![&rows, &lease, &bytes, &max_payload];
        let ordered = what.starts_with("ordered");
        params.push(&catching_up.0);
        params.push(&catching_up.1);
        if ordered {
            params.push(&published);
        }
        if records {
            params.push(&confirmed);
            params.push(&attempts);
        }
        if filtered {
            params.push(&patterns);
            params.push(&take);
        }
        if filtered || ordered {
            params.push(&window_end.0);
            params.push(&window_end.1);
        }
        let plan: Vec<String> = client
            .query(&format!("EXPLAIN {sql}"), &params)
            .await
            .unwrap_or_else(|e| panic!("explain {what}: {e}"))
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        assert!(
            !plan.contains("Seq Scan on outbox_event"),
            "{what} scans the table:\n{plan}"
        );
        for index in ["outbox_event_retry_idx", "outbox_event_fresh_idx"] {
            assert!(plan.contains(index), "{what} does not use {index}:\n{plan}");
        }
        assert!(
            !plan.contains("outbox_event_pending_idx"),
            "{what} walks the pending index:\n{plan}"
        );
        assert!(
            descends_to_start(&plan),
            "{what} does not descend to where it starts:\n{plan}"
        );
        if ordered {
            // The path that finds the next rows of the aggregates just
            // published, behind where the fresh path starts, reads only
            // those aggregates: never the fresh index up to the start.
            let following = following_path(&plan, what);
            assert!(
                following.contains("outbox_event_aggregate_idx")
                    && following.contains("Index Cond: (aggregate_id = given.given)"),
                "{what} does not look for the next rows of the aggregates just published in the aggregate \
                 index:\n{plan}"
            );
            // On a plain table, their rows are read by primary key, in one
            // scan of the heads' keys.
            assert!(
                following.contains("Index Scan using outbox_event_pkey")
                    && following.contains("Index Cond: (id = ANY ("),
                "{what} does not read the heads it found by their keys:\n{plan}"
            );
            assert!(
                !following.contains("outbox_event_fresh_idx"),
                "{what} reads the fresh index behind its start:\n{plan}"
            );
            // A head at or past the start is left on its index entry: the
            // window takes it. Testing that on the row instead cost a
            // primary-key probe for most aggregates given.
            assert!(
                following.contains("Filter: (ROW(head_entry.created_at, head_entry.id) <"),
                "{what} reads the row of every head before it tests whether the head lies behind its \
                 start:\n{plan}"
            );
        }
        assert!(
            leases_where_it_locked(&plan),
            "{what} does not lease its rows by their addresses:\n{plan}"
        );
        if filtered || ordered {
            assert!(
                stops_at_window_end(&plan),
                "{what} reads past where its window ends:\n{plan}"
            );
        }
    }
    // Where a window ends: a range of the fresh index from its start.
    let fresh_window = render_column_reads(
        &include_str!("../src/store/sql/fresh_window.sql").replace("{table}", "\"outbox_event\""),
    );
    let window_rows = 2_000i64;
    let plan: Vec<String> = client
        .query(
            &format!("EXPLAIN {fresh_window}"),
            &[&catching_up.0, &catching_up.1, &window_rows],
        )
        .await
        .expect("explain the fresh window")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(
        plan.contains("outbox_event_fresh_idx") && descends_to_start(&plan) && !plan.contains("Seq Scan"),
        "the fresh window does not descend the fresh index to where it starts:\n{plan}"
    );
}

/// Whether a claim's plan leases the rows its candidates locked by the
/// addresses of the locked versions, reading no index (on a plain table;
/// see LEASED_BY_ROW_VERSION in store/mod.rs).
fn leases_where_it_locked(plan: &str) -> bool {
    plan.split("CTE leased").nth(1).is_some_and(|lease| {
        lease.contains("Tid Scan on outbox_event t")
            && lease.contains("TID Cond: (ctid = ANY (")
            && !lease.contains("outbox_event_pkey")
    })
}

/// The part of an ordered claim's plan that finds the next rows of the
/// aggregates just published (the `following` path).
fn following_path<'a>(plan: &'a str, what: &str) -> &'a str {
    plan.split("CTE following")
        .nth(1)
        .and_then(|rest| rest.split("CTE untried").next())
        .unwrap_or_else(|| panic!("{what} has no following path:\n{plan}"))
}

/// The inputs of every hash join in a plan in EXPLAIN's text format,
/// inner, outer, semi or anti: the nodes directly under the join, and
/// under its Hash node. A node's
/// children are the lines of its subtree whose arrow is indented two
/// past where the node's own text starts; the plans of CTEs and subplans
/// under it are indented two more, under their headings.
fn hash_join_inputs(plan: &[String]) -> Vec<String> {
    let indent = |line: &str| line.len() - line.trim_start().len();
    let text_start = |line: &str| line.find("->  ").map_or_else(|| indent(line), |arrow| arrow + 4);
    let children = |node: usize| -> Vec<usize> {
        let start = text_start(&plan[node]);
        plan.iter()
            .enumerate()
            .skip(node + 1)
            .take_while(|(_, line)| indent(line) > start)
            .filter(|(_, line)| line.find("->  ") == Some(start + 2))
            .map(|(index, _)| index)
            .collect()
    };
    let mut inputs = Vec::new();
    let is_hash_join = |line: &str| {
        let node = &line[text_start(line)..];
        node.starts_with("Hash ")
            && node
                .split("  (")
                .next()
                .is_some_and(|name| name.ends_with(" Join"))
    };
    for (node, line) in plan.iter().enumerate() {
        if is_hash_join(line) {
            for child in children(node) {
                if plan[child].contains("->  Hash  (") {
                    inputs.extend(children(child).into_iter().map(|index| plan[index].clone()));
                } else {
                    inputs.push(plan[child].clone());
                }
            }
        }
    }
    inputs
}

#[test]
fn a_hash_join_has_its_two_inputs_whatever_lies_between_them() {
    let plan: Vec<String> = [
        "Hash Join  (cost=1.00..2.00 rows=1 width=8)",
        "  Hash Cond: (l.id = b.id)",
        "  CTE leased",
        "    ->  Update on outbox_event t  (cost=0.29..8.31 rows=1 width=8)",
        "          ->  Index Scan using outbox_event_pkey on outbox_event t  (cost=0.29..8.31 rows=1 width=8)",
        "                Index Cond: (id = ANY ($7))",
        "  ->  CTE Scan on leased l  (cost=0.00..0.02 rows=1 width=8)",
        "  ->  Hash  (cost=0.02..0.02 rows=1 width=8)",
        "        ->  Seq Scan on outbox_event b  (cost=0.00..0.02 rows=1 width=8)",
    ]
    .map(str::to_owned)
    .to_vec();
    let inputs = hash_join_inputs(&plan);
    assert_eq!(inputs.len(), 2, "{inputs:?}");
    assert!(inputs[0].contains("CTE Scan on leased"));
    assert!(inputs[1].contains("Seq Scan on outbox_event b"));
    // An outer join by hash, under another node.
    let outer: Vec<String> = [
        "Sort  (cost=2.00..2.01 rows=1 width=8)",
        "  ->  Hash Right Join  (cost=1.00..2.00 rows=1 width=8)",
        "        Hash Cond: (l.id = b.id)",
        "        ->  CTE Scan on leased l  (cost=0.00..0.02 rows=1 width=8)",
        "        ->  Hash  (cost=0.02..0.02 rows=1 width=8)",
        "              ->  CTE Scan on budgeted b  (cost=0.00..0.02 rows=1 width=8)",
    ]
    .map(str::to_owned)
    .to_vec();
    let inputs = hash_join_inputs(&outer);
    assert_eq!(inputs.len(), 2, "{inputs:?}");
    assert!(inputs[0].contains("CTE Scan on leased"));
    assert!(inputs[1].contains("CTE Scan on budgeted b"));
    assert!(
        hash_join_inputs(&outer[4..]).is_empty(),
        "a Hash node alone is no join"
    );
}

/// The plan descends the fresh index to where its claim starts.
fn descends_to_start(plan: &str) -> bool {
    plan.contains("Index Cond: (ROW(created_at, id) >=")
        || plan.contains("Index Cond: ((ROW(created_at, id) >=")
}

/// The plan's scan of the fresh index stops where its window ends: the
/// end is a bound of the index range, not a filter of rows read past it.
fn stops_at_window_end(plan: &str) -> bool {
    plan.lines().any(|line| {
        line.contains("Index Cond: ((ROW(created_at, id) >=") && line.contains("AND (ROW(created_at, id) <=")
    })
}

/// The unordered claims as Store renders them for a direct connection:
/// what each is, its text, and the SQL types and literal values of its
/// parameters after the first four, for `PREPARE` and `EXECUTE`.
fn unordered_claims() -> Vec<(&'static str, String, &'static str, &'static str)> {
    let claim = include_str!("../src/store/sql/claim.sql");
    let finish = |record: &str| {
        let record = record
            .replace("$1::uuid[]", "$7::uuid[]")
            .replace("$2::int[]", "$8::int[]");
        render(
            &claim
                .replace(
                    "{finish}",
                    &include_str!("../src/store/sql/claim_finish.sql").replace("{record}", &record),
                )
                .replace("{not_finished}", NOT_FINISHED)
                .replace("{route_filter}", "")
                .replace("{window_end}", ""),
        )
    };
    let recorded = ", '{00000000-0000-0000-0000-000000000001}'::uuid[], '{1}'::int[]";
    vec![
        (
            "claim",
            render(
                &claim
                    .replace("{finish}", "")
                    .replace("{not_finished}", "")
                    .replace("{route_filter}", "")
                    .replace("{window_end}", ""),
            ),
            "",
            "",
        ),
        (
            "claim with a route filter",
            render(
                &claim
                    .replace("{finish}", "")
                    .replace("{not_finished}", "")
                    .replace(
                        "{route_filter}",
                        "\n      AND CASE WHEN event_type LIKE ($7::text[])[1] THEN ($8::bool[])[1] ELSE ($8::bool[])[2] END",
                    )
                    .replace("{window_end}", WINDOW_END),
            ),
            ", text[], bool[], timestamptz, uuid",
            ", ARRAY['order.%'], ARRAY[false, true], now(), NULL",
        ),
        (
            "claim after a mark",
            finish(include_str!("../src/store/sql/mark_published.sql")),
            ", uuid[], int[]",
            recorded,
        ),
        (
            "claim after a delete",
            finish(include_str!("../src/store/sql/delete_published.sql")),
            ", uuid[], int[]",
            recorded,
        ),
    ]
}

/// The ordered claims as Store renders them for a plain table on a
/// direct connection, like [`unordered_claims`]: their fifth to seventh
/// parameters are where the window starts and the aggregates just
/// published, the route filter's follow, and where the window ends.
fn ordered_claims() -> Vec<(&'static str, String, &'static str, &'static str)> {
    let claim = include_str!("../src/store/sql/claim_ordered.sql");
    let window_end = |first: usize| {
        WINDOW_END
            .replace("$10::uuid", &format!("${}::uuid", first + 1))
            .replace("$9::timestamptz", &format!("${first}::timestamptz"))
    };
    vec![
        (
            "ordered claim",
            render(&claim.replace("{route_filter}", "").replace("{window_end}", &window_end(8))),
            ", text[], timestamptz, uuid",
            ", '{order-1,order-2}', NULL, NULL",
        ),
        (
            "ordered claim with a route filter",
            render(
                &claim
                    .replace(
                        "{route_filter}",
                        "\n      AND CASE WHEN t.event_type::text LIKE ($8::text[])[1] THEN ($9::bool[])[1] ELSE ($9::bool[])[2] END",
                    )
                    .replace("{window_end}", &window_end(10)),
            ),
            ", text[], text[], bool[], timestamptz, uuid",
            ", '{order-1,order-2}', ARRAY['order.%'], ARRAY[false, true], now(), NULL",
        ),
        (
            "ordered claim by sequence number",
            render_by_sequence(&claim.replace("{route_filter}", "").replace("{window_end}", &window_end(8))),
            ", text[], timestamptz, uuid",
            ", '{order-1,order-2}', NULL, NULL",
        ),
    ]
}

/// A generic plan is made once, for the table as it is then, and an
/// outbox is often empty then (a relay started beside a new table, or
/// after retention). Each claim that runs under a generic plan (every
/// claim of a plain table) is planned as a relay plans it on a direct
/// connection (sql/claim_generic_begin.sql) on an empty table,
/// never analyzed and then analyzed, and the plans kept are read again on
/// a table of tens of thousands of rows: every scan descends an index to
/// a condition, none reads a whole index or the table (the plans this
/// rules out read 200,000 rows to mark 100). The table is filled without
/// ANALYZE, which would have the plans made again, and autovacuum is off
/// for it.
#[tokio::test(flavor = "multi_thread")]
async fn generic_claims_planned_on_an_empty_table_descend_their_indexes_on_a_full_one() {
    // Each state on a table of its own: VACUUM would make the plans kept
    // for the other state again.
    for state in ["never analyzed", "analyzed"] {
        let db = TestDb::migrated().await;
        // An autovacuum's ANALYZE of the filled table would have the plans
        // made again before they are read, and the test check nothing.
        // The column that orders an ordered claim by sequence number;
        // nothing else reads it.
        db.client
            .batch_execute(
                "ALTER TABLE outbox_event SET (autovacuum_enabled = off);
                 ALTER TABLE outbox_event ADD COLUMN sequence_number bigint",
            )
            .await
            .expect("autovacuum off, sequence_number added");
        let store = store(&db);
        let client = store.client().await.expect("pooled connection");
        if state == "analyzed" {
            client
                .batch_execute("VACUUM ANALYZE outbox_event")
                .await
                .expect("analyze");
        }
        let begin = include_str!("../src/store/sql/claim_generic_begin.sql");
        // `execute`: a prepared statement's name and its arguments.
        let explain = |execute: String| {
            let client = &client;
            async move {
                client.batch_execute(begin).await.expect("generic plan settings");
                let plan: Vec<String> = client
                    .query(&format!("EXPLAIN EXECUTE {execute}"), &[])
                    .await
                    .unwrap_or_else(|e| panic!("explain {execute}: {e:?}"))
                    .iter()
                    .map(|row| row.get(0))
                    .collect();
                client.batch_execute("COMMIT").await.expect("commit");
                plan
            }
        };
        let claim_arguments =
            |name: &str, args: &str| format!("{name}(100, 600000, 16777216, 16777216, NULL, NULL{args})");
        let recording_arguments = |name: &str| {
            format!("{name}('{{00000000-0000-0000-0000-000000000001}}'::uuid[], '{{1}}'::int[])")
        };
        let mut prepared = Vec::new();
        for (index, (what, sql, types, args)) in
            unordered_claims().into_iter().chain(ordered_claims()).enumerate()
        {
            let name = format!("claim_{index}");
            client
                .batch_execute(&format!(
                    "PREPARE {name}(int8, int8, int8, int8, timestamptz, uuid{types}) AS {sql}"
                ))
                .await
                .unwrap_or_else(|e| panic!("prepare {what}: {e:?}"));
            // Made and kept now, on the empty table.
            explain(claim_arguments(&name, args)).await;
            prepared.push((format!("{what}, planned on an empty table {state}"), name, args));
        }
        // A worker's confirmed rows recorded on their own (an ordered
        // relay's, every batch) run under the same settings.
        let recordings = [
            (
                "the mark on its own",
                include_str!("../src/store/sql/mark_published.sql"),
            ),
            (
                "the delete on its own",
                include_str!("../src/store/sql/delete_published.sql"),
            ),
        ];
        for ((_, sql), name) in recordings.iter().zip(["record_0", "record_1"]) {
            client
                .batch_execute(&format!(
                    "PREPARE {name}(uuid[], int[]) AS {}",
                    render_column_reads(&sql.replace("{table}", "\"outbox_event\""))
                ))
                .await
                .unwrap_or_else(|e| panic!("prepare {name}: {e:?}"));
            explain(recording_arguments(name)).await;
        }
        // Not `seed`, which analyzes the table: that would make the plans
        // again, on the full table.
        db.client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                           attempt_count, next_attempt_at, last_error, published_at)
                 SELECT gen_random_uuid(), 'order.created', 'order-' || (n % 50), jsonb_build_object('n', n),
                        now() - interval '1 hour' + n * interval '1 millisecond',
                        CASE WHEN n % 10 = 0 THEN 3 ELSE 0 END,
                        CASE WHEN n % 10 = 0 THEN now() + interval '1 hour' ELSE now() - interval '1 hour' END,
                        CASE WHEN n % 10 = 0 THEN 'refused' END,
                        CASE WHEN n % 10 = 1 THEN now() END
                 FROM generate_series(1, 30000) AS n",
                &[],
            )
            .await
            .expect("fill the table");
        for (what, name, args) in prepared {
            let plan = explain(claim_arguments(&name, args)).await;
            let text = plan.join("\n");
            assert!(
                !text.contains("Seq Scan on outbox_event"),
                "{what} scans the table:\n{text}"
            );
            for (line, next) in plan.iter().zip(plan.iter().skip(1)) {
                if line.contains("Index Scan using") || line.contains("Index Only Scan using") {
                    assert!(
                        next.trim_start().starts_with("Index Cond:"),
                        "{what} reads a whole index ({line}):\n{text}"
                    );
                }
            }
            for index in ["outbox_event_retry_idx", "outbox_event_fresh_idx"] {
                assert!(text.contains(index), "{what} does not use {index}:\n{text}");
            }
            assert!(
                descends_to_start(&text),
                "{what} does not descend to where it starts:\n{text}"
            );
            if what.contains("route filter") || what.starts_with("ordered") {
                assert!(
                    stops_at_window_end(&text),
                    "{what} reads past where its window ends:\n{text}"
                );
            }
            // The only joins are of the statement's own results, at most
            // a batch each: no hash join reads the table.
            let hashed = hash_join_inputs(&plan);
            for input in &hashed {
                assert!(
                    input.contains("CTE Scan on"),
                    "{what} joins more than a batch by hash ({input}):\n{text}"
                );
            }
            assert!(
                leases_where_it_locked(&text),
                "{what} does not lease its rows by their addresses:\n{text}"
            );
            // The leased rows are joined to the candidates in one pass,
            // not compared pair by pair.
            assert!(
                hashed.iter().any(|input| input.contains("CTE Scan on leased")),
                "{what} does not join the leased rows to the candidates by hash:\n{text}"
            );
            if what.starts_with("ordered") {
                // The heads of the aggregates just published, found on
                // their index entries and read by key; each candidate's
                // predecessor looked for in its own aggregate (checked
                // above: every index scan has a condition).
                let following = following_path(&text, &what);
                assert!(
                    following.contains("Index Cond: (aggregate_id = given.given)")
                        && following.contains("Index Cond: (id = ANY ("),
                    "{what} does not find the heads of the aggregates just published by their keys:\n{text}"
                );
            }
        }
        for ((what, _), name) in recordings.iter().zip(["record_0", "record_1"]) {
            let plan = explain(recording_arguments(name)).await;
            let text = plan.join("\n");
            assert!(
                text.contains("Index Cond: (id = ANY"),
                "{what}, planned on an empty table {state}, does not probe the primary key:\n{text}"
            );
            assert!(
                !text.contains("Seq Scan on outbox_event")
                    && !text.contains("outbox_event_aggregate_idx")
                    && !text.contains("outbox_event_fresh_idx"),
                "{what}, planned on an empty table {state}, reads more than the rows it records:\n{text}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ordered_window_takes_behind_its_start_only_the_heads_of_the_aggregates_just_published() {
    let db = TestDb::migrated().await;
    let store = store(&db);
    // In (created_at, id) order: a1 a2 b1 b2 c1 c2 e1 e2 d1. a1, b1 and c1
    // are published, e1 is in flight: a2, b2, c2 and d1 are heads, e2 is not.
    let names = ["a1", "a2", "b1", "b2", "c1", "c2", "e1", "e2", "d1"];
    let mut ids = std::collections::HashMap::new();
    for (n, name) in names.iter().enumerate() {
        let id = Uuid::new_v4();
        db.client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                           published_at, attempt_count, leased_until)
                 VALUES ($1, 'order.created', $2, '{}', now() - interval '1 minute' + $3::int * interval '1 millisecond',
                         CASE WHEN $4 THEN now() END, CASE WHEN $5 THEN 1 ELSE 0 END,
                         CASE WHEN $5 THEN now() + interval '10 minutes' END)",
                &[
                    &id,
                    &&name[..1],
                    &(n as i32),
                    &["a1", "b1", "c1"].contains(name),
                    &(*name == "e1"),
                ],
            )
            .await
            .expect("insert a row");
        ids.insert(*name, id);
    }
    let d1_created_at: chrono::DateTime<chrono::Utc> = db
        .client
        .query_one("SELECT created_at FROM outbox_event WHERE id = $1", &[&ids["d1"]])
        .await
        .unwrap()
        .get(0);
    let from_d1 = ClaimStart::Window {
        from: Some((d1_created_at, ids["d1"])),
        to: None,
    };
    let claim = |published: &[&str], start: ClaimStart| {
        let published: Vec<String> = published.iter().map(|name| (*name).to_owned()).collect();
        let store = &store;
        async move {
            store
                .claim_following(budget(100), LEASE, Ordering::Aggregate, None, start, &published)
                .await
                .unwrap()
        }
    };
    let names_of = |claimed: &outbox_relay::store::Claimed| -> Vec<&str> {
        claimed
            .events
            .iter()
            .map(|event| *names.iter().find(|name| ids[**name] == event.id).unwrap())
            .collect()
    };

    assert_eq!(
        names_of(&claim(&["d"], from_d1).await),
        ["d1"],
        "the window alone: a head at its start is the window's, and taken once"
    );
    assert_eq!(
        names_of(&claim(&["a", "b", "e"], from_d1).await),
        ["a2", "b2"],
        "behind the start, the heads of the aggregates just published: not e2, whose predecessor is in flight"
    );
    assert_eq!(
        names_of(&claim(&["a", "b", "c", "e"], ClaimStart::Oldest).await),
        ["c2"],
        "a claim from the oldest row finds the rest itself"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_from_a_start_skips_older_rows_which_the_next_claim_from_the_oldest_takes() {
    let db = TestDb::migrated().await;
    let (tried, untried) = seed(&db, 1, 4).await;
    let store = store(&db);
    // The new rows are created now + n ms; start at the third of them.
    let third: chrono::DateTime<chrono::Utc> = db
        .client
        .query_one(
            "SELECT created_at FROM outbox_event WHERE id = $1",
            &[&untried[2]],
        )
        .await
        .unwrap()
        .get(0);

    let from_start = store
        .claim_from(
            budget(100),
            LEASE,
            Ordering::None,
            None,
            ClaimStart::From(third, untried[2]),
        )
        .await
        .unwrap();
    // The due retry is read from the retry index whatever the start.
    let expected: Vec<Uuid> = tried.iter().chain(&untried[2..]).copied().collect();
    assert_eq!(ids(&from_start), expected);

    let from_oldest = store
        .claim_from(budget(100), LEASE, Ordering::None, None, ClaimStart::Oldest)
        .await
        .unwrap();
    assert_eq!(
        ids(&from_oldest),
        untried[..2],
        "the older rows, left for this claim"
    );
    assert_rows_ahead_untouched(&db).await;
}

/// The ordered claim of a routed relay while one destination's 20,000
/// rows wait, before the table's statistics know of them, as Store renders
/// it: what its path for the aggregates just published reads.
#[tokio::test(flavor = "multi_thread")]
async fn the_next_rows_of_the_aggregates_just_published_are_found_without_reading_a_waiting_backlog() {
    let db = TestDb::migrated().await;
    db.client
        .batch_execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(), 'ledger.entry', 'ledger-' || n, '{}',
                    now() - interval '1 hour' + n * interval '1 millisecond'
             FROM generate_series(1, 20000) AS n;
             INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(), 'order.created', 'order-' || (n / 3), '{}',
                    now() - interval '10 minutes' + n * interval '1 millisecond'
             FROM generate_series(0, 5) AS n",
        )
        .await
        .expect("rows");
    // The window starts at the newest row: every order row but that one
    // lies behind it.
    let newest = db
        .client
        .query_one(
            "SELECT created_at, id FROM outbox_event ORDER BY created_at DESC, id DESC LIMIT 1",
            &[],
        )
        .await
        .expect("the newest row");
    let start: (Option<chrono::DateTime<chrono::Utc>>, Option<Uuid>) =
        (Some(newest.get(0)), Some(newest.get(1)));
    let route_filter = "\n      AND CASE WHEN t.event_type LIKE ($8::text[])[1] THEN ($9::bool[])[1] \
                        WHEN t.event_type LIKE ($8::text[])[2] THEN ($9::bool[])[2] ELSE ($9::bool[])[3] END";
    let sql = render(
        &include_str!("../src/store/sql/claim_ordered.sql")
            .replace("{route_filter}", route_filter)
            .replace(
                "{window_end}",
                &WINDOW_END.replace("$10", "$11").replace("$9", "$10"),
            ),
    );
    let (rows, lease, bytes, max_payload) = (100i64, 600_000i64, 1i64 << 24, 1i64 << 24);
    let published = vec!["order-0".to_owned(), "order-1".to_owned()];
    let (patterns, take) = (
        vec!["order.%".to_owned(), "ledger.%".to_owned()],
        vec![true, false, false],
    );
    let no_end: (Option<chrono::DateTime<chrono::Utc>>, Option<Uuid>) = (None, None);
    let store = store(&db);
    let client = store.client().await.expect("pooled connection");
    let plan: Vec<String> = client
        .query(
            &format!("EXPLAIN (ANALYZE, BUFFERS) {sql}"),
            &[
                &rows,
                &lease,
                &bytes,
                &max_payload,
                &start.0,
                &start.1,
                &published,
                &patterns,
                &take,
                &no_end.0,
                &no_end.1,
            ],
        )
        .await
        .expect("explain the claim")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let plan = plan.join("\n");
    let following = following_path(&plan, "the routed ordered claim");
    assert!(
        !following.contains("outbox_event_fresh_idx") && !following.contains("Rows Removed by Filter: 20000"),
        "the path for the aggregates just published reads the waiting rows:\n{plan}"
    );
    assert!(
        following.contains("outbox_event_aggregate_idx"),
        "the path for the aggregates just published does not read the aggregate index:\n{plan}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_sequence_number_the_next_row_of_an_aggregate_just_published_is_the_next_in_sequence() {
    let db = TestDb::migrated().await;
    db.client
        .batch_execute("ALTER TABLE outbox_event ADD COLUMN sequence_number BIGINT")
        .await
        .expect("add the producer's sequence column");
    // Created in the order first, second, third; numbered 3, 1, 2.
    let mut rows = Vec::new();
    for (n, sequence) in [3i64, 1, 2].into_iter().enumerate() {
        let id = Uuid::new_v4();
        db.client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at, sequence_number)
                 VALUES ($1, 'order.created', 'numbered', '{}',
                         now() - interval '1 minute' + $2::int * interval '1 millisecond', $3)",
                &[&id, &(n as i32), &sequence],
            )
            .await
            .expect("insert a row");
        rows.push(id);
    }
    let store = store(&db);
    let past_every_row = ClaimStart::Window {
        from: Some((chrono::Utc::now() + chrono::TimeDelta::hours(1), Uuid::nil())),
        to: None,
    };
    let published = ["numbered".to_owned()];
    let mut taken = Vec::new();
    for _ in 0..3 {
        let claimed = store
            .claim_following(
                budget(100),
                LEASE,
                Ordering::Aggregate,
                None,
                past_every_row,
                &published,
            )
            .await
            .unwrap();
        let claimed = ids(&claimed);
        assert_eq!(claimed.len(), 1, "one head at a time: {claimed:?}");
        db.client
            .execute(
                "UPDATE outbox_event SET published_at = now(), leased_until = NULL WHERE id = $1",
                &[&claimed[0]],
            )
            .await
            .expect("publish it");
        taken.push(claimed[0]);
    }
    assert_eq!(
        taken,
        [rows[1], rows[2], rows[0]],
        "in sequence_number order, not created_at"
    );
}

/// Rows written in the order claims take them lie side by side, so a claim
/// leases a page of them at once, and each lease puts a new version of
/// its row on that page. The table keeps room for all of them
/// (migrations/0009_lease_room.sql): every lease is a HOT update, adding no
/// index entry. At the fillfactor of 0003, 80, most of these leases went
/// to other pages as non-HOT updates.
#[tokio::test(flavor = "multi_thread")]
async fn leases_of_rows_written_side_by_side_are_hot_updates() {
    let db = TestDb::migrated().await;
    let rows: i64 = 1000;
    // ~300-byte payloads, each row created 100 µs after the one before.
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(), 'order.created', 'order-' || (n % 50),
                    jsonb_build_object('n', n, 'note', repeat('x', 280)),
                    now() - ($1::bigint - n) * interval '100 microseconds'
             FROM generate_series(1, $1::bigint) AS n",
            &[&rows],
        )
        .await
        .unwrap();
    db.client
        .batch_execute("VACUUM ANALYZE outbox_event")
        .await
        .unwrap();
    let store = store(&db);
    let mut claimed = 0;
    loop {
        let batch = store.claim(budget(100), LEASE, Ordering::None).await.unwrap();
        if batch.events.is_empty() {
            break;
        }
        claimed += batch.events.len();
    }
    assert_eq!(claimed, rows as usize);

    // The claims' backends report their counts to the statistics when they
    // are next idle, within seconds: wait for all of them.
    let mut counts = (0, 0);
    for _ in 0..600 {
        let row = db
            .client
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
                 WHERE relid = 'outbox_event'::regclass",
                &[],
            )
            .await
            .unwrap();
        counts = (row.get::<_, i64>(0), row.get::<_, i64>(1));
        if counts.0 >= rows {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (updates, hot) = counts;
    assert_eq!(updates, rows, "one lease per row, and nothing else updated");
    assert_eq!(hot, rows, "every lease a HOT update");
}
