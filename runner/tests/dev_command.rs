//! `sweep dev` end to end: the real binary, with DATABASE_URL removed from its environment,
//! starts a Postgres server of its own from the installed binaries (as the `postgres` user
//! when the test runs as root), serves the admin API and prints its URLs and a token; the test
//! runs a task through that API, sends SIGINT and checks that the command exits 0, the server
//! process is gone and the data directory is removed (or kept, with `--keep`).
//!
//! Each test uses a data directory of its own under the temp dir and an API on port 0.

use std::{
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use rustix::process::{Pid, Signal};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncBufReadExt, BufReader, Lines},
    process::{Child, ChildStdout, Command},
    time::{timeout, Instant},
};

/// initdb, migrations and compiling the example modules on a busy 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const TASK_TIMEOUT: Duration = Duration::from_secs(60);
const EXIT_TIMEOUT: Duration = Duration::from_secs(90);

fn modules_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("wasm32-wasip1/wasm");
    assert!(
        dir.join("wordcount.wasm").is_file(),
        "{}: no wordcount.wasm; run scripts/build-modules.sh",
        dir.display()
    );
    dir
}

/// A fresh base directory for one test; removed when dropped.
struct Base(PathBuf);

impl Base {
    fn new(name: &str) -> Base {
        let dir =
            std::env::temp_dir().join(format!("sweep-dev-test-{name}-{}", uuid::Uuid::new_v4()));
        Base(dir)
    }
}

impl Drop for Base {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `sweep dev` and what it printed.
struct Dev {
    child: Child,
    _stdout: Lines<BufReader<ChildStdout>>,
    /// Everything it writes on stderr, collected until it exits.
    stderr: tokio::task::JoinHandle<String>,
    api: String,
    token: String,
    data_dir: PathBuf,
    /// The postmaster's pid, from the data directory's `postmaster.pid`.
    server_pid: i32,
}

async fn start(base: &Path, keep: bool) -> Dev {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sweep"));
    cmd.arg("dev")
        .arg("--data-dir")
        .arg(base)
        .args(["--admin-addr", "127.0.0.1:0", "--poll-ms", "200"])
        .arg("--modules-dir")
        .arg(modules_dir())
        .env_remove("DATABASE_URL")
        .env_remove("SWEEP_ADMIN_ADDR")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if keep {
        cmd.arg("--keep");
    }
    let mut child = cmd.spawn().expect("spawn sweep dev");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut errors = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let stderr = tokio::spawn(async move {
        let mut all = String::new();
        while let Ok(Some(line)) = errors.next_line().await {
            eprintln!("sweep dev: {line}");
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let (mut api, mut token, mut data_dir) = (None, None, None);
    let deadline = Instant::now() + READY_TIMEOUT;
    while api.is_none() || token.is_none() || data_dir.is_none() {
        let line = timeout(deadline.saturating_duration_since(Instant::now()), lines.next_line())
            .await
            .expect("sweep dev printed its URLs in time")
            .expect("read stdout")
            .unwrap_or_else(|| {
                panic!("sweep dev exited before it was ready: {:?}", child.try_wait())
            });
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("api"), Some(url)) => api = Some(url.to_owned()),
            (Some("token"), Some(t)) => token = Some(t.to_owned()),
            (Some("database"), Some(_)) => {
                let dir = line
                    .split_once("data in ")
                    .and_then(|(_, rest)| rest.split_once(", "))
                    .map(|(dir, _)| PathBuf::from(dir))
                    .unwrap_or_else(|| panic!("no data directory in {line:?}"));
                data_dir = Some(dir);
            }
            _ => {}
        }
    }
    let data_dir = data_dir.expect("data dir");
    let server_pid = std::fs::read_to_string(data_dir.join("postmaster.pid"))
        .expect("postmaster.pid")
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("a pid in postmaster.pid");
    assert!(alive(server_pid), "the server named in postmaster.pid runs");
    Dev {
        child,
        _stdout: lines,
        stderr,
        api: api.expect("api"),
        token: token.expect("token"),
        data_dir,
        server_pid,
    }
}

/// True while `pid` runs; a zombie (exited, not yet reaped by an init that does not reap)
/// counts as gone.
fn alive(pid: i32) -> bool {
    let exists = match rustix::process::test_kill_process(Pid::from_raw(pid).expect("pid > 0")) {
        Ok(()) => true,
        Err(e) => e == rustix::io::Errno::PERM,
    };
    exists && !zombie(pid)
}

fn zombie(pid: i32) -> bool {
    // The state follows the parenthesised command name, which may itself hold spaces.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

async fn wait_until_gone(pid: i32) {
    let deadline = Instant::now() + EXIT_TIMEOUT;
    while alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Dev {
    fn signal(&self, signal: Signal) {
        let pid = self.child.id().and_then(|id| Pid::from_raw(id as i32)).expect("running");
        rustix::process::kill_process(pid, signal).expect("signal sweep dev");
    }

    /// SIGINT, then the exit status.
    async fn interrupt(self) -> ExitStatus {
        self.interrupt_logged().await.0
    }

    /// SIGINT, then the exit status and what it wrote on stderr.
    async fn interrupt_logged(mut self) -> (ExitStatus, String) {
        self.signal(Signal::INT);
        let status = timeout(EXIT_TIMEOUT, self.child.wait())
            .await
            .expect("sweep dev exits after SIGINT")
            .expect("wait");
        let stderr =
            timeout(EXIT_TIMEOUT, self.stderr).await.expect("stderr closes").expect("reader");
        (status, stderr)
    }

    fn http(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    async fn enqueue_wordcount(&self, text: &str) -> i64 {
        let answer: Value = self
            .http()
            .post(format!("{}/tasks", self.api))
            .bearer_auth(&self.token)
            .json(&json!({"task_type": "wordcount", "payload": {"text": text}}))
            .send()
            .await
            .expect("POST /v1/tasks")
            .error_for_status()
            .expect("enqueue accepted")
            .json()
            .await
            .expect("json");
        answer["id"].as_i64().unwrap_or_else(|| panic!("no id in {answer}"))
    }

    async fn task(&self, token: &str, id: i64) -> reqwest::Response {
        self.http()
            .get(format!("{}/tasks/{id}", self.api))
            .bearer_auth(token)
            .send()
            .await
            .expect("GET /v1/tasks/{id}")
    }

    /// Polls the task until it has succeeded; returns its result.
    async fn wait_succeeded(&self, id: i64) -> Value {
        let deadline = Instant::now() + TASK_TIMEOUT;
        loop {
            let task: Value = self.task(&self.token, id).await.json().await.expect("json");
            match task["state"].as_str() {
                Some("succeeded") => return task["result"].clone(),
                Some("pending" | "running" | "retrying") => {}
                _ => panic!("task {id} did not succeed: {task}"),
            }
            assert!(Instant::now() < deadline, "task {id} still not done: {task}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn dev_serves_the_examples_and_cleans_up_on_sigint() {
    let base = Base::new("throwaway");
    let dev = start(&base.0, false).await;
    assert!(
        dev.data_dir.starts_with(&base.0),
        "{} under {}",
        dev.data_dir.display(),
        base.0.display()
    );

    let id = dev.enqueue_wordcount("a b a").await;
    let result = dev.wait_succeeded(id).await;
    assert_eq!(result["words"], 3, "{result}");

    // Another token is refused: the printed one is the dev tenant's own.
    let refused = dev.task("swp_not-a-token", id).await;
    assert_eq!(refused.status(), 401);

    let (server, data_dir) = (dev.server_pid, dev.data_dir.clone());
    let (status, stderr) = dev.interrupt_logged().await;
    assert!(status.success(), "sweep dev exited with {status}");
    // RUST_LOG=warn: a clean run and shutdown log nothing (sqlx used to warn as the server
    // stopped under a pooled connection), and nothing is coloured off a terminal.
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "colour codes off a terminal: {stderr:?}");
    assert!(!alive(server), "the Postgres server (pid {server}) is gone once sweep dev exited");
    assert!(!data_dir.exists(), "{} is removed", data_dir.display());
}

#[tokio::test]
async fn dev_keep_keeps_the_data_for_the_next_run() {
    let base = Base::new("keep");
    let first = start(&base.0, true).await;
    let id = first.enqueue_wordcount("kept words survive a restart").await;
    let result = first.wait_succeeded(id).await;
    let (old_token, first_server, data_dir) =
        (first.token.clone(), first.server_pid, first.data_dir.clone());
    let status = first.interrupt().await;
    assert!(status.success(), "first run exited with {status}");
    assert!(!alive(first_server), "the first run's server is gone");
    assert!(data_dir.join("PG_VERSION").is_file(), "{} is kept", data_dir.display());

    let second = start(&base.0, true).await;
    assert_eq!(second.data_dir, data_dir, "the second run uses the kept directory");
    assert_ne!(second.token, old_token, "every run prints a new token");
    assert_eq!(second.task(&old_token, id).await.status(), 401, "the old token stopped working");
    let task: Value = second.task(&second.token, id).await.json().await.expect("json");
    assert_eq!(task["state"], "succeeded", "{task}");
    assert_eq!(task["result"], result, "the first run's result is still there");

    let second_server = second.server_pid;
    let status = second.interrupt().await;
    assert!(status.success(), "second run exited with {status}");
    assert!(!alive(second_server), "the second run's server is gone");
    assert!(data_dir.join("PG_VERSION").is_file(), "still kept");
}

/// A `sweep dev` killed with SIGKILL cannot stop its server: the kernel does
/// (`PR_SET_PDEATHSIG`), and the next start removes the dead run's directory.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_killed_dev_leaves_no_server_and_its_directory_is_cleaned_next_time() {
    let base = Base::new("killed");
    let mut dev = start(&base.0, false).await;
    let (server, data_dir) = (dev.server_pid, dev.data_dir.clone());
    dev.signal(Signal::KILL);
    let _ = timeout(EXIT_TIMEOUT, dev.child.wait()).await.expect("killed").expect("wait");
    wait_until_gone(server).await;
    assert!(data_dir.exists(), "a killed run cannot remove its directory");

    let next = start(&base.0, false).await;
    assert!(!data_dir.exists(), "the next start removed {}", data_dir.display());
    let status = next.interrupt().await;
    assert!(status.success(), "{status}");
}
