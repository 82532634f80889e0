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
    fs, io,
    path::{Path, PathBuf},
    process::ExitStatus,
    time::Duration,
};

use anyhow::{bail, Context};
use rustix::process::{Pid, Signal};
use tokio::sync::watch;

mod dirs;
mod launch;

use dirs::{
    claim_kept, clean_stale, create_base, default_base_dir, server_user, stop_orphan, KEPT_PID,
};
use launch::{init_cluster, launch, Launch};

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
