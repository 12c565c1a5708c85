//! The relay binary, run against a [`TestDb`]: one command to completion
//! (`migrate`, the admin commands) or `run` as a child process that is
//! killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::db::{pg_admin_url, TestDb};

/// Names the relay binary under test. Cargo tells its path only to the
/// tests and benches of the package that builds it, at compile time
/// (`env!("CARGO_BIN_EXE_outbox-relay")`), so that package implements this
/// on a marker type of its own and uses `TestDb<Marker>`.
pub trait RelayBinary {
    /// The binary's path.
    const PATH: &'static str;
}

impl<R: RelayBinary> TestDb<R> {
    /// Creates a database on the tests' PostgreSQL and runs
    /// `outbox-relay migrate` on it.
    pub async fn migrated() -> Self {
        Self::migrated_at(&pg_admin_url()).await
    }

    /// A migrated database whose table also has the producer's optional
    /// `headers` column.
    pub async fn migrated_with_headers() -> Self {
        let db = Self::migrated().await;
        db.client
            .batch_execute("ALTER TABLE outbox_event ADD COLUMN headers JSONB")
            .await
            .expect("add the headers column");
        db
    }

    /// Creates a database through `admin_url` and runs `outbox-relay
    /// migrate` on it.
    pub async fn migrated_at(admin_url: &str) -> Self {
        let db = Self::create_at(admin_url).await;
        db.migrate();
        db
    }

    /// Creates a database on the tests' PostgreSQL with an outbox table as
    /// producers' tables are found in the wild — `aggregate_id` nullable,
    /// `created_at` without time zone, an `attempt_count` of their own that
    /// is a BIGINT — and runs `outbox-relay migrate` over it, which adds
    /// what the relay needs and changes none of these.
    pub async fn migrated_over_older_table() -> Self {
        let db = Self::create().await;
        db.client
            .batch_execute(
                "CREATE TABLE outbox_event (
                     id            UUID PRIMARY KEY,
                     causation_id  UUID,
                     event_type    VARCHAR(150) NOT NULL,
                     aggregate_id  TEXT,
                     payload       JSONB NOT NULL,
                     created_at    TIMESTAMP WITHOUT TIME ZONE NOT NULL DEFAULT now(),
                     published_at  TIMESTAMPTZ,
                     attempt_count BIGINT NOT NULL DEFAULT 0
                 )",
            )
            .await
            .expect("create the older table");
        db.migrate();
        db
    }

    fn migrate(&self) {
        let out = self
            .relay_command(&["migrate"], &[])
            .output()
            .expect("run migrate");
        assert!(
            out.status.success(),
            "migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The relay binary with this database configured, and nothing else
    /// from the test's environment but `PATH`: a setting the test does not
    /// pass is the relay's default.
    pub fn relay_command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut command = Command::new(R::PATH);
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("OUTBOX_DATABASE_URL", &self.url)
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_TEST_RUST_LOG").unwrap_or_else(|_| "info".into()),
            );
        // Without the `amqp` feature there is no test broker to point at.
        #[cfg(feature = "amqp")]
        command.env("OUTBOX_AMQP_URL", crate::broker::amqp_url());
        for (key, value) in env {
            command.env(key, value);
        }
        command
    }
}

/// A relay child process, killed when dropped.
pub struct RelayProcess {
    pub child: Child,
}

impl RelayProcess {
    /// Starts `outbox-relay run` with the given settings; output goes to the
    /// test's stderr so failures are readable.
    pub fn start<R: RelayBinary>(db: &TestDb<R>, env: &[(&str, String)]) -> Self {
        let child = Self::command(db, env)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start relay");
        Self { child }
    }

    /// Starts `command` (a [`TestDb::relay_command`] the test completed,
    /// e.g. with a configuration file) as the relay child process, its
    /// output going to the test's stderr like [`RelayProcess::start`]'s.
    pub fn spawn(mut command: Command) -> Self {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start relay");
        Self { child }
    }

    /// Starts `outbox-relay run` like [`RelayProcess::start`], logging JSON:
    /// a thread copies each line to the test's stderr and hands it to
    /// `read`. The thread ends once the process is gone (dropped), so
    /// joining it after the drop sees every line.
    pub fn start_reading_log<R: RelayBinary>(
        db: &TestDb<R>,
        env: &[(&str, String)],
        mut read: impl FnMut(&str) + Send + 'static,
    ) -> (Self, JoinHandle<()>) {
        let mut child = Self::command(db, env)
            .env("OUTBOX_LOG_FORMAT", "json")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start relay");
        let stderr = child.stderr.take().expect("piped stderr");
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                read(&line);
            }
        });
        (Self { child }, reader)
    }

    /// `outbox-relay run` with `env`, on a free port for its HTTP endpoints
    /// unless `env` names one: relays running side by side must not
    /// collide there.
    fn command<R: RelayBinary>(db: &TestDb<R>, env: &[(&str, String)]) -> Command {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut command = db.relay_command(&["run"], &env);
        if !env.iter().any(|(k, _)| *k == "OUTBOX_HTTP_ADDR") {
            command.env("OUTBOX_HTTP_ADDR", "127.0.0.1:0");
        }
        command
    }

    /// Sends a signal (`libc`-free: through the `kill` command).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit, at most `within`.
    pub async fn wait(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Settings that make a test relay react quickly: a short poll and short
/// backoff.
pub fn quick_settings() -> Vec<(&'static str, String)> {
    vec![
        ("OUTBOX_POLL_INTERVAL", "50ms".to_owned()),
        ("OUTBOX_BACKOFF_BASE", "100ms".to_owned()),
        ("OUTBOX_BACKOFF_MAX", "500ms".to_owned()),
    ]
}

/// `env` with `extra` settings added, replacing earlier values of the same
/// variables.
pub fn with(
    mut env: Vec<(&'static str, String)>,
    extra: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    for (key, value) in extra {
        env.retain(|(k, _)| k != key);
        env.push((key, (*value).to_owned()));
    }
    env
}

/// Runs the relay binary to completion.
pub fn run_to_end(mut command: Command) -> Output {
    command.output().expect("run relay binary")
}
