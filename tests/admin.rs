//! The operator commands, run as the binary on a prepared table: `status`,
//! `quarantine list`, `quarantine release` and `replay` — their output,
//! their effect on the table and their exit status.

mod common;

use std::collections::HashSet;
use std::process::Output;

use chrono::{DateTime, SecondsFormat, Utc};
use common::rows::Rows;
use common::TestDb;
use uuid::Uuid;

// ---------------------------------------------------------------- factories

const MINUTE: i64 = 60;
const HOUR: i64 = 3_600;

fn run(db: &TestDb, args: &[&str]) -> Output {
    db.relay_command(args, &[]).output().expect("run outbox-relay")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the exit status, showing the output when it is not the one expected.
fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(out),
        stderr(out)
    );
}

fn json(out: &Output) -> serde_json::Value {
    assert_exit(out, 0);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(out)))
}

/// The keys of a JSON object: the documented shape of an answer.
fn keys(value: &serde_json::Value) -> HashSet<&str> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// The column where each line's value starts (after the label and its padding).
fn value_column(line: &str, label: &str) -> usize {
    let rest = line
        .strip_prefix(label)
        .unwrap_or_else(|| panic!("{line:?} starts with {label:?}"));
    label.len() + rest.len() - rest.trim_start().len()
}

/// A table with a bit of everything.
async fn backlog(db: &TestDb) {
    Rows::pending(3).insert(db).await;
    Rows::pending(2).due_in(HOUR).insert(db).await;
    Rows::pending(1).created_ago(HOUR).insert(db).await;
    Rows::pending(2)
        .created_ago(2 * HOUR)
        .quarantined("rejected")
        .insert(db)
        .await;
    Rows::pending(4).published_ago(10 * MINUTE).insert(db).await;
    Rows::pending(3).published_ago(2 * HOUR).insert(db).await;
}

// ----------------------------------------------------------------- status

#[tokio::test(flavor = "multi_thread")]
async fn status_json_reports_the_backlog() {
    let db = TestDb::migrated().await;
    backlog(&db).await;

    let status = json(&run(&db, &["status", "--json"]));
    assert_eq!(
        keys(&status),
        HashSet::from([
            "unpublished",
            "oldest_unpublished_age_seconds",
            "quarantined",
            "published_last_hour",
            "stuck_aggregates",
            "unpublished_exact",
            "quarantined_exact",
            "stuck_aggregates_exact"
        ]),
        "the documented shape"
    );
    for exact in ["unpublished_exact", "quarantined_exact", "stuck_aggregates_exact"] {
        assert_eq!(status[exact], true, "small counts are exact; {status}");
    }
    assert_eq!(status["unpublished"], 6, "due, backing off and old; {status}");
    assert_eq!(status["quarantined"], 2, "{status}");
    assert_eq!(status["published_last_hour"], 4, "{status}");
    assert_eq!(
        status["stuck_aggregates"], 1,
        "agg-1's head is quarantined; {status}"
    );
    let age = status["oldest_unpublished_age_seconds"]
        .as_f64()
        .expect("a number");
    assert!(
        (3600.0..7200.0).contains(&age),
        "the 1-hour-old row, not the quarantined ones: {age}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn status_text_is_aligned_and_readable() {
    let db = TestDb::migrated().await;
    backlog(&db).await;

    let out = run(&db, &["status"]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    let labels = [
        ("table", "outbox_event"),
        ("unpublished", "6"),
        ("oldest unpublished age", "1h 0m "),
        ("quarantined", "2"),
        ("published last hour", "4"),
        ("stuck aggregates", "1"),
    ];
    assert_eq!(lines.len(), labels.len(), "{text}");
    let column = value_column(lines[0], "table");
    for (line, (label, value)) in lines.iter().zip(labels) {
        assert_eq!(value_column(line, label), column, "values line up:\n{text}");
        assert!(line[column..].starts_with(value), "{label} is {value}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn status_of_an_empty_table_is_all_zero() {
    let db = TestDb::migrated().await;
    let status = json(&run(&db, &["status", "--json"]));
    assert_eq!(
        status,
        serde_json::json!({
            "unpublished": 0,
            "oldest_unpublished_age_seconds": 0.0,
            "quarantined": 0,
            "published_last_hour": 0,
            "stuck_aggregates": 0,
            "unpublished_exact": true,
            "quarantined_exact": true,
            "stuck_aggregates_exact": true
        })
    );
    let out = run(&db, &["status"]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("0s (no unpublished rows)"),
        "{}",
        stdout(&out)
    );
}

// ------------------------------------------------------------- quarantine

#[tokio::test(flavor = "multi_thread")]
async fn quarantine_list_shows_each_quarantined_row() {
    let db = TestDb::migrated().await;
    let out = run(&db, &["quarantine", "list"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), "no quarantined rows in outbox_event\n");
    assert_eq!(
        json(&run(&db, &["quarantine", "list", "--json"])),
        serde_json::json!([])
    );

    let rejected = Rows::pending(1)
        .of_type("invoice.issued")
        .quarantined("rejected by sink: body larger than 262144 bytes\nsecond line")
        .insert(&db)
        .await;
    let gave_up = Rows::pending(2)
        .quarantined("gave up after 10 attempts: nack")
        .insert(&db)
        .await;
    Rows::pending(3).insert(&db).await;
    Rows::pending(2).published_ago(MINUTE).insert(&db).await;

    let list = json(&run(&db, &["quarantine", "list", "--json"]));
    let items = list.as_array().expect("an array");
    assert_eq!(items.len(), 3, "{list}");
    for item in items {
        assert_eq!(
            keys(item),
            HashSet::from([
                "id",
                "event_type",
                "attempt_count",
                "last_error",
                "quarantined_at"
            ])
        );
        assert_eq!(item["attempt_count"], 10);
        let at = item["quarantined_at"].as_str().expect("a string");
        DateTime::parse_from_rfc3339(at).unwrap_or_else(|e| panic!("{at} is not RFC 3339: {e}"));
    }
    let by_id = |id: Uuid| {
        items
            .iter()
            .find(|item| item["id"] == id.to_string())
            .unwrap_or_else(|| panic!("{id} listed in {list}"))
    };
    let first = by_id(rejected[0]);
    assert_eq!(first["event_type"], "invoice.issued");
    assert_eq!(
        first["last_error"], "rejected by sink: body larger than 262144 bytes\nsecond line",
        "the full error in JSON"
    );
    assert_eq!(by_id(gave_up[0])["event_type"], "order.created");

    let out = run(&db, &["quarantine", "list"]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "header, three rows, total:\n{text}");
    let header = lines[0];
    assert!(header.starts_with("ID "), "{text}");
    let type_column = header.find("EVENT TYPE").expect("EVENT TYPE column");
    let error_column = header.find("LAST ERROR").expect("LAST ERROR column");
    for line in &lines[1..4] {
        let id: Uuid = line[..36].parse().expect("each row starts with its id");
        assert!(
            rejected.contains(&id) || gave_up.contains(&id),
            "{id} is quarantined"
        );
        let event_type = &line[type_column..];
        assert!(
            event_type.starts_with("invoice.issued") || event_type.starts_with("order.created"),
            "columns line up:\n{text}"
        );
        assert!(
            line[error_column..].starts_with("rejected by sink: body larger than 262144 bytes second line")
                || line[error_column..].starts_with("gave up after 10 attempts: nack"),
            "last error on one line, in its column:\n{text}"
        );
    }
    assert_eq!(lines[4], "3 rows quarantined in outbox_event");
}

/// `count` quarantined rows, three quarantined at each instant (as one
/// quarantine statement stamps its batch), so pages also split ties.
async fn quarantine(db: &TestDb, count: i64) -> Vec<Uuid> {
    db.client
        .query(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, attempt_count,
                                       last_error, quarantined_at)
             SELECT gen_random_uuid(), 'order.created', 'agg-' || g, '{}'::jsonb, 10,
                    'gave up after 10 attempts: nack', now() - (g / 3) * interval '1 second'
             FROM generate_series(1, $1::bigint) AS g
             RETURNING id",
            &[&count],
        )
        .await
        .expect("insert quarantined rows")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The next-page command printed on stderr, if any.
fn next_page(out: &Output) -> Option<Vec<String>> {
    let err = stderr(out);
    let command = err
        .lines()
        .find_map(|line| line.split_once("next page: outbox-relay ").map(|(_, c)| c))?;
    Some(command.split_whitespace().map(str::to_owned).collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn quarantine_list_pages_cover_every_row_exactly_once() {
    let db = TestDb::migrated().await;
    let quarantined: HashSet<Uuid> = quarantine(&db, 25).await.into_iter().collect();
    Rows::pending(4).insert(&db).await;

    // Text: follow the printed next-page commands to the end.
    let mut seen = Vec::new();
    let mut args: Vec<String> = ["quarantine", "list", "--limit", "10"]
        .map(str::to_owned)
        .to_vec();
    let mut pages = 0;
    loop {
        let out = run(&db, &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_exit(&out, 0);
        pages += 1;
        let text = stdout(&out);
        let rows: Vec<Uuid> = text
            .lines()
            .filter_map(|line| line.get(..36)?.parse().ok())
            .collect();
        seen.extend(rows.iter().copied());
        match next_page(&out) {
            Some(next) => {
                assert_eq!(rows.len(), 10, "a full page points to the next:\n{text}");
                assert!(
                    text.ends_with("10 rows quarantined in outbox_event on this page\n"),
                    "{text}"
                );
                args = next;
            }
            None => {
                assert!(rows.len() < 10, "only a short page is the last:\n{text}");
                break;
            }
        }
        assert!(pages < 10, "paging ends");
    }
    assert_eq!(pages, 3, "10 + 10 + 5");
    assert_eq!(seen.len(), 25, "no row twice: {seen:?}");
    assert_eq!(seen.iter().copied().collect::<HashSet<_>>(), quarantined);

    // JSON: one valid array per page, continued from its last element.
    let mut listed: Vec<serde_json::Value> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["quarantine", "list", "--json", "--limit", "7"];
        if let Some(after) = &after {
            args.extend(["--after", after.as_str()]);
        }
        let out = run(&db, &args);
        assert!(next_page(&out).is_none(), "stdout is only JSON, stderr quiet");
        let page = json(&out);
        let page = page.as_array().expect("an array").clone();
        assert!(page.len() <= 7);
        let Some(last) = page.last() else { break };
        after = Some(format!(
            "{},{}",
            last["quarantined_at"].as_str().expect("a time"),
            last["id"].as_str().expect("an id")
        ));
        listed.extend(page);
    }
    let ids: Vec<Uuid> = listed
        .iter()
        .map(|item| item["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, seen, "the same rows in the same order as the text pages");
    let keys: Vec<(String, Uuid)> = listed
        .iter()
        .zip(&ids)
        .map(|(item, id)| (item["quarantined_at"].as_str().unwrap().to_owned(), *id))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "oldest quarantine first, ties by id");
}

#[tokio::test(flavor = "multi_thread")]
async fn quarantine_list_limit_bounds_the_page() {
    let db = TestDb::migrated().await;
    quarantine(&db, 150).await;

    let default = json(&run(&db, &["quarantine", "list", "--json"]));
    assert_eq!(default.as_array().expect("an array").len(), 100, "100 by default");
    let out = run(&db, &["quarantine", "list"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out).lines().count(), 102, "header, 100 rows, total");
    assert!(next_page(&out).is_some_and(|next| next.contains(&"100".to_owned())));

    let one = json(&run(&db, &["quarantine", "list", "--json", "--limit", "1"]));
    assert_eq!(one.as_array().expect("an array").len(), 1);
    let all = json(&run(&db, &["quarantine", "list", "--json", "--limit", "1000"]));
    assert_eq!(all.as_array().expect("an array").len(), 150);

    // A page after the last row is empty, and still valid JSON.
    let last = &all[149];
    let after = format!(
        "{},{}",
        last["quarantined_at"].as_str().unwrap(),
        last["id"].as_str().unwrap()
    );
    assert_eq!(
        json(&run(&db, &["quarantine", "list", "--json", "--after", &after])),
        serde_json::json!([])
    );
    let out = run(&db, &["quarantine", "list", "--after", &after]);
    assert_exit(&out, 0);
    assert_eq!(
        stdout(&out),
        format!("no quarantined rows in outbox_event after {after}\n")
    );

    for bad in [
        vec!["quarantine", "list", "--limit", "0"],
        vec!["quarantine", "list", "--limit", "many"],
        vec!["quarantine", "list", "--after", "yesterday"],
        vec!["quarantine", "list", "--after", "2026-11-30T00:30:01Z"],
    ] {
        let out = run(&db, &bad);
        assert_exit(&out, 2);
        assert!(stdout(&out).is_empty(), "{bad:?}");
    }
}

/// `quarantine list --json | head`: the reader leaves after the first
/// bytes of a page longer than the pipe holds; the command ends at once,
/// successfully, instead of waiting on the rows it no longer writes.
#[tokio::test(flavor = "multi_thread")]
async fn quarantine_list_json_ends_when_the_reader_goes_away() {
    use std::io::Read as _;

    let db = TestDb::migrated().await;
    quarantine(&db, 2_000).await;
    let mut child = db
        .relay_command(&["quarantine", "list", "--json", "--limit", "2000"], &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run outbox-relay");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut start = [0u8; 100];
    stdout.read_exact(&mut start).expect("the start of the array");
    assert_eq!(start[0], b'[', "{}", String::from_utf8_lossy(&start));
    drop(stdout);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running after its reader left"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("stderr");
    assert!(
        status.success(),
        "a closed pipe is not a failure: {status:?} {err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn quarantine_release_requeues_the_given_rows_and_reports_the_others() {
    let db = TestDb::migrated().await;
    let quarantined = Rows::pending(3).quarantined("rejected").insert(&db).await;
    let pending = Rows::pending(1).due_in(HOUR).insert(&db).await;
    let unknown = Uuid::new_v4();

    let (a, b, c) = (
        quarantined[0].to_string(),
        quarantined[1].to_string(),
        quarantined[2],
    );
    let out = run(
        &db,
        &[
            "quarantine",
            "release",
            &a,
            &b,
            &a,
            &pending[0].to_string(),
            &unknown.to_string(),
        ],
    );
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(
        text.starts_with("released 2 rows from quarantine in outbox_event"),
        "{text}"
    );
    assert!(
        text.contains("not quarantined (no such id, already released, or published): 2"),
        "{text}"
    );
    assert!(
        text.contains(&format!("  {unknown}")) && text.contains(&format!("  {}", pending[0])),
        "{text}"
    );
    assert!(
        !text.contains(&format!("  {a}")),
        "released ids are not reported as missed:\n{text}"
    );

    let released: HashSet<Uuid> = quarantined[..2].iter().copied().collect();
    assert_eq!(
        db.ids_where("quarantined_at IS NULL AND attempt_count = 0 AND next_attempt_at <= now() AND published_at IS NULL").await,
        released,
        "released rows are due now with attempts reset"
    );
    assert_eq!(
        db.ids_where("quarantined_at IS NOT NULL").await,
        HashSet::from([c])
    );
    assert_eq!(
        db.ids_where("next_attempt_at > now() AND attempt_count = 3")
            .await,
        HashSet::from([pending[0]]),
        "a row that was not quarantined is left alone"
    );

    // Releasing again is harmless: nothing left to release among those ids.
    let out = run(&db, &["quarantine", "release", &a]);
    assert_exit(&out, 0);
    assert!(stdout(&out).starts_with("released 0 rows"), "{}", stdout(&out));

    let out = run(&db, &["quarantine", "release", "--all"]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).starts_with("released 1 row from quarantine"),
        "{}",
        stdout(&out)
    );
    assert_eq!(db.count("quarantined_at IS NOT NULL").await, 0);
    assert_eq!(
        db.count("attempt_count = 0 AND next_attempt_at <= now()").await,
        3
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn quarantine_release_refuses_bad_arguments() {
    let db = TestDb::migrated().await;
    let id = Uuid::new_v4().to_string();
    for args in [
        vec!["quarantine", "release"],
        vec!["quarantine", "release", "--all", &id],
        vec!["quarantine", "release", "not-a-uuid"],
    ] {
        let out = run(&db, &args);
        assert_exit(&out, 2);
    }
}

// ----------------------------------------------------------------- replay

#[tokio::test(flavor = "multi_thread")]
async fn replay_requeues_rows_published_in_the_window() {
    let db = TestDb::migrated().await;
    let now: DateTime<Utc> = db
        .client
        .query_one("SELECT now()", &[])
        .await
        .expect("now")
        .get(0);
    let at = |ago: i64| (now - chrono::Duration::seconds(ago)).to_rfc3339_opts(SecondsFormat::Secs, true);

    let three_hours = Rows::pending(2).published_ago(3 * HOUR).insert(&db).await;
    let two_hours = Rows::pending(3).published_ago(2 * HOUR).insert(&db).await;
    let two_hours_invoices = Rows::pending(2)
        .of_type("invoice.issued")
        .published_ago(2 * HOUR)
        .insert(&db)
        .await;
    let recent = Rows::pending(1)
        .of_type("invoice.issued")
        .published_ago(10 * MINUTE)
        .insert(&db)
        .await;
    let pending = Rows::pending(1).due_in(HOUR).insert(&db).await;
    let quarantined = Rows::pending(1).quarantined("rejected").insert(&db).await;

    // [2.5 h ago, 1 h ago): the rows published two hours ago, both types.
    let out = run(
        &db,
        &["replay", "--since", &at(150 * MINUTE), "--until", &at(HOUR)],
    );
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.starts_with("re-queued 5 rows published in ["), "{text}");
    let requeued: HashSet<Uuid> = two_hours.iter().chain(&two_hours_invoices).copied().collect();
    assert_eq!(
        db.ids_where(
            "published_at IS NULL AND quarantined_at IS NULL AND attempt_count = 0 AND next_attempt_at <= now()"
        )
        .await,
        requeued,
        "unpublished, due now, attempts reset"
    );

    // Open-ended, one event type: only the recent invoice is still published.
    let out = run(
        &db,
        &[
            "replay",
            "--since",
            &at(4 * HOUR),
            "--event-type",
            "invoice.issued",
        ],
    );
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.starts_with("re-queued 1 row published in ["), "{text}");
    assert!(text.contains(", now) of event type 'invoice.issued'"), "{text}");
    assert!(db.ids_where("published_at IS NULL").await.contains(&recent[0]));

    let still_published: HashSet<Uuid> = three_hours.iter().copied().collect();
    assert_eq!(db.ids_where("published_at IS NOT NULL").await, still_published);
    assert_eq!(
        db.ids_where("next_attempt_at > now()").await,
        HashSet::from([pending[0]])
    );
    assert_eq!(
        db.ids_where("quarantined_at IS NOT NULL").await,
        HashSet::from([quarantined[0]])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_refuses_bad_arguments() {
    let db = TestDb::migrated().await;
    for (args, complaint) in [
        (vec!["replay"], "--since"),
        (vec!["replay", "--since", "yesterday"], "--since"),
        (vec!["replay", "--since", "2026-01-02"], "--since"),
        (
            vec![
                "replay",
                "--since",
                "2026-01-02T00:00:00Z",
                "--until",
                "2026-01-01T00:00:00Z",
            ],
            "--until",
        ),
        (
            vec![
                "replay",
                "--since",
                "2026-01-02T00:00:00Z",
                "--until",
                "2026-01-02T00:00:00Z",
            ],
            "--until",
        ),
    ] {
        let out = run(&db, &args);
        assert_exit(&out, 2);
        assert!(stderr(&out).contains(complaint), "{args:?}: {}", stderr(&out));
    }
}

// ------------------------------------------------------------------ errors

#[tokio::test(flavor = "multi_thread")]
async fn failures_exit_with_the_documented_status() {
    let db = TestDb::migrated().await;

    let out = db
        .relay_command(&["status"], &[("OUTBOX_TABLE", "bad-name")])
        .output()
        .expect("run");
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("OUTBOX_TABLE"), "{}", stderr(&out));

    let out = db
        .relay_command(&["status"], &[("OUTBOX_TABLE", "not_migrated")])
        .output()
        .expect("run");
    assert_exit(&out, 1);
    assert!(
        stderr(&out).contains("relation \"not_migrated\" does not exist") && stderr(&out).contains("migrate"),
        "{}",
        stderr(&out)
    );

    let out = db
        .relay_command(
            &["quarantine", "list"],
            &[(
                "OUTBOX_DATABASE_URL",
                "postgres://postgres:s3cret@127.0.0.1:1/nowhere",
            )],
        )
        .output()
        .expect("run");
    assert_exit(&out, 1);
    assert!(stderr(&out).contains("127.0.0.1:1/nowhere"), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("s3cret"),
        "no password in errors: {}",
        stderr(&out)
    );
}
