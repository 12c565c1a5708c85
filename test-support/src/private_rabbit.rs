//! A RabbitMQ node of the test's own, for tests that disturb their broker
//! (a memory alarm, a smaller `max_message_size`): the shared broker is
//! never touched, so tests running beside them see nothing.
//!
//! The node runs the installed RabbitMQ as the `rabbitmq` user, with its own
//! node name, ports, configuration, data, logs and Erlang cookie, all in a
//! temporary directory that goes away with it. It shares only epmd, which
//! is made for that.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::system::{free_port, on_path, tail, OwnedDir, SystemUser};
use crate::TestBroker;

/// Boot takes about 6 s on a quiet machine; a loaded one can take several
/// times that.
const BOOT_DEADLINE: Duration = Duration::from_secs(60);

/// Ports are picked free but may be taken before the node binds them.
const START_TRIES: usize = 3;

/// A running private RabbitMQ node, stopped and deleted when dropped.
pub struct PrivateRabbit {
    node: String,
    port: u16,
    sbin: PathBuf,
    user: SystemUser,
    child: Child,
    dir: OwnedDir,
}

impl PrivateRabbit {
    /// Starts a node whose `rabbitmq.conf` is the defaults a test needs (an
    /// AMQP listener on a free loopback port that `guest` may use, no
    /// plugins) followed by `config_extra` (more `rabbitmq.conf` lines, e.g.
    /// `max_message_size = 1048576`). Returns once the node has booted.
    pub async fn start(config_extra: &str) -> Self {
        let config_extra = config_extra.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut failures = Vec::new();
            for _ in 0..START_TRIES {
                match Self::try_start(&config_extra) {
                    Ok(node) => return node,
                    Err(failure) => failures.push(failure),
                }
            }
            panic!(
                "a private RabbitMQ node did not start in {START_TRIES} tries:\n{}",
                failures.join("\n---\n")
            )
        })
        .await
        .expect("start a private RabbitMQ node")
    }

    fn try_start(config_extra: &str) -> Result<Self, String> {
        let sbin = rabbitmq_sbin();
        let user = SystemUser::find("rabbitmq")
            .expect("RabbitMQ's system user 'rabbitmq' does not exist: install the rabbitmq-server package");
        let dir = user.temp_dir("outbox-test-rabbitmq");
        let port = free_port();
        let dist_port = free_port();
        let node = format!("outbox-test-{}@localhost", Uuid::new_v4().simple());
        let path = |name: &str| dir.path.join(name);
        for sub in ["mnesia", "log", "conf.d"] {
            std::fs::create_dir(path(sub)).expect("create a node directory");
            user.own(&path(sub));
        }
        user.write(
            &path("rabbitmq.conf"),
            &format!(
                "listeners.tcp.local = 127.0.0.1:{port}\n\
                 loopback_users = none\n\
                 {config_extra}\n"
            ),
            false,
        );
        user.write(&path("enabled_plugins"), "[].\n", false);
        // Sourced instead of the system's rabbitmq-env.conf, which names the
        // shared node.
        user.write(&path("rabbitmq-env.conf"), "", false);
        // The node and rabbitmqctl find the cookie in their HOME; one of
        // its own keeps the shared node's cookie out of reach.
        user.write(
            &path(".erlang.cookie"),
            &Uuid::new_v4().simple().to_string(),
            true,
        );

        let log = std::fs::File::create(path("console.log")).expect("create the console log");
        let mut command = user.command(&sbin.join("rabbitmq-server"), &dir.path);
        command
            .env("RABBITMQ_NODENAME", &node)
            .env("RABBITMQ_CONFIG_FILE", path("rabbitmq.conf"))
            .env("RABBITMQ_CONFIG_FILES", path("conf.d"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", path("advanced.config"))
            .env("RABBITMQ_CONF_ENV_FILE", path("rabbitmq-env.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", path("mnesia"))
            .env("RABBITMQ_LOG_BASE", path("log"))
            .env("RABBITMQ_PID_FILE", path("pid"))
            .env("RABBITMQ_DIST_PORT", dist_port.to_string())
            // Inter-node traffic on loopback only, as the shared node has it.
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("share the console log"))
            .stderr(log);
        let child = command
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", sbin.join("rabbitmq-server").display()))?;
        let mut rabbit = Self {
            node,
            port,
            sbin,
            user,
            child,
            dir,
        };
        rabbit.await_boot()?;
        Ok(rabbit)
    }

    /// Waits for the AMQP listener (it opens late in the boot), then lets
    /// `rabbitmqctl await_startup` confirm the boot finished.
    fn await_boot(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + BOOT_DEADLINE;
        let failed = |rabbit: &Self, what: String| {
            format!(
                "{what}\nnode {}; console:\n{}\nlog:\n{}",
                rabbit.node,
                tail(&rabbit.dir.path.join("console.log"), 20),
                tail(
                    &rabbit.dir.path.join("log").join(format!("{}.log", rabbit.node)),
                    20
                )
            )
        };
        while TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)).is_err() {
            if let Some(status) = self.child.try_wait().expect("check the node process") {
                return Err(failed(self, format!("the node exited during boot: {status}")));
            }
            if Instant::now() > deadline {
                return Err(failed(
                    self,
                    format!("the node did not boot within {BOOT_DEADLINE:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let output = self.rabbitmqctl_blocking(&["await_startup", "--timeout", "60"]);
        if output.status.success() {
            Ok(())
        } else {
            Err(failed(
                self,
                format!(
                    "await_startup failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                ),
            ))
        }
    }

    /// The node's name, for `rabbitmqctl -n`.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The node's AMQP listener.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The URL of the node's default vhost, as `guest`.
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// The node's own directory: its logs are under `log/`.
    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    /// Declares a test exchange and queue on this node.
    pub async fn broker(&self, binding_key: &str) -> TestBroker {
        TestBroker::create_at(&self.amqp_url(), binding_key).await
    }

    fn ctl_command(&self, args: &[&str]) -> Command {
        let mut command = self.user.command(&self.sbin.join("rabbitmqctl"), &self.dir.path);
        command
            .env("RABBITMQ_CONF_ENV_FILE", self.dir.path.join("rabbitmq-env.conf"))
            .args(["-n", &self.node])
            .args(args)
            .stdin(Stdio::null());
        command
    }

    fn rabbitmqctl_blocking(&self, args: &[&str]) -> Output {
        self.ctl_command(args).output().expect("run rabbitmqctl")
    }

    /// Runs `rabbitmqctl -n <node> <args>`; panics with its output when it
    /// fails. Returns its standard output.
    pub async fn rabbitmqctl(&self, args: &[&str]) -> String {
        let output = tokio::process::Command::from(self.ctl_command(args))
            .output()
            .await
            .expect("run rabbitmqctl");
        assert!(
            output.status.success(),
            "rabbitmqctl {args:?} on {} failed: {}{}",
            self.node,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Raises (a watermark far below what the node uses) or clears (the
    /// default 0.4) the memory alarm, and returns once the node reports
    /// the alarm in that state. While it is raised the node blocks every
    /// publishing connection.
    pub async fn set_memory_alarm(&self, on: bool) {
        let watermark = if on { "0.0000001" } else { "0.4" };
        self.rabbitmqctl(&["set_vm_memory_high_watermark", watermark])
            .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.memory_alarm().await != on {
            assert!(
                Instant::now() < deadline,
                "the memory alarm of {} did not turn {} within 30 s",
                self.node,
                if on { "on" } else { "off" }
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether the node's memory alarm is raised.
    pub async fn memory_alarm(&self) -> bool {
        self.rabbitmqctl(&["eval", "rabbit_alarm:get_alarms()."])
            .await
            .contains("memory")
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        // A clean stop first; the node is gone when rabbitmqctl returns.
        let _ = self
            .ctl_command(&["stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The script's TERM trap stops the VM; SIGKILL to the script alone
        // would leave the VM running.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        if let Ok(pid) = std::fs::read_to_string(self.dir.path.join("pid")) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The directory of RabbitMQ's own scripts (`rabbitmq-server`,
/// `rabbitmqctl`): `OUTBOX_TEST_RABBITMQ_SBIN`, or where `rabbitmq-server`
/// on `PATH` leads. A distribution's wrapper (Debian links
/// `rabbitmq-server` to a script that switches users and logs to the
/// system node's files) lives beside the real scripts, so the directory
/// is taken after resolving links.
fn rabbitmq_sbin() -> PathBuf {
    let dir = std::env::var_os("OUTBOX_TEST_RABBITMQ_SBIN")
        .map(PathBuf::from)
        .or_else(|| on_path("rabbitmq-server").and_then(|script| script.parent().map(Path::to_path_buf)));
    match dir {
        Some(dir) if dir.join("rabbitmq-server").is_file() && dir.join("rabbitmqctl").is_file() => dir,
        _ => panic!(
            "RabbitMQ's scripts are not found (no rabbitmq-server on PATH): install the \
             rabbitmq-server package, or set OUTBOX_TEST_RABBITMQ_SBIN to the directory of \
             rabbitmq-server and rabbitmqctl"
        ),
    }
}
