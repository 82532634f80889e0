//! A throwaway PgBouncer for tests: transaction pooling in front of the test server, so the
//! pooled store, the runner and the API are tested through the real thing (Debian 12 ships
//! 1.18, which tracks no prepared statements in transaction mode). Started from the installed
//! binary, as the `postgres` user (via `runuser`) when the tests run as root, with its config,
//! auth file and log in a directory of its own; stopped and removed when dropped.
//!
//! Invariant: the only process signalled is the one this value spawned (`runuser` passes the
//! SIGTERM on to its pgbouncer and waits for it).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use rustix::process::{Pid, Signal};

use crate::servers::{as_root, free_port, server_command};
use sqlx::{postgres::PgConnectOptions, Connection, PgConnection};

/// How long a started pgbouncer may take to accept a connection.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running pgbouncer; see the module header.
#[derive(Debug)]
pub struct PgBouncer {
    dir: PathBuf,
    port: u16,
    upstream: PgConnectOptions,
    child: Child,
}

impl PgBouncer {
    /// Starts one in front of the server `upstream` names (any database name is passed through
    /// to the same name there): `pool_mode = transaction`, `pool_size` server connections per
    /// database and user, no authentication. `extra` lines go into its `[pgbouncer]` section.
    /// Panics, saying how to install it, when pgbouncer is not installed.
    pub async fn start(upstream: &PgConnectOptions, pool_size: u32, extra: &[&str]) -> PgBouncer {
        let binary = find_binary().unwrap_or_else(|| {
            panic!(
                "pgbouncer is not installed (looked on PATH and in /usr/sbin): the PgBouncer \
                 tests run a real one; install it with `apt-get install -y pgbouncer` (what \
                 .ci/run does)"
            )
        });
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sweep-pgbouncer-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("creating the pgbouncer directory");
        let port = free_port();
        let user = upstream.get_username();
        write(&dir.join("users.txt"), &format!("\"{user}\" \"\"\n"));
        let config = dir.join("pgbouncer.ini");
        let mut text = format!(
            "[databases]\n\
             * = host={host} port={upstream_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {auth}\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 500\n\
             logfile = {log}\n",
            host = upstream.get_host(),
            upstream_port = upstream.get_port(),
            auth = dir.join("users.txt").display(),
            log = dir.join("pgbouncer.log").display(),
        );
        for line in extra {
            text.push_str(line);
            text.push('\n');
        }
        write(&config, &text);

        if as_root() {
            hand_to_postgres(&dir);
        }
        let mut command = server_command(&binary);
        // Its log goes to the log file too; runuser has its say on stderr when stopped.
        command
            .arg(&config)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().expect("starting pgbouncer");
        let mut bouncer = PgBouncer { dir, port, upstream: upstream.clone(), child };
        bouncer.wait_ready().await;
        bouncer
    }

    /// `upstream`'s database (and user) through this pgbouncer.
    pub fn options(&self) -> PgConnectOptions {
        self.upstream.clone().host("127.0.0.1").port(self.port)
    }

    /// [`PgBouncer::options`] as a URL (user and database of `upstream`, no password).
    pub fn url(&self) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{}",
            self.upstream.get_username(),
            self.port,
            self.upstream.get_database().unwrap_or_default()
        )
    }

    /// Its log so far, for failure messages.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    async fn wait_ready(&mut self) {
        // sqlx's default startup parameters include one PgBouncer refuses.
        let probe = self.options().extra_float_digits(None);
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("pgbouncer exited at start ({status}):\n{}", self.log());
            }
            if let Ok(conn) = PgConnection::connect_with(&probe).await {
                let _ = conn.close().await;
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pgbouncer did not accept connections within {READY_TIMEOUT:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let pid = i32::try_from(self.child.id()).ok().and_then(Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, Signal::TERM);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn find_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|candidate| candidate.is_file())
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Gives `dir` and what is in it to the `postgres` user, who runs pgbouncer.
fn hand_to_postgres(dir: &Path) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id").args([flag, "postgres"]).output().expect("running id");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| {
            panic!("running as root, so pgbouncer runs as `postgres`, which does not exist here")
        })
    };
    let (uid, gid) = (id("-u"), id("-g"));
    let entries = fs::read_dir(dir).expect("listing the pgbouncer directory");
    for path in entries.flatten().map(|e| e.path()).chain([dir.to_path_buf()]) {
        std::os::unix::fs::chown(&path, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("handing {} to postgres: {e}", path.display()));
    }
}
