//! `status --watch`: a view that refreshes until Ctrl-C.
//!
//! - In a pseudo-terminal (util-linux `script` provides one): it takes the
//!   alternate screen and redraws in place, its publish rate changes while
//!   a relay drains the table, and Ctrl-C ends it with status 0 and the
//!   terminal given back (cursor shown, alternate screen left).
//! - With `--json` into a pipe: one JSON object per line and refresh, the
//!   rates from the second on, and SIGINT ends it with status 0.

mod common;

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, RelayProcess, TestBroker, TestDb};

const WAIT: Duration = Duration::from_secs(120);

/// Enters the alternate screen.
const SCREEN_ON: &str = "\x1b[?1049h";
/// Shows the cursor and leaves the alternate screen.
const SCREEN_OFF: &str = "\x1b[?25h\x1b[?1049l";
/// Starts each frame: the cursor to the top left.
const FRAME: &str = "\x1b[H";

/// The watch's process, killed if the test ends before it does.
struct Watch(Child);

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child's stdout, read into a buffer by a thread of its own.
fn collect(child: &mut Child) -> Arc<Mutex<Vec<u8>>> {
    let output = Arc::new(Mutex::new(Vec::new()));
    let mut stdout = child.stdout.take().expect("piped stdout");
    let sink = output.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(read) = stdout.read(&mut chunk) {
            if read == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&chunk[..read]);
        }
    });
    output
}

fn text(output: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&output.lock().unwrap()).into_owned()
}

/// The "published per second" figure of each frame drawn so far.
fn published_rates(screen: &str) -> Vec<f64> {
    screen
        .split(FRAME)
        .filter_map(|frame| {
            // The terminal turns each line feed into CR LF: lines may end
            // in a CR of its own besides the view's.
            frame.split('\n').find_map(|line| {
                line.replace("\x1b[K", "")
                    .strip_prefix("published per second")?
                    .trim()
                    .parse()
                    .ok()
            })
        })
        .collect()
}

async fn wait_for_exit(child: &mut Child) -> std::process::ExitStatus {
    for _ in 0..200 {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    panic!("status --watch did not exit within 10 s of its signal");
}

#[tokio::test(flavor = "multi_thread")]
async fn in_a_terminal_it_redraws_shows_the_drain_rate_and_gives_the_terminal_back_on_ctrl_c() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    db.insert_events(6_000, "order.created").await;
    let watch = format!("exec {} status --watch --interval 300ms", common::relay_bin());
    let mut watch = Watch(
        Command::new("script")
            .args(["-qefc", &watch, "/dev/null"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TERM", "xterm")
            .env("OUTBOX_DATABASE_URL", &db.url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run status --watch in a pseudo-terminal (util-linux `script`)"),
    );
    let child = &mut watch.0;
    let output = collect(child);
    eventually(WAIT, "two frames drawn", || async {
        text(&output).matches(FRAME).count() >= 2
    })
    .await;
    let screen = text(&output);
    assert!(
        screen.contains(SCREEN_ON),
        "takes the alternate screen: {screen:?}"
    );
    assert!(screen.contains("outbox-relay status"), "{screen:?}");
    assert!(screen.contains("unpublished"), "{screen:?}");

    // A slow drain: small batches, one worker.
    let mut env = broker.env();
    env.extend([
        ("OUTBOX_BATCH_SIZE", "20".to_owned()),
        ("OUTBOX_WORKERS", "1".to_owned()),
        ("OUTBOX_POLL_INTERVAL", "50ms".to_owned()),
    ]);
    let relay = RelayProcess::start(&db, &env);
    eventually(
        WAIT,
        "a publish rate that changes while the relay drains",
        || async {
            let rates = published_rates(&text(&output));
            let moving: Vec<f64> = rates.iter().copied().filter(|rate| *rate > 0.0).collect();
            moving.len() >= 2 && moving.iter().any(|rate| *rate != moving[0])
        },
    )
    .await;
    drop(relay);
    // Every line of every frame fits 80 columns.
    for line in text(&output).split('\n') {
        let visible = line
            .replace("\x1b[K", "")
            .replace(FRAME, "")
            .replace("\x1b[J", "")
            .replace(SCREEN_ON, "")
            .replace("\x1b[?25l", "")
            .replace('\r', "");
        assert!(
            visible.chars().count() <= 80,
            "a line wider than 80 columns: {visible:?}"
        );
    }

    // Ctrl-C, typed into the terminal.
    child
        .stdin
        .as_mut()
        .expect("piped stdin")
        .write_all(b"\x03")
        .expect("type Ctrl-C");
    let status = wait_for_exit(child).await;
    assert!(
        status.success(),
        "Ctrl-C ends the watch with status 0: {status:?}"
    );
    let screen = text(&output);
    let after_last_frame = &screen[screen.rfind(FRAME).expect("a frame")..];
    assert!(
        after_last_frame.contains(SCREEN_OFF),
        "the terminal is given back (cursor shown, alternate screen left): {after_last_frame:?}"
    );
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_json_each_refresh_is_a_line_and_sigint_ends_it_with_status_0() {
    let db = TestDb::migrated().await;
    db.insert_events(5, "order.created").await;
    let mut watch = Watch(
        db.relay_command(&["status", "--watch", "--json", "--interval", "200ms"], &[])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run status --watch --json"),
    );
    let child = &mut watch.0;
    let output = collect(child);
    eventually(WAIT, "three lines", || async {
        text(&output).lines().count() >= 3
    })
    .await;
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = wait_for_exit(child).await;
    assert!(
        status.success(),
        "SIGINT ends the watch with status 0: {status:?}"
    );
    let all = text(&output);
    assert!(!all.contains('\x1b'), "no terminal codes into a pipe: {all:?}");
    let lines: Vec<serde_json::Value> = all
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}")))
        .collect();
    for (index, line) in lines.iter().enumerate() {
        assert_eq!(line["unpublished"], 5, "{line}");
        assert!(line["at"].is_string(), "{line}");
        assert_eq!(
            line["published_per_second"].is_number(),
            index > 0,
            "rates from the second refresh on: {line}"
        );
        assert_eq!(
            line["unpublished_change_per_second"].is_number(),
            index > 0,
            "{line}"
        );
    }
}
