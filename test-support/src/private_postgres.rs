//! A PostgreSQL cluster of the test's own, for tests that disturb their
//! database server (restart it): the shared server is never touched.
//!
//! The cluster is the installed PostgreSQL's `initdb` and `pg_ctl`, run as
//! the `postgres` user in a temporary directory that goes away with it:
//! data, log and Unix socket there, TCP on a free loopback port only, trust
//! authentication for local connections, and no flushes to disk.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::system::{free_port, tail, OwnedDir, SystemUser};
use crate::{RelayBinary, TestDb};

/// Ports are picked free but may be taken before the server binds them.
const START_TRIES: usize = 3;

/// A running private cluster, stopped and deleted when dropped.
pub struct PrivatePostgres {
    bindir: PathBuf,
    user: SystemUser,
    port: u16,
    /// `postgres -c` settings this cluster runs with, beyond the defaults.
    settings: Vec<(String, String)>,
    dir: OwnedDir,
}

impl PrivatePostgres {
    /// Starts a cluster with the default settings.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts a cluster with extra server settings (`name`, `value`, as
    /// `postgres -c name=value`); files a setting names (certificates, say)
    /// can be placed with [`PrivatePostgres::data_dir`] and a restart.
    pub async fn start_with(settings: &[(&str, &str)]) -> Self {
        let settings: Vec<(String, String)> = settings
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        tokio::task::spawn_blocking(move || {
            let mut failures = Vec::new();
            for _ in 0..START_TRIES {
                match Self::try_start(settings.clone()) {
                    Ok(cluster) => return cluster,
                    Err(failure) => failures.push(failure),
                }
            }
            panic!(
                "a private PostgreSQL cluster did not start in {START_TRIES} tries:\n{}",
                failures.join("\n---\n")
            )
        })
        .await
        .expect("start a private PostgreSQL cluster")
    }

    fn try_start(settings: Vec<(String, String)>) -> Result<Self, String> {
        let bindir = postgres_bindir();
        let user = SystemUser::find("postgres")
            .expect("PostgreSQL's system user 'postgres' does not exist: install PostgreSQL");
        let dir = user.temp_dir("outbox-test-postgres");
        let cluster = Self {
            bindir,
            user,
            port: free_port(),
            settings,
            dir,
        };
        let initdb = cluster
            .command("initdb")
            .args([
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
            ])
            // A test cluster need not survive a machine crash.
            .arg("--no-sync")
            .arg("--pgdata")
            .arg(cluster.data_dir())
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        if !initdb.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&initdb.stderr)
            ));
        }
        cluster.pg_ctl_blocking(&["start"])?;
        Ok(cluster)
    }

    fn command(&self, program: &str) -> Command {
        let mut command = self.user.command(&self.bindir.join(program), &self.dir.path);
        command.stdin(Stdio::null());
        command
    }

    /// `pg_ctl` with this cluster's data directory, log and server options,
    /// waiting (`-w`) for the action to finish.
    fn pg_ctl_command(&self, args: &[&str]) -> Command {
        // Durability off: a fast or immediate stop still leaves every
        // committed transaction to the restarted server (the OS keeps what
        // was written); only a machine crash would lose it, and nothing here
        // must outlive one. It saves the shared disk a flush per commit.
        // The caller's settings come after these, so they win.
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}' \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            self.port,
            self.dir.path.display()
        );
        for (name, value) in &self.settings {
            options.push_str(&format!(" -c {name}='{value}'"));
        }
        let mut command = self.command("pg_ctl");
        command
            .arg("--pgdata")
            .arg(self.data_dir())
            .arg("--log")
            .arg(self.log_file())
            .args(["--wait", "--timeout=60", "-o", &options])
            .args(args);
        command
    }

    fn pg_ctl_blocking(&self, args: &[&str]) -> Result<(), String> {
        let output = self
            .pg_ctl_command(args)
            .output()
            .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl {args:?} failed: {}{}\nserver log:\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                tail(&self.log_file(), 20)
            ))
        }
    }

    /// Runs `pg_ctl <args>` on this cluster; panics when it fails.
    pub async fn pg_ctl(&self, args: &[&str]) -> Output {
        let output = tokio::process::Command::from(self.pg_ctl_command(args))
            .output()
            .await
            .expect("run pg_ctl");
        assert!(
            output.status.success(),
            "pg_ctl {args:?} failed: {}{}\nserver log:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            tail(&self.log_file(), 20)
        );
        output
    }

    /// Restarts the server the way an operator's fast restart does: every
    /// session is disconnected, open transactions roll back, committed
    /// ones are checkpointed. Returns once it accepts connections again.
    pub async fn restart_fast(&self) {
        self.pg_ctl(&["restart", "--mode=fast"]).await;
    }

    /// The admin URL (database `postgres`, user `postgres`).
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The TCP port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's data directory (`postgresql.conf`, `pg_hba.conf`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path.join("data")
    }

    /// The server's log.
    pub fn log_file(&self) -> PathBuf {
        self.dir.path.join("server.log")
    }

    /// The system user the server runs as, to give it files it must read.
    pub fn user(&self) -> &SystemUser {
        &self.user
    }

    /// A fresh database on this cluster.
    pub async fn database<R>(&self) -> TestDb<R> {
        TestDb::create_at(&self.admin_url()).await
    }

    /// A fresh database on this cluster, migrated by the relay.
    pub async fn migrated_database<R: RelayBinary>(&self) -> TestDb<R> {
        TestDb::migrated_at(&self.admin_url()).await
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // Immediate: nothing in the cluster is kept.
        let _ = self
            .pg_ctl_command(&["stop", "--mode=immediate"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The installed PostgreSQL's programs: `OUTBOX_TEST_PG_BINDIR`, else
/// `pg_config --bindir` if `initdb` is there (a client-only pg_config may
/// point elsewhere), else the newest `/usr/lib/postgresql/<version>/bin`
/// (Debian keeps the server programs off PATH).
fn postgres_bindir() -> PathBuf {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("OUTBOX_TEST_PG_BINDIR") {
        return PathBuf::from(dir);
    }
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    if let Some(dir) = from_pg_config.filter(|dir| has_server(dir)) {
        return dir;
    }
    let debian = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(debian)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| has_server(bin))
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "PostgreSQL's server programs (initdb, pg_ctl) are not found: install PostgreSQL \
             (apt-get install postgresql), or set OUTBOX_TEST_PG_BINDIR to their directory"
        )
    })
}
