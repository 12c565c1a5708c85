//! What the private servers need from the machine: a free port, a
//! directory a system user owns, and commands run as that user. Servers
//! refuse to run as root (PostgreSQL) or keep their Erlang cookie in the
//! user's home (RabbitMQ), so tests running as root switch users.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use uuid::Uuid;

/// A TCP port on 127.0.0.1 that nothing listens on right now. Another
/// process may take it before the caller binds it; the private servers
/// retry with another port when their start fails.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// A system account the private servers run as (`postgres`, `rabbitmq`).
#[derive(Debug, Clone)]
pub struct SystemUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Whether commands must switch to this user (the tests run as another
    /// user, normally root).
    switch: bool,
}

impl SystemUser {
    /// Looks the account up; `None` when it does not exist.
    pub fn find(name: &str) -> Option<Self> {
        let id = |flag: &str, user: Option<&str>| -> Option<u32> {
            let output = Command::new("id").arg(flag).args(user).output().ok()?;
            output
                .status
                .success()
                .then(|| String::from_utf8_lossy(&output.stdout).trim().parse().ok())
                .flatten()
        };
        let uid = id("-u", Some(name))?;
        let gid = id("-g", Some(name))?;
        let me = id("-u", None)?;
        assert!(
            me == 0 || me == uid,
            "a private server runs as the system user '{name}': run the tests as root or as '{name}'"
        );
        Some(Self {
            name: name.to_owned(),
            uid,
            gid,
            switch: me != uid,
        })
    }

    /// `program` run as this user, with an empty environment but `PATH`, a
    /// UTF-8 locale and `HOME` (the caller adds what the program needs).
    /// `setpriv` execs the program itself, so the child's pid is the
    /// program's.
    pub fn command(&self, program: &Path, home: &Path) -> Command {
        let mut command = if self.switch {
            let mut command = Command::new("setpriv");
            command
                .arg(format!("--reuid={}", self.uid))
                .arg(format!("--regid={}", self.gid))
                .arg("--init-groups")
                .arg(program);
            command
        } else {
            Command::new(program)
        };
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("LANG", "C.UTF-8")
            .env("LC_ALL", "C.UTF-8")
            .env("HOME", home)
            .current_dir(home);
        command
    }

    /// A fresh directory under the system's temporary directory, owned by
    /// this user and closed to others; removed by [`OwnedDir`]'s drop.
    pub fn temp_dir(&self, prefix: &str) -> OwnedDir {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", Uuid::new_v4().simple()));
        std::fs::create_dir(&path).expect("create a temporary directory");
        let dir = OwnedDir { path };
        self.own(&dir.path);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o700))
            .expect("restrict the temporary directory");
        dir
    }

    /// Gives `path` to this user.
    pub fn own(&self, path: &Path) {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|e| panic!("give {} to {}: {e}", path.display(), self.name));
    }

    /// Writes a file this user owns, readable by it alone when `private`.
    pub fn write(&self, path: &Path, contents: &str, private: bool) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        let mode = if private { 0o400 } else { 0o644 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("set the mode of {}: {e}", path.display()));
        self.own(path);
    }
}

/// A directory removed, with everything in it, when dropped.
#[derive(Debug)]
pub struct OwnedDir {
    pub path: PathBuf,
}

impl Drop for OwnedDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The directory holding `program` on `PATH`, symbolic links resolved.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .and_then(|found| std::fs::canonicalize(found).ok())
}

/// The last `lines` lines of a log file, for a failure message.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("({}: {e})", path.display()));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
