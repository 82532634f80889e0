//! Who runs the embedded server and where its data lives: the `postgres` user when sweep
//! runs as root, the base directory, and what dead runs left there (a `run-<pid>` directory
//! whose pid is gone, or `kept/` whose `kept.pid` owner is gone, possibly with a server
//! still running in it).
//!
//! Invariant: a process is signalled only if it is a postmaster started on the directory
//! being cleaned (on Linux its command line names the directory), never on a pid file's word
//! alone where /proc can tell.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context};
use rustix::process::{Pid, Signal};
use tokio::{process::Command, time::Instant};

use super::{ServerUser, KEPT, STOP_TIMEOUT};

/// `Some(postgres)` when sweep runs as root, `None` when the server can run as the caller.
pub(super) async fn server_user() -> anyhow::Result<Option<ServerUser>> {
    if !rustix::process::geteuid().is_root() {
        return Ok(None);
    }
    let id = |flag: &'static str| async move {
        let out = Command::new("id").args([flag, "postgres"]).output().await.ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then(|| text.trim().parse::<u32>().ok()).flatten()
    };
    match (id("-u").await, id("-g").await) {
        (Some(uid), Some(gid)) if uid != 0 => Ok(Some(ServerUser { uid, gid })),
        _ => bail!(
            "running as root, and Postgres refuses to run as root: the server runs as the \
             `postgres` user, which does not exist here (the postgresql package creates it; \
             or run sweep as a normal user)"
        ),
    }
}

pub(super) fn default_base_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        // Root's home is closed to the `postgres` user the server runs as.
        return PathBuf::from("/var/lib/sweep/dev");
    }
    let data_home = std::env::var_os("XDG_DATA_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")));
    match data_home {
        Some(d) => d.join("sweep/dev"),
        None => {
            std::env::temp_dir().join(format!("sweep-dev-{}", rustix::process::geteuid().as_raw()))
        }
    }
}

/// Creates `base` and its missing ancestors. As root, those it creates are opened to others
/// (0755), since the `postgres` user must pass through them to reach its data directory.
pub(super) fn create_base(base: &Path, as_root: bool) -> anyhow::Result<()> {
    let missing: Vec<&Path> = base.ancestors().take_while(|p| !p.exists()).collect();
    fs::create_dir_all(base)
        .with_context(|| format!("creating the data directory {}", base.display()))?;
    if as_root {
        use std::os::unix::fs::PermissionsExt;
        for dir in missing {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
                .with_context(|| format!("opening {} to the postgres user", dir.display()))?;
        }
    }
    Ok(())
}

/// The file naming the pid of the sweep process that uses `kept/`.
pub(super) const KEPT_PID: &str = "kept.pid";

/// True while `pid` runs. A zombie counts as gone: an orphaned server that exited stays one
/// where the init process does not reap (some containers).
pub(super) fn process_alive(pid: i32) -> bool {
    let Some(raw) = Pid::from_raw(pid) else { return false };
    let exists = match rustix::process::test_kill_process(raw) {
        Ok(()) => true,
        // It exists, under another user.
        Err(e) => e == rustix::io::Errno::PERM,
    };
    exists && !zombie(pid)
}

pub(super) fn zombie(pid: i32) -> bool {
    // Linux only; elsewhere there is no /proc and nothing counts as a zombie. The state
    // follows the parenthesised command name, which may itself hold spaces.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

pub(super) fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.lines().next()?.trim().parse().ok()
}

/// Stops the servers of dead runs and removes their throwaway directories.
pub(super) async fn clean_stale(base: &Path) -> anyhow::Result<()> {
    let entries = fs::read_dir(base)
        .with_context(|| format!("reading the data directory {}", base.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("run-")) else { continue };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        // Our own pid can be a dead run's in a container, where pids repeat from boot to boot.
        if pid != std::process::id() as i32 && process_alive(pid) {
            continue;
        }
        let dir = entry.path();
        stop_orphan(&dir).await?;
        tracing::info!(dir = %dir.display(), "removing the data directory of a dead sweep run");
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// Takes `kept/` for this process, refusing if a live sweep process holds it; stops a server
/// left running in it.
pub(super) fn claim_kept(base: &Path) -> anyhow::Result<()> {
    let pid_file = base.join(KEPT_PID);
    if let Some(owner) = read_pid(&pid_file) {
        if owner != std::process::id() as i32 && process_alive(owner) {
            bail!(
                "{} is in use by another sweep process (pid {owner}); stop it, or pass another \
                 --data-dir (if that pid is not sweep, delete {})",
                base.join(KEPT).display(),
                pid_file.display()
            );
        }
    }
    fs::write(&pid_file, format!("{}\n", std::process::id()))
        .with_context(|| format!("writing {}", pid_file.display()))
}

/// Stops a server that still runs in `dir` (its `postmaster.pid` names a live process).
pub(super) async fn stop_orphan(dir: &Path) -> anyhow::Result<()> {
    let Some(pid) = read_pid(&dir.join("postmaster.pid")).and_then(Pid::from_raw) else {
        return Ok(());
    };
    if !serves(pid, dir) {
        // A stale pid file whose number now belongs to another process.
        return Ok(());
    }
    for signal in [Signal::INT, Signal::QUIT] {
        if !process_alive(pid.as_raw_nonzero().get()) {
            return Ok(());
        }
        tracing::info!(pid = pid.as_raw_nonzero().get(), dir = %dir.display(), "stopping a Postgres left running");
        let _ = rustix::process::kill_process(pid, signal);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline && process_alive(pid.as_raw_nonzero().get()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    if process_alive(pid.as_raw_nonzero().get()) {
        bail!("Postgres (pid {}) in {} does not stop", pid.as_raw_nonzero(), dir.display());
    }
    Ok(())
}

/// Whether `pid` is a postmaster started on `dir` (its command line holds `-D dir`). Without
/// /proc (not Linux) the pid file is taken at its word.
pub(super) fn serves(pid: Pid, dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    match fs::read(format!("/proc/{}/cmdline", pid.as_raw_nonzero())) {
        Ok(cmdline) => cmdline.split(|b| *b == 0).any(|arg| arg == dir.as_os_str().as_bytes()),
        Err(_) => !cfg!(target_os = "linux"),
    }
}
