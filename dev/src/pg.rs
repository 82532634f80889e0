//! A Postgres server of a test's own, for tests that stop, restart or cut off the database
//! (fault tests): initialised in a temporary directory from the binaries installed on this
//! machine, listening on a free port of 127.0.0.1, stopped and deleted on drop.
//!
//! As root the server runs as the `postgres` user through `runuser` (Postgres refuses root).

use std::{
    path::{Path, PathBuf},
    str::FromStr,
};

use anyhow::{bail, Context};
use sqlx::postgres::PgConnectOptions;

use crate::servers::{free_port, server_command};

#[derive(Debug)]
pub struct PrivatePostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl PrivatePostgres {
    /// Initialises a cluster and starts it.
    pub fn start() -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("sweep-pg-{}-{port}", std::process::id()));
        let pg = PrivatePostgres { bin, dir, port };
        let dir = pg.dir.display().to_string();
        pg.run("initdb", &["-D", &dir, "-A", "trust", "-U", "postgres", "--no-sync"])?;
        // Quick to stop and to come back; fsync off: nothing here must survive a power cut.
        let conf = "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n\
                    fsync = off\nmax_connections = 200\n";
        let conf_path = pg.dir.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path).context("reading postgresql.conf")?;
        text.push_str(&format!("{conf}port = {port}\n"));
        write_as_owner(&conf_path, &text)?;
        pg.start_server()?;
        Ok(pg)
    }

    /// Options for its `postgres` database (use `.database(..)` for another).
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }

    /// Creates database `name` and returns its options.
    pub async fn create_database(&self, name: &str) -> anyhow::Result<PgConnectOptions> {
        use sqlx::{migrate::MigrateDatabase, Postgres};
        Postgres::create_database(&self.url(name)).await.context("creating the database")?;
        Ok(self.options().database(name))
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Starts the stopped server and waits until it accepts connections.
    pub fn start_server(&self) -> anyhow::Result<()> {
        let dir = self.dir.display().to_string();
        let log = self.dir.join("server.log").display().to_string();
        self.run("pg_ctl", &["-D", &dir, "-l", &log, "-w", "-t", "60", "start"])
    }

    /// Stops the server: `fast` rolls back open transactions and closes connections, as an
    /// operator's restart does; `immediate` is a crash (recovery runs at the next start).
    pub fn stop_server(&self, mode: StopMode) -> anyhow::Result<()> {
        let dir = self.dir.display().to_string();
        let mode = match mode {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        };
        self.run("pg_ctl", &["-D", &dir, "-m", mode, "-w", "-t", "60", "stop"])
    }

    fn run(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        let out = server_command(&self.bin.join(tool))
            .args(args)
            .current_dir("/")
            .output()
            .with_context(|| format!("{tool}"))?;
        if !out.status.success() {
            bail!(
                "{tool} {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    pub fn data_dir(&self) -> &Path {
        &self.dir
    }
}

#[derive(Debug, Clone, Copy)]
pub enum StopMode {
    Fast,
    Immediate,
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.stop_server(StopMode::Immediate);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The newest installed server's binaries: `SWEEP_PG_BIN`, or `/usr/lib/postgresql/N/bin`, or
/// whatever directory on PATH holds `pg_ctl`.
fn bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SWEEP_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = u32::from_str(e.file_name().to_str()?).ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|d| d.join("pg_ctl").exists()))
        .context(
            "no Postgres server binaries (pg_ctl) found: install postgresql or set SWEEP_PG_BIN",
        )
}

/// Writes a file of the cluster keeping its owner (the server refuses files it cannot read).
fn write_as_owner(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    std::fs::write(path, text)?;
    std::os::unix::fs::chown(path, Some(meta.uid()), Some(meta.gid()))?;
    Ok(())
}
