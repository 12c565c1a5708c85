//! Servers a test starts for itself, on free ports, in temporary
//! directories it removes: PgBouncer in transaction mode and stunnel (TLS
//! in front of RabbitMQ), plus the certificates they and a private
//! PostgreSQL cluster with TLS ([`crate::private_postgres`]) need (a CA,
//! server and client certificates, made with the openssl command line).
//! Each is stopped when its guard is dropped, also when the test panics.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::system::{free_port, on_path, temp_dir, OwnedDir, SystemUser};

/// How long a server may take to start answering.
const START_TIMEOUT: Duration = Duration::from_secs(60);

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

/// A program on the PATH, or a panic saying how to get it. Debian puts
/// pgbouncer in /usr/sbin, which a PATH may lack, so that is looked in
/// too.
fn program(names: &[&str], install: &str) -> PathBuf {
    names
        .iter()
        .find_map(|name| {
            on_path(name).or_else(|| Some(Path::new("/usr/sbin").join(name)).filter(|path| path.is_file()))
        })
        .unwrap_or_else(|| panic!("{} not found: {install}", names.join(" or ")))
}

/// The `postgres` system user, which PostgreSQL and PgBouncer run as (they
/// refuse root) and which must be able to read the certificates.
fn postgres_user() -> SystemUser {
    SystemUser::find("postgres").expect("the system user 'postgres' does not exist: install PostgreSQL")
}

/// A CA and the certificates a test needs, as PEM files.
pub struct Certs {
    pub dir: OwnedDir,
}

impl Certs {
    /// A CA; a server certificate (and key) for `localhost` only, one that
    /// has expired, and one from another CA; a client certificate for the
    /// user `client_user`.
    pub fn generate(client_user: &str) -> Self {
        let user = postgres_user();
        let certs = Self {
            dir: user.temp_dir("outbox-test-certs"),
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
        for entry in std::fs::read_dir(dir).expect("list certificates") {
            let path = entry.expect("entry").path();
            user.own(&path);
            // PostgreSQL refuses a key file others can read.
            if path.extension().is_some_and(|ext| ext == "key") {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .unwrap_or_else(|e| panic!("restrict {}: {e}", path.display()));
            }
        }
        certs
    }

    /// The path of `name` (`ca.pem`, `server.key`, …).
    pub fn path(&self, name: &str) -> String {
        self.dir.path.join(name).display().to_string()
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
    dir: OwnedDir,
}

impl PgBouncer {
    /// Starts PgBouncer with `pool_size` server connections per database
    /// and user, in front of the server `server_url` (a database URL)
    /// names.
    pub fn start(server_url: &str, pool_size: u32) -> Self {
        let server = url::Url::parse(server_url).expect("a database URL");
        let server_host = server.host_str().expect("a host in the database URL");
        let server_port = server.port().unwrap_or(5432);
        let pgbouncer = program(
            &["pgbouncer"],
            "scripts/test installs it (Debian: apt-get install pgbouncer)",
        );
        let user = postgres_user();
        let dir = user.temp_dir("outbox-test-pgbouncer");
        let port = free_port();
        let ini = dir.path.join("pgbouncer.ini");
        let users = dir.path.join("userlist.txt");
        user.write(&users, "\"postgres\" \"\"\n", true);
        user.write(
            &ini,
            &format!(
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
            true,
        );
        // The user's command execs PgBouncer in place, so the guard's kill
        // reaches PgBouncer itself, not a wrapper it would outlive.
        let child = user
            .command(&pgbouncer, &dir.path)
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
    _dir: OwnedDir,
}

impl Stunnel {
    /// With `require_client_cert`, only clients presenting a certificate of
    /// `certs`' CA get through.
    pub fn start(certs: &Certs, target: &str, require_client_cert: bool) -> Self {
        let stunnel = program(
            &["stunnel4", "stunnel"],
            "scripts/test installs it (Debian: apt-get install stunnel4)",
        );
        let dir = temp_dir("outbox-test-stunnel");
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

/// A NATS server of the test's own, with JetStream, TLS (`certs`' server
/// certificate for `localhost`) and one user, for what the shared server
/// is not set up for.
pub struct PrivateNats {
    pub port: u16,
    _process: Guard,
    _dir: OwnedDir,
}

impl PrivateNats {
    /// Starts `nats-server -js` on a free loopback port, plain, with
    /// `config` (the server's configuration file syntax, e.g.
    /// `max_control_line: 1024`) for what the shared server is not set to.
    pub fn start_with(config: &str) -> Self {
        Self::start(|dir| {
            let config_file = dir.join("nats.conf");
            std::fs::write(&config_file, config).expect("write the NATS configuration");
            vec!["-c".into(), config_file.into_os_string()]
        })
    }

    /// Starts `nats-server -js` on a free loopback port, requiring TLS and
    /// the user `user` with `password`.
    pub fn start_tls(certs: &Certs, user: &str, password: &str) -> Self {
        Self::start(|_| {
            [
                "--tls",
                "--tlscert",
                &certs.path("server.pem"),
                "--tlskey",
                &certs.path("server.key"),
            ]
            .into_iter()
            .chain(["--user", user, "--pass", password])
            .map(Into::into)
            .collect()
        })
    }

    /// Starts `nats-server -js` on a free loopback port with the arguments
    /// `more` gives for the server's own directory.
    fn start(more: impl FnOnce(&std::path::Path) -> Vec<std::ffi::OsString>) -> Self {
        let nats = program(
            &["nats-server"],
            "install it (Debian: apt-get install nats-server)",
        );
        let dir = temp_dir("outbox-test-nats");
        let port = free_port();
        let log = dir.path.join("nats.log");
        let store = dir.path.join("jetstream");
        let child = Command::new(nats)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
            .args(more(&dir.path))
            .arg("-sd")
            .arg(&store)
            .arg("-l")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let process = Guard(child);
        wait_for_port(port, "nats-server", &log);
        Self {
            port,
            _process: process,
            _dir: dir,
        }
    }
}
