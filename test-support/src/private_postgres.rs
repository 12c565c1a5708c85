//! A PostgreSQL cluster of the test's own, for tests that disturb their
//! database server (restart it) or need one set up otherwise (TLS, a
//! `pg_hba.conf` of their own): the shared server is never touched.
//!
//! The cluster is the installed PostgreSQL's `initdb` and `pg_ctl`, run as
//! the `postgres` user in a temporary directory that goes away with it:
//! data, log and Unix socket there, TCP on a free loopback port only, trust
//! authentication for local connections, and no flushes to disk.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::servers::Certs;
use crate::system::{free_port, tail, OwnedDir, SystemUser};
use crate::{RelayBinary, TestDb};

/// Ports are picked free but may be taken before the server binds them.
const START_TRIES: usize = 3;

/// A running private cluster, stopped and deleted when dropped.
pub struct PrivatePostgres {
    bindir: PathBuf,
    user: SystemUser,
    port: u16,
    setup: Builder,
    dir: OwnedDir,
}

/// How a private cluster differs from the defaults; [`Builder::start`]
/// starts it.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    /// `postgres -c` settings, which nothing at run time overrides.
    settings: Vec<(String, String)>,
    /// Lines appended to `postgresql.conf`, which `ALTER SYSTEM` can
    /// override at run time.
    conf: Vec<String>,
    /// The TCP lines of `pg_hba.conf`, in place of initdb's.
    hba: Option<String>,
}

impl Builder {
    /// A server setting (`postgres -c name=value`).
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// TLS with `certs`' `<server_cert>.pem` and `.key`, and client
    /// certificates checked against `certs`' CA. In `postgresql.conf`, not
    /// on the command line, so that a test can switch the certificate with
    /// `ALTER SYSTEM` and a reload.
    pub fn tls(mut self, certs: &Certs, server_cert: &str) -> Self {
        self.conf.extend([
            "ssl = on".to_owned(),
            format!("ssl_cert_file = '{}'", certs.path(&format!("{server_cert}.pem"))),
            format!("ssl_key_file = '{}'", certs.path(&format!("{server_cert}.key"))),
            format!("ssl_ca_file = '{}'", certs.path("ca.pem")),
        ]);
        self
    }

    /// `lines` as the TCP part of `pg_hba.conf`. The Unix socket stays
    /// trusted, so that [`PrivatePostgres::admin`] gets in whatever the
    /// lines demand.
    pub fn hba(mut self, lines: &str) -> Self {
        self.hba = Some(lines.to_owned());
        self
    }

    /// Starts the cluster; returns once it accepts connections.
    pub async fn start(self) -> PrivatePostgres {
        tokio::task::spawn_blocking(move || {
            let mut failures = Vec::new();
            for _ in 0..START_TRIES {
                match PrivatePostgres::try_start(self.clone()) {
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
}

impl PrivatePostgres {
    /// Starts a cluster with the default settings.
    pub async fn start() -> Self {
        Self::builder().start().await
    }

    /// A cluster set up otherwise, started by [`Builder::start`].
    pub fn builder() -> Builder {
        Builder::default()
    }

    fn try_start(setup: Builder) -> Result<Self, String> {
        let bindir = postgres_bindir();
        let user = SystemUser::find("postgres")
            .expect("PostgreSQL's system user 'postgres' does not exist: install PostgreSQL");
        let dir = user.temp_dir("outbox-test-postgres");
        let cluster = Self {
            bindir,
            user,
            port: free_port(),
            setup,
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
        cluster.configure();
        cluster.pg_ctl_blocking(&["start"])?;
        Ok(cluster)
    }

    /// Writes the setup's `postgresql.conf` lines and `pg_hba.conf`.
    fn configure(&self) {
        if !self.setup.conf.is_empty() {
            let path = self.data_dir().join("postgresql.conf");
            let mut conf = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
            writeln!(conf, "{}", self.setup.conf.join("\n"))
                .unwrap_or_else(|e| panic!("append to {}: {e}", path.display()));
        }
        if let Some(hba) = &self.setup.hba {
            self.user.write(
                &self.data_dir().join("pg_hba.conf"),
                &format!("local all all trust\n{hba}\n"),
                true,
            );
        }
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
        for (name, value) in &self.setup.settings {
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

    /// What the server has logged so far, for a failure message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    /// A connection of the test's own as the superuser, over the Unix
    /// socket: it gets in whatever `pg_hba.conf` demands over TCP.
    pub async fn admin(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::Config::new()
            .host_path(&self.dir.path)
            .port(self.port)
            .user("postgres")
            .dbname("postgres")
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect to the private cluster over its socket");
        tokio::spawn(connection);
        client
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
