//! Servers a test starts for itself, on free ports, in temporary
//! directories it removes: a private PostgreSQL cluster with TLS, PgBouncer
//! in transaction mode and stunnel (TLS in front of RabbitMQ), plus the
//! certificates they need (a CA, server and client certificates, made with
//! the openssl command line). Each is stopped when its guard is dropped,
//! also when the test panics.
//!
//! PostgreSQL and PgBouncer refuse to run as root, and the tests run as
//! root: they are started as the `postgres` user with `runuser`.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uuid::Uuid;

/// How long a server may take to start answering.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A local TCP port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// Polls until something accepts connections on `port`.
fn wait_for_port(port: u16, what: &str, log: &Path) {
    let deadline = Instant::now() + START_TIMEOUT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start on port {port} within {START_TIMEOUT:?}; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs a command to completion; panics with its output if it fails.
fn run(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what} ({command:?}): {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `program args…` run as the `postgres` user, for commands run to
/// completion.
fn as_postgres(program: &Path) -> Command {
    let mut command = Command::new("runuser");
    command.args(["-u", "postgres", "--"]).arg(program);
    command
}

/// `program` started directly as the `postgres` user, for servers: the
/// child is the server itself, so killing the child stops it (through
/// `runuser`, the server would outlive a killed `runuser`).
fn spawn_as_postgres(program: &Path) -> Command {
    use std::os::unix::process::CommandExt as _;
    let id = |flag: &str| -> u32 {
        run(
            Command::new("id").args([flag, "postgres"]),
            "id postgres (is PostgreSQL installed?)",
        )
        .trim()
        .parse()
        .expect("a numeric id")
    };
    let mut command = Command::new(program);
    command.uid(id("-u")).gid(id("-g"));
    command
}

/// A program on the PATH, or a panic saying how to get it.
fn program(names: &[&str], install: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in names {
        for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/sbin")]) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!("{} not found: {install}", names.join(" or "))
}

/// A temporary directory owned by the `postgres` user, removed on drop.
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", Uuid::new_v4().simple()));
        std::fs::create_dir(&path).expect("create a temporary directory");
        run(
            Command::new("chown").args(["postgres:postgres"]).arg(&path),
            "chown of a temporary directory to postgres (the tests must run as root)",
        );
        Self { path }
    }

    /// Gives every file in the directory to the `postgres` user.
    fn chown_all(&self) {
        run(
            Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&self.path),
            "chown -R",
        );
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A CA and the certificates a test needs, as PEM files.
pub struct Certs {
    pub dir: TempDir,
}

impl Certs {
    /// A CA; a server certificate (and key) for `localhost` only, one that
    /// has expired, and one from another CA; a client certificate for the
    /// user `client_user`.
    pub fn generate(client_user: &str) -> Self {
        let certs = Self {
            dir: TempDir::new("outbox-test-certs"),
        };
        let openssl = program(&["openssl"], "install openssl");
        let dir = &certs.dir.path;
        let key = |name: &str| {
            run(
                Command::new(&openssl)
                    .current_dir(dir)
                    .args([
                        "genpkey",
                        "-algorithm",
                        "EC",
                        "-pkeyopt",
                        "ec_paramgen_curve:P-256",
                        "-out",
                    ])
                    .arg(format!("{name}.key")),
                "openssl genpkey",
            );
        };
        let ca = |name: &str| {
            key(name);
            run(
                Command::new(&openssl).current_dir(dir).args([
                    "req",
                    "-x509",
                    "-key",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.pem"),
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN=outbox-relay test {name}"),
                ]),
                "openssl req -x509",
            );
        };
        let leaf = |name: &str, issuer: &str, subject: &str, extensions: &str, days: &str| {
            key(name);
            run(
                Command::new(&openssl).current_dir(dir).args([
                    "req",
                    "-new",
                    "-key",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                    "-subj",
                    subject,
                ]),
                "openssl req -new",
            );
            std::fs::write(dir.join(format!("{name}.ext")), extensions).expect("write extensions");
            run(
                Command::new(&openssl).current_dir(dir).args([
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    &format!("{issuer}.pem"),
                    "-CAkey",
                    &format!("{issuer}.key"),
                    "-CAcreateserial",
                    "-days",
                    days,
                    "-extfile",
                    &format!("{name}.ext"),
                    "-out",
                    &format!("{name}.pem"),
                ]),
                "openssl x509 -req",
            );
        };
        let server = "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n";
        let client = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n";
        ca("ca");
        ca("other-ca");
        leaf("server", "ca", "/CN=localhost", server, "2");
        leaf("expired", "ca", "/CN=localhost", server, "-1");
        leaf("client", "ca", &format!("/CN={client_user}"), client, "2");
        leaf(
            "other-client",
            "other-ca",
            &format!("/CN={client_user}"),
            client,
            "2",
        );
        certs.dir.chown_all();
        // PostgreSQL refuses a key file others can read.
        for entry in std::fs::read_dir(dir).expect("list certificates") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|ext| ext == "key") {
                run(Command::new("chmod").arg("0600").arg(&path), "chmod 0600");
            }
        }
        certs
    }

    /// The path of `name` (`ca.pem`, `server.key`, …).
    pub fn path(&self, name: &str) -> String {
        self.dir.path.join(name).display().to_string()
    }
}

/// A PostgreSQL cluster of the test's own: TLS on, `pg_hba.conf` as given,
/// the superuser `postgres` over the Unix socket for the test itself.
pub struct PgCluster {
    pub port: u16,
    dir: TempDir,
    bin: PathBuf,
}

impl PgCluster {
    /// `initdb`, TLS with `certs`' server certificate (and its CA for
    /// client certificates), `hba` as the TCP lines of pg_hba.conf, then
    /// `pg_ctl start`.
    pub fn start(certs: &Certs, server_cert: &str, hba: &str) -> Self {
        let pg_config = program(&["pg_config"], "install PostgreSQL 15 (postgresql-15)");
        let bin = PathBuf::from(run(Command::new(pg_config).arg("--bindir"), "pg_config --bindir").trim());
        let dir = TempDir::new("outbox-test-pg");
        let data = dir.path.join("data");
        run(
            as_postgres(&bin.join("initdb"))
                .args([
                    "--auth=trust",
                    "--username=postgres",
                    "--no-sync",
                    "--encoding=UTF8",
                    "-D",
                ])
                .arg(&data),
            "initdb",
        );
        let port = free_port();
        let conf = format!(
            "port = {port}\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{socket}'\n\
             fsync = off\n\
             ssl = on\n\
             ssl_cert_file = '{cert}'\n\
             ssl_key_file = '{key}'\n\
             ssl_ca_file = '{ca}'\n",
            socket = dir.path.display(),
            cert = certs.path(&format!("{server_cert}.pem")),
            key = certs.path(&format!("{server_cert}.key")),
            ca = certs.path("ca.pem"),
        );
        append(&data.join("postgresql.conf"), &conf);
        std::fs::write(data.join("pg_hba.conf"), format!("local all all trust\n{hba}\n"))
            .expect("write pg_hba.conf");
        dir.chown_all();
        let log = dir.path.join("postgres.log");
        run(
            as_postgres(&bin.join("pg_ctl"))
                .args(["start", "-w", "-t", "60", "-D"])
                .arg(&data)
                .arg("-l")
                .arg(&log),
            "pg_ctl start",
        );
        Self { port, dir, bin }
    }

    /// A connection of the test's own, as superuser over the Unix socket.
    pub async fn admin(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::Config::new()
            .host_path(&self.dir.path)
            .port(self.port)
            .user("postgres")
            .dbname("postgres")
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect to the test cluster over its socket");
        tokio::spawn(connection);
        client
    }

    /// The server's log, for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path.join("postgres.log")).unwrap_or_default()
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open for appending");
    file.write_all(text.as_bytes()).expect("append");
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin.join("pg_ctl"))
            .args(["stop", "-m", "immediate", "-D"])
            .arg(self.dir.path.join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A child process killed (and waited for) on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// PgBouncer in transaction mode in front of a PostgreSQL server, every
/// database passed through, trusting every user (as the server does).
pub struct PgBouncer {
    pub port: u16,
    _process: Guard,
    dir: TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer with `pool_size` server connections per database
    /// and user, in front of `server_host:server_port`.
    pub fn start(server_host: &str, server_port: u16, pool_size: u32) -> Self {
        let pgbouncer = program(
            &["pgbouncer"],
            "scripts/test installs it (Debian: apt-get install pgbouncer)",
        );
        let dir = TempDir::new("outbox-test-pgbouncer");
        let port = free_port();
        let ini = dir.path.join("pgbouncer.ini");
        let users = dir.path.join("userlist.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n").expect("write the auth file");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 * = host={server_host} port={server_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {users}\n\
                 pool_mode = transaction\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 500\n\
                 server_reset_query =\n\
                 logfile = {log}\n\
                 pidfile = {pid}\n",
                users = users.display(),
                log = dir.path.join("pgbouncer.log").display(),
                pid = dir.path.join("pgbouncer.pid").display(),
            ),
        )
        .expect("write pgbouncer.ini");
        dir.chown_all();
        let child = spawn_as_postgres(&pgbouncer)
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let process = Guard(child);
        wait_for_port(port, "pgbouncer", &dir.path.join("pgbouncer.log"));
        Self {
            port,
            _process: process,
            dir,
        }
    }

    /// `url` (a database URL on the server behind it) pointed at PgBouncer.
    pub fn url_for(&self, url: &str) -> String {
        let mut url = url::Url::parse(url).expect("a database URL");
        url.set_host(Some("127.0.0.1")).expect("a host");
        url.set_port(Some(self.port)).expect("a port");
        url.to_string()
    }

    /// PgBouncer's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path.join("pgbouncer.log")).unwrap_or_default()
    }
}

/// stunnel terminating TLS on a port of its own and forwarding the plain
/// connection to `target` (RabbitMQ).
pub struct Stunnel {
    pub port: u16,
    _process: Guard,
    _dir: TempDir,
}

impl Stunnel {
    /// With `require_client_cert`, only clients presenting a certificate of
    /// `certs`' CA get through.
    pub fn start(certs: &Certs, target: &str, require_client_cert: bool) -> Self {
        let stunnel = program(
            &["stunnel4", "stunnel"],
            "scripts/test installs it (Debian: apt-get install stunnel4)",
        );
        let dir = TempDir::new("outbox-test-stunnel");
        let port = free_port();
        let log = dir.path.join("stunnel.log");
        let client_auth = if require_client_cert {
            format!(
                "CAfile = {}\nverifyChain = yes\nrequireCert = yes\n",
                certs.path("ca.pem")
            )
        } else {
            String::new()
        };
        let conf = dir.path.join("stunnel.conf");
        std::fs::write(
            &conf,
            format!(
                "foreground = yes\n\
                 pid =\n\
                 output = {log}\n\
                 [amqps]\n\
                 accept = 127.0.0.1:{port}\n\
                 connect = {target}\n\
                 cert = {cert}\n\
                 key = {key}\n\
                 {client_auth}",
                log = log.display(),
                cert = certs.path("server.pem"),
                key = certs.path("server.key"),
            ),
        )
        .expect("write stunnel.conf");
        let child = Command::new(stunnel)
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start stunnel");
        let process = Guard(child);
        wait_for_port(port, "stunnel", &log);
        Self {
            port,
            _process: process,
            _dir: dir,
        }
    }
}
