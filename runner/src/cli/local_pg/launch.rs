//! Running `initdb` and `postgres`: as the server user, in `/`, the server in its own
//! process group on 127.0.0.1 only (no Unix socket), logging to `sweep-dev.log` in its data
//! directory, ready once a connection succeeds; on Linux armed to get SIGINT when sweep exits.

use std::{
    fs,
    io::{self, Read, Seek, SeekFrom},
    path::Path,
    process::{ExitStatus, Stdio},
    time::Duration,
};

use anyhow::{bail, Context};
use rustix::process::{Pid, Signal};
use sqlx::Connection;
use tokio::{process::Command, sync::watch, time::Instant};

use super::{ServerUser, READY_TIMEOUT};

pub(super) fn command(bin: &Path, name: &str, user: Option<ServerUser>) -> Command {
    let mut cmd = Command::new(bin.join(name));
    // The caller's working directory may be closed to the `postgres` user.
    cmd.current_dir("/").stdin(Stdio::null()).kill_on_drop(false);
    if let Some(u) = user {
        cmd.uid(u.uid).gid(u.gid);
    }
    cmd
}

pub(super) async fn init_cluster(
    bin: &Path,
    dir: &Path,
    user: Option<ServerUser>,
    keep: bool,
) -> anyhow::Result<()> {
    if dir.exists() {
        // An empty or half-made cluster (an initdb that was interrupted): start over.
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    if let Some(u) = user {
        std::os::unix::fs::chown(dir, Some(u.uid), Some(u.gid))
            .with_context(|| format!("handing {} to the postgres user", dir.display()))?;
    }
    let mut cmd = command(bin, "initdb", user);
    cmd.arg("-D").arg(dir).args([
        "-U",
        "postgres",
        "--auth=trust",
        "--encoding=UTF8",
        "--locale=C",
    ]);
    if !keep {
        // A throwaway cluster need not survive a power cut.
        cmd.arg("--no-sync");
    }
    let out = cmd.output().await.with_context(|| format!("running {}/initdb", bin.display()))?;
    if !out.status.success() {
        bail!(
            "initdb into {} failed ({}):\n{}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

pub(super) enum Launch {
    /// The port was taken between looking and binding: try another.
    PortTaken(anyhow::Error),
    Failed(anyhow::Error),
}

pub(super) type Exited = watch::Receiver<Option<io::Result<ExitStatus>>>;

/// Starts `postgres` on a free port and waits until it accepts connections.
pub(super) async fn launch(
    bin: &Path,
    dir: &Path,
    user: Option<ServerUser>,
    keep: bool,
) -> Result<(u16, Pid, Exited), Launch> {
    let port = free_port().map_err(|e| Launch::Failed(e.context("finding a free port")))?;
    let log_path = dir.join("sweep-dev.log");
    let open_log = || fs::OpenOptions::new().create(true).append(true).open(&log_path);
    let (log_out, log_err) = match (open_log(), open_log()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            return Err(Launch::Failed(
                anyhow::Error::new(e).context(format!("opening {}", log_path.display())),
            ))
        }
    };
    let log_start = log_out.metadata().map(|m| m.len()).unwrap_or(0);
    let mut cmd = command(bin, "postgres", user);
    cmd.arg("-D")
        .arg(dir)
        .args(["-p", &port.to_string(), "-h", "127.0.0.1", "-k", ""])
        .stdout(log_out)
        .stderr(log_err)
        // Ctrl-C in a terminal goes to the whole foreground group; sweep stops the server
        // itself once its runner has finished with it.
        .process_group(0);
    if !keep {
        // Nothing to protect on a crash: the directory is thrown away.
        cmd.args(["-c", "fsync=off"]);
    }
    die_with_parent(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| Launch::Failed(anyhow::Error::new(e).context("starting postgres")))?;
    let pid = child
        .id()
        .and_then(|id| Pid::from_raw(id as i32))
        .ok_or_else(|| Launch::Failed(anyhow::anyhow!("postgres exited at once")))?;
    let (tx, exited) = watch::channel(None);
    tokio::spawn(async move {
        let status = child.wait().await;
        let _ = tx.send(Some(status));
    });

    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if exited.borrow().is_some() {
            let log = log_tail(&log_path, log_start);
            let error = anyhow::anyhow!(
                "postgres exited before accepting connections; its log ({}):\n{log}",
                log_path.display()
            );
            return Err(if log.contains("could not bind") || log.contains("already in use") {
                Launch::PortTaken(error)
            } else {
                Launch::Failed(error)
            });
        }
        let attempt =
            tokio::time::timeout(Duration::from_secs(2), sqlx::PgConnection::connect(&url)).await;
        if let Ok(Ok(conn)) = attempt {
            let _ = conn.close().await;
            return Ok((port, pid, exited));
        }
        if Instant::now() > deadline {
            let _ = rustix::process::kill_process(pid, Signal::QUIT);
            return Err(Launch::Failed(anyhow::anyhow!(
                "postgres did not accept connections within {READY_TIMEOUT:?}; its log ({}):\n{}",
                log_path.display(),
                log_tail(&log_path, log_start)
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The last few KiB the server logged since `from`.
pub(super) fn log_tail(path: &Path, from: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let start = from.max(len.saturating_sub(4096));
        if f.seek(SeekFrom::Start(start)).is_ok() {
            let _ = f.read_to_string(&mut text);
        }
    }
    text.trim().to_owned()
}

/// On Linux: the server gets SIGINT (fast shutdown) when the thread that started it exits,
/// so a sweep killed with SIGKILL does not leave it running.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub(super) fn die_with_parent(cmd: &mut Command) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes two raw
    // system calls (prctl, getppid) and builds an io::Error from an errno: no allocation, no
    // locks, nothing that is unsafe between fork and exec. It runs after the uid change, which
    // would otherwise clear the death signal.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::INT))
                .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))?;
            // The parent may have died before the signal was armed.
            if rustix::process::getppid() != Some(parent) {
                return Err(io::Error::from_raw_os_error(rustix::io::Errno::SRCH.raw_os_error()));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn die_with_parent(_cmd: &mut Command) {}
