//! A Postgres server of our own, started from the binaries installed on this machine, for
//! `sweep dev` and `sweep demo` when they are given no database URL.
//!
//! Owns: finding `initdb` and `postgres`, the data directories under one base directory
//! (`run-<pid>/` for a throwaway server, `kept/` for `--keep`), starting the server on a free
//! local port, waiting until it accepts connections, and stopping it.
//!
//! Invariants:
//! - the server listens on 127.0.0.1 only, over TCP (no Unix socket), with trust auth for the
//!   superuser `postgres`: it is reachable from this machine and nowhere else;
//! - run as root, `initdb` and `postgres` run as the `postgres` user (Postgres refuses root),
//!   and the data directory belongs to that user; otherwise they run as the caller;
//! - the server has its own process group, so a terminal's Ctrl-C reaches only sweep, which
//!   stops its runner first and the server after (SIGINT: fast shutdown), then removes a
//!   throwaway data directory;
//! - if sweep dies without stopping it, the server does not outlive it for long: on Linux the
//!   kernel sends it SIGINT when sweep exits (`PR_SET_PDEATHSIG`), and on every platform the
//!   next start stops a server still running in a dead run's directory and removes it (a
//!   `run-<pid>` directory whose pid is gone, or `kept/` whose `kept.pid` owner is gone).

use std::{
    fs,
    io::{self, Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use anyhow::{bail, Context};
use rustix::process::{Pid, Signal};
use sqlx::Connection;
use tokio::{process::Command, sync::watch, time::Instant};

/// How long the server gets to accept connections after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a fast shutdown may take before the server is told to quit immediately.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Name of the kept data directory under the base directory.
const KEPT: &str = "kept";
/// Ports that were free when looked at but taken by the time the server bound them are
/// retried with a new one this many times.
const PORT_ATTEMPTS: usize = 3;

/// Where and how to start the server.
#[derive(Debug, Clone, clap::Args)]
pub struct LocalPgArgs {
    /// Directory holding `initdb` and `postgres` (default: the first on PATH with both, else
    /// the newest /usr/lib/postgresql/*/bin, /usr/pgsql-*/bin or Homebrew postgresql@*).
    #[arg(long, env = "SWEEP_PG_BIN")]
    pub pg_bin: Option<PathBuf>,
    /// Base directory for the embedded server's data (default: $XDG_DATA_HOME/sweep/dev or
    /// ~/.local/share/sweep/dev; /var/lib/sweep/dev as root).
    #[arg(long, env = "SWEEP_DEV_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

/// A running server. Stop it with [`LocalPostgres::stop`]; dropping it only signals the
/// server to shut down (the directory is then cleaned by the next start).
#[derive(Debug)]
pub struct LocalPostgres {
    dir: PathBuf,
    keep: bool,
    port: u16,
    version: String,
    pid: Pid,
    /// `Some(status)` once the server process has exited.
    exited: watch::Receiver<Option<io::Result<ExitStatus>>>,
    stopped: bool,
}

/// The user the server runs as when sweep runs as root.
#[derive(Debug, Clone, Copy)]
struct ServerUser {
    uid: u32,
    gid: u32,
}

impl LocalPostgres {
    /// Starts a server: in `kept/` (reused if it holds a cluster) when `keep`, else in a new
    /// `run-<pid>/`, after cleaning up what dead runs left behind. Must be called from the
    /// main thread: on Linux the server is told to stop when the thread that started it exits.
    pub async fn start(args: &LocalPgArgs, keep: bool) -> anyhow::Result<LocalPostgres> {
        let bin = find_bin_dir(args.pg_bin.as_deref())?;
        let user = server_user().await?;
        let base = args.data_dir.clone().unwrap_or_else(default_base_dir);
        // The server runs in `/` (the caller's directory may be closed to it).
        let base = std::path::absolute(&base)
            .with_context(|| format!("resolving the data directory {}", base.display()))?;
        create_base(&base, user.is_some())?;
        clean_stale(&base).await?;
        let dir = if keep {
            claim_kept(&base)?;
            stop_orphan(&base.join(KEPT)).await?;
            base.join(KEPT)
        } else {
            base.join(format!("run-{}", std::process::id()))
        };
        let started = async {
            if !dir.join("PG_VERSION").exists() {
                init_cluster(&bin, &dir, user, keep).await?;
            }
            let version = fs::read_to_string(dir.join("PG_VERSION"))
                .with_context(|| format!("reading {}/PG_VERSION", dir.display()))?
                .trim()
                .to_owned();
            let mut last_error = None;
            for _ in 0..PORT_ATTEMPTS {
                match launch(&bin, &dir, user, keep).await {
                    Ok((port, pid, exited)) => {
                        return Ok(LocalPostgres {
                            dir: dir.clone(),
                            keep,
                            port,
                            version,
                            pid,
                            exited,
                            stopped: false,
                        })
                    }
                    Err(Launch::PortTaken(e)) => last_error = Some(e),
                    Err(Launch::Failed(e)) => return Err(e),
                }
            }
            Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no free port found")))
        };
        match started.await {
            Ok(pg) => Ok(pg),
            Err(e) => {
                release_dir(&base, &dir, keep);
                Err(e)
            }
        }
    }

    /// Connection URL for database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn keeps_data(&self) -> bool {
        self.keep
    }

    /// Resolves when the server process has exited (on its own, or after [`Self::stop`]).
    pub async fn exited(&self) {
        let mut exited = self.exited.clone();
        let _ = exited.wait_for(Option::is_some).await;
    }

    /// Fast shutdown (SIGINT), waiting for the server to exit; immediate shutdown (SIGQUIT)
    /// if it takes longer than [`STOP_TIMEOUT`]. Then removes the data directory unless it
    /// is kept.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.stopped = true;
        let _ = rustix::process::kill_process(self.pid, Signal::INT);
        let mut exited = self.exited.clone();
        if tokio::time::timeout(STOP_TIMEOUT, exited.wait_for(Option::is_some)).await.is_err() {
            tracing::warn!("Postgres did not stop within {STOP_TIMEOUT:?}; telling it to quit");
            let _ = rustix::process::kill_process(self.pid, Signal::QUIT);
            if tokio::time::timeout(STOP_TIMEOUT, exited.wait_for(Option::is_some)).await.is_err() {
                bail!(
                    "Postgres (pid {}) did not stop; its data is left in {}",
                    self.pid.as_raw_nonzero(),
                    self.dir.display()
                );
            }
        }
        let base = self.dir.parent().map(Path::to_path_buf).unwrap_or_default();
        release_dir(&base, &self.dir, self.keep);
        Ok(())
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        // Reached only on an early error or a panic: ask the server to go; the next start
        // removes what it leaves.
        if !self.stopped && self.exited.borrow().is_none() {
            let _ = rustix::process::kill_process(self.pid, Signal::INT);
        }
    }
}

/// Removes a throwaway data directory, or the kept directory's owner file.
fn release_dir(base: &Path, dir: &Path, keep: bool) {
    let result = if keep { fs::remove_file(base.join(KEPT_PID)) } else { fs::remove_dir_all(dir) };
    if let Err(e) = result {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot clean up the data directory");
        }
    }
}

// ---- finding the binaries ---------------------------------------------------------------

fn has_server_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("postgres").is_file()
}

fn find_bin_dir(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = explicit {
        if has_server_binaries(dir) {
            return Ok(dir.to_path_buf());
        }
        bail!("{} holds no `initdb` and `postgres` (--pg-bin / SWEEP_PG_BIN)", dir.display());
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(dir) = std::env::split_paths(&path).find(|d| has_server_binaries(d)) {
            return Ok(dir);
        }
    }
    // Distributions keep the server binaries off PATH: Debian and Ubuntu per major version,
    // RHEL and Fedora's PGDG packages likewise, Homebrew's versioned formulae unlinked.
    let patterns: [(&str, &str, &str); 4] = [
        ("/usr/lib/postgresql", "", "bin"),
        ("/usr", "pgsql-", "bin"),
        ("/opt/homebrew/opt", "postgresql@", "bin"),
        ("/usr/local/opt", "postgresql@", "bin"),
    ];
    let mut found: Vec<(u32, PathBuf)> = Vec::new();
    for (parent, prefix, bin) in patterns {
        let Ok(entries) = fs::read_dir(parent) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(version) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
                continue;
            };
            let dir = entry.path().join(bin);
            if has_server_binaries(&dir) {
                found.push((major_version(version), dir));
            }
        }
    }
    found.sort();
    match found.pop() {
        Some((_, dir)) => Ok(dir),
        None => bail!(
            "no Postgres server binaries found (`initdb` and `postgres` on PATH or under \
             /usr/lib/postgresql/*/bin). Install Postgres (Debian/Ubuntu: `apt-get install \
             postgresql`; macOS: `brew install postgresql@16`), point --pg-bin at its bin \
             directory, or pass --database-url for a server that is already running"
        ),
    }
}

/// The leading number of a version directory's name ("15", "16.2"); 0 if there is none.
fn major_version(name: &str) -> u32 {
    let digits: String = name.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or(0)
}

// ---- who runs the server, and where ---------------------------------------------------------

/// `Some(postgres)` when sweep runs as root, `None` when the server can run as the caller.
async fn server_user() -> anyhow::Result<Option<ServerUser>> {
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

fn default_base_dir() -> PathBuf {
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
fn create_base(base: &Path, as_root: bool) -> anyhow::Result<()> {
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
const KEPT_PID: &str = "kept.pid";

/// True while `pid` runs. A zombie counts as gone: an orphaned server that exited stays one
/// where the init process does not reap (some containers).
fn process_alive(pid: i32) -> bool {
    let Some(raw) = Pid::from_raw(pid) else { return false };
    let exists = match rustix::process::test_kill_process(raw) {
        Ok(()) => true,
        // It exists, under another user.
        Err(e) => e == rustix::io::Errno::PERM,
    };
    exists && !zombie(pid)
}

fn zombie(pid: i32) -> bool {
    // Linux only; elsewhere there is no /proc and nothing counts as a zombie. The state
    // follows the parenthesised command name, which may itself hold spaces.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.lines().next()?.trim().parse().ok()
}

/// Stops the servers of dead runs and removes their throwaway directories.
async fn clean_stale(base: &Path) -> anyhow::Result<()> {
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
fn claim_kept(base: &Path) -> anyhow::Result<()> {
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
async fn stop_orphan(dir: &Path) -> anyhow::Result<()> {
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
fn serves(pid: Pid, dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    match fs::read(format!("/proc/{}/cmdline", pid.as_raw_nonzero())) {
        Ok(cmdline) => cmdline.split(|b| *b == 0).any(|arg| arg == dir.as_os_str().as_bytes()),
        Err(_) => !cfg!(target_os = "linux"),
    }
}

// ---- initdb and postgres ------------------------------------------------------------------

fn command(bin: &Path, name: &str, user: Option<ServerUser>) -> Command {
    let mut cmd = Command::new(bin.join(name));
    // The caller's working directory may be closed to the `postgres` user.
    cmd.current_dir("/").stdin(Stdio::null()).kill_on_drop(false);
    if let Some(u) = user {
        cmd.uid(u.uid).gid(u.gid);
    }
    cmd
}

async fn init_cluster(
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

enum Launch {
    /// The port was taken between looking and binding: try another.
    PortTaken(anyhow::Error),
    Failed(anyhow::Error),
}

type Exited = watch::Receiver<Option<io::Result<ExitStatus>>>;

/// Starts `postgres` on a free port and waits until it accepts connections.
async fn launch(
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

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The last few KiB the server logged since `from`.
fn log_tail(path: &Path, from: u64) -> String {
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
fn die_with_parent(cmd: &mut Command) {
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
fn die_with_parent(_cmd: &mut Command) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_versions_order_numerically() {
        assert_eq!(major_version("15"), 15);
        assert_eq!(major_version("16.2"), 16);
        assert_eq!(major_version("main"), 0);
        let mut v = [(major_version("9"), "a"), (major_version("15"), "b")];
        v.sort();
        assert_eq!(v.last().map(|x| x.1), Some("b"));
    }

    #[test]
    fn an_explicit_bin_dir_without_binaries_is_refused() {
        let err = find_bin_dir(Some(Path::new("/nonexistent"))).expect_err("no binaries there");
        assert!(err.to_string().contains("holds no `initdb`"), "{err}");
    }
}
