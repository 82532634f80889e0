//! Where modules are compiled: in a child process of the same binary under a CPU, memory and
//! wall-clock budget (the product's way), or in this process (tests and embedders).
//!
//! Owns: [`CompilerKind`], the process-wide [`Compiler`] (structural check, compile slots,
//! the compile counter), the child's side ([`compile_module_main`], `sweep compile-module`)
//! and the one `unsafe` call that loads what the child wrote.
//!
//! Why a child: a compile is CPU- and memory-bound and its cost is set by the tenant who
//! wrote the module. In the runner's process it competes with the API and every tenant's
//! tasks for the cores and leaves its peak in the process's resident memory. A child runs
//! at a lower priority (nice +[`COMPILE_NICE`]), the kernel enforces its budget
//! (`RLIMIT_CPU`, `RLIMIT_AS`), and its memory goes back to the system when it exits.
//!
//! Protocol: the parent runs `<program> compile-module --cpu-secs N --memory-bytes M`, writes
//! the module on stdin and closes it. The child sets its own limits first, reads the module,
//! compiles it with the runner's engine settings (`engine::base_config`) and writes
//! `Engine::precompile_module`'s artifact on stdout (`precompile_component`'s for a
//! component: both sides tell the kind from the bytes), exit 0. Exit [`EXIT_INVALID`]: the
//! module does not validate (the message on stderr). Exit [`EXIT_RESOURCES`]: it validates
//! but the compile failed (out of memory under the budget). Killed by `SIGXCPU`/`SIGKILL`
//! without the parent asking: over the CPU budget. Its last stderr line is its usage
//! ([`STATS_PREFIX`]).
//!
//! Invariants:
//! - at most `max_concurrent` compiles run at once per [`Compiler`] (one per `Sandbox`),
//!   whichever path asked (upload or first run); the structural check runs before a slot is
//!   taken, so refusing a bomb costs one parser pass;
//! - a child is always waited for (no zombies) and killed when it outlives the wall bound;
//! - only bytes our own child wrote are deserialized: straight from its stdout, or from the
//!   fleet's artifact store when their tag (HMAC-SHA256 under the runners' key, derived from
//!   `SWEEP_SECRETS_KEY`, which the store never holds) verifies, see `artifacts`; wasmtime
//!   checks their header against the engine before using them.

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use wasmtime::component::Component;
use wasmtime::{Engine, Module};

use super::limits::{check_structure, CompileBudget, CompileLimits, LimitExceeded};
use super::module::ValidationError;

/// How much lower a compiler's priority is than the process's (Linux nice increments).
pub const COMPILE_NICE: i32 = 10;
/// The hidden subcommand of `sweep` that compiles one module.
pub const COMPILE_SUBCOMMAND: &str = "compile-module";
/// Child exit code: the module does not validate.
pub const EXIT_INVALID: i32 = 2;
/// Child exit code: the module validates, but compiling it failed within the budget.
pub const EXIT_RESOURCES: i32 = 3;
/// Child exit code: the child could not set itself up (limits, engine, stdin, stdout).
pub const EXIT_SETUP: i32 = 4;
/// Prefix of the child's last stderr line: `cpu_ms=<n> peak_rss_kib=<n>`.
pub const STATS_PREFIX: &str = "sweep-compile-stats";
/// Most child stderr kept (messages are short; this only bounds a misbehaving child).
const STDERR_KEEP: u64 = 64 * 1024;

/// What a compile made.
pub(crate) enum Compiled {
    /// A core module.
    Module(Module),
    /// A component.
    Component(Component),
}

/// Where a sandbox compiles modules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CompilerKind {
    /// In this process, on the calling thread, with no CPU or memory budget (the structural
    /// limits and the compile slots still apply). For tests and embedders.
    #[default]
    InProcess,
    /// In a child process: `program compile-module` (`program` is a `sweep` binary, usually
    /// `std::env::current_exe()`), under the budget of the sandbox's [`CompileLimits`].
    Child {
        /// The `sweep` executable.
        program: PathBuf,
    },
}

/// What one child compile used, from its own report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileStats {
    /// CPU time of all its threads.
    pub cpu: Duration,
    /// Its peak resident memory, in bytes.
    pub peak_rss_bytes: u64,
}

/// Compiles modules for one sandbox; see the module invariants.
#[derive(Debug)]
pub(crate) struct Compiler {
    kind: CompilerKind,
    limits: CompileLimits,
    running: Mutex<usize>,
    freed: Condvar,
    compiles: AtomicU64,
}

/// A compile slot, given back on drop.
struct Slot<'a>(&'a Compiler);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.running.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        self.0.freed.notify_one();
    }
}

impl Compiler {
    pub(crate) fn new(kind: CompilerKind, limits: CompileLimits) -> Self {
        Compiler {
            kind,
            limits,
            running: Mutex::new(0),
            freed: Condvar::new(),
            compiles: AtomicU64::new(0),
        }
    }

    pub(crate) fn limits(&self) -> &CompileLimits {
        &self.limits
    }

    /// Compiles started so far (past the structural check).
    pub(crate) fn compiles(&self) -> u64 {
        self.compiles.load(Ordering::Relaxed)
    }

    /// Blocks until fewer than `max_concurrent` compiles run, then takes a slot.
    fn slot(&self) -> Slot<'_> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        while *running >= self.limits.max_concurrent {
            running = self.freed.wait(running).unwrap_or_else(PoisonError::into_inner);
        }
        *running += 1;
        Slot(self)
    }

    /// Checks `bytes` against the structural limits, then compiles them on the configured
    /// path, as a component when the binary is one, else as a module. Blocks (a slot, then
    /// the compile): call it from a blocking context. With the compiled form comes the
    /// artifact the child wrote (none in process), for the fleet's artifact store.
    pub(crate) fn compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
    ) -> Result<(Compiled, Option<Vec<u8>>), ValidationError> {
        let structure = check_structure(bytes, &self.limits)?;
        let budget = self.limits.budget_for(structure.code_bytes);
        let _slot = self.slot();
        self.compiles.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(crate::metrics::MODULE_COMPILES).increment(1);
        let component = wasmparser::Parser::is_component(bytes);
        let invalid = |e: wasmtime::Error| ValidationError::Compile(e.into_boxed_dyn_error());
        match &self.kind {
            CompilerKind::InProcess if component => {
                let compiled = Component::from_binary(engine, bytes).map_err(invalid)?;
                Ok((Compiled::Component(compiled), None))
            }
            CompilerKind::InProcess => {
                Ok((Compiled::Module(Module::from_binary(engine, bytes).map_err(invalid)?), None))
            }
            CompilerKind::Child { program } => {
                let artifact = run_child(program, bytes, budget)?;
                let compiled = load_artifact(engine, &artifact, component)
                    .map_err(|e| failed(format!("loading the compiled module: {e}")))?;
                Ok((compiled, Some(artifact)))
            }
        }
    }
}

/// Compiles `bytes` in a child process under `budget`; see the module's protocol.
fn run_child(
    program: &PathBuf,
    bytes: &[u8],
    budget: CompileBudget,
) -> Result<Vec<u8>, ValidationError> {
    let mut child = Command::new(program)
        .arg(COMPILE_SUBCOMMAND)
        .arg("--cpu-secs")
        .arg(budget.cpu.as_secs().to_string())
        .arg("--memory-bytes")
        .arg(budget.memory_bytes.to_string())
        // The system allocator, with few arenas: mimalloc's up-front reservations do not
        // fit RLIMIT_AS (see crate::alloc), and each glibc arena reserves address space,
        // which RLIMIT_AS counts.
        .env(crate::alloc::ALLOCATOR_ENV, crate::alloc::SYSTEM)
        .env("MALLOC_ARENA_MAX", "2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(format!("cannot start {}: {e}", program.display())))?;
    let (Some(mut stdin), Some(mut stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(failed("the compiler's pipes were not set up".to_owned()));
    };
    let wall = budget.wall;
    let (out, status, err) = std::thread::scope(|s| {
        // A child that exits early (bad limits) closes its stdin: the write then fails,
        // and its exit status says why.
        s.spawn(move || {
            let _ = stdin.write_all(bytes);
        });
        let err_reader = s.spawn(move || {
            let mut text = String::new();
            let _ = stderr.take(STDERR_KEEP).read_to_string(&mut text);
            text
        });
        let (done, finished) = mpsc::channel();
        s.spawn(move || {
            let mut artifact = Vec::new();
            let read = stdout.read_to_end(&mut artifact).map(|_| artifact);
            let _ = done.send(read);
        });
        // Stdout closes when the child exits (it writes the artifact last).
        let out = match finished.recv_timeout(wall) {
            Ok(read) => Some(read),
            Err(_) => {
                let _ = child.kill();
                None
            }
        };
        let status = child.wait();
        (out, status, err_reader.join().unwrap_or_default())
    });
    let status = status.map_err(|e| failed(format!("waiting for the compiler: {e}")))?;
    let Some(out) = out else {
        return Err(LimitExceeded::CompileWall { limit: wall }.into());
    };
    let (message, stats) = split_stats(&err);
    if let Some(stats) = stats {
        metrics::gauge!(crate::metrics::MODULE_COMPILE_CPU).set(stats.cpu.as_secs_f64());
        metrics::gauge!(crate::metrics::MODULE_COMPILE_PEAK_RSS).set(stats.peak_rss_bytes as f64);
        tracing::info!(
            cpu_ms = stats.cpu.as_millis() as u64,
            peak_rss_kib = stats.peak_rss_bytes >> 10,
            success = status.success(),
            "module compiled in a child process"
        );
    }
    match (status.code(), status.signal()) {
        (Some(0), _) => out.map_err(|e| failed(format!("reading the compiled module: {e}"))),
        (Some(EXIT_INVALID), _) => Err(ValidationError::Compile(message.into())),
        (Some(EXIT_RESOURCES), _) => {
            tracing::info!(error = %message, "compile failed within its budget");
            Err(LimitExceeded::CompileMemory { limit: budget.memory_bytes }.into())
        }
        (_, Some(signal)) if signal == libc_sig::XCPU || signal == libc_sig::KILL => {
            Err(LimitExceeded::CompileTime { limit: budget.cpu }.into())
        }
        // Rust aborts when an allocation fails (RLIMIT_AS reached in malloc).
        (_, Some(libc_sig::ABRT)) if message.contains("memory allocation") => {
            Err(LimitExceeded::CompileMemory { limit: budget.memory_bytes }.into())
        }
        _ => Err(failed(format!("the compiler ended with {status}: {message}"))),
    }
}

/// Signal numbers the parent tells apart (Linux).
mod libc_sig {
    pub const ABRT: i32 = 6;
    pub const KILL: i32 = 9;
    pub const XCPU: i32 = 24;
}

fn failed(reason: String) -> ValidationError {
    ValidationError::CompilerFailed { reason }
}

/// The child's stderr without its stats line, and the stats.
fn split_stats(stderr: &str) -> (String, Option<CompileStats>) {
    let mut message = Vec::new();
    let mut stats = None;
    for line in stderr.lines() {
        match line.strip_prefix(STATS_PREFIX) {
            Some(rest) => stats = parse_stats(rest),
            None => message.push(line),
        }
    }
    (message.join("\n").trim().to_owned(), stats)
}

fn parse_stats(rest: &str) -> Option<CompileStats> {
    let mut cpu_ms = None;
    let mut rss_kib = None;
    for field in rest.split_whitespace() {
        match field.split_once('=') {
            Some(("cpu_ms", v)) => cpu_ms = v.parse::<u64>().ok(),
            Some(("peak_rss_kib", v)) => rss_kib = v.parse::<u64>().ok(),
            _ => {}
        }
    }
    Some(CompileStats {
        cpu: Duration::from_millis(cpu_ms?),
        peak_rss_bytes: rss_kib?.saturating_mul(1024),
    })
}

/// Loads an artifact a compile child of ours wrote: a component's when `component`, else a
/// module's. The two callers, and so the two ways such bytes reach it, are named in the
/// safety argument.
#[allow(unsafe_code)]
pub(crate) fn load_artifact(
    engine: &Engine,
    artifact: &[u8],
    component: bool,
) -> Result<Compiled, wasmtime::Error> {
    // SAFETY: `Module::deserialize` and `Component::deserialize` need bytes made by their
    // `serialize` or by `Engine::precompile_module` / `precompile_component` and not tampered
    // with. Every artifact here is the stdout of a compile child of ours (a `sweep` binary,
    // normally this very executable, `compile_module_main`), which compiled the module with
    // the runner's engine settings (`engine::base_config`), as a component exactly when
    // `component`. It reaches this function one of two ways:
    // - `Compiler::compile`: straight from the child's stdout, a pipe nothing else writes to;
    //   the kind is read from the same module bytes by both sides
    //   (`wasmparser::Parser::is_component`);
    // - `Sandbox::load_artifact` (`artifacts`): from the fleet's artifact store
    //   (`sweep.compiled_artifacts`), which is not trusted: anyone who can write it can put
    //   any bytes there, with any sha256. Such bytes reach this call only when the row's tag
    //   verifies (constant time) under this runner's `ArtifactKey`: HMAC-SHA256, keyed by a
    //   sub-key of the deployment's `SWEEP_SECRETS_KEY` (`secrets::SecretsKey::artifact_key`;
    //   the database never holds either key), over the module's sha256, the engine
    //   fingerprint, the kind, the module size and every byte read. The only code that tags
    //   is `Sandbox::compile_sharing`, and it tags only the stdout of such a child
    //   (`Compiler::compile`'s artifact, none for an in-process compile). So a verified tag
    //   means: these exact bytes are what a child of a runner holding the key wrote for this
    //   module, as this kind, with this engine fingerprint (checked equal to this runner's
    //   child's first). Forging a tag takes the key, which only the environment of the
    //   runners and the admin API holds; whoever has it *and* write access to the store can
    //   run native code on the runners, so it is guarded as that. A runner without a key
    //   neither loads nor stores artifacts (see docs/architecture.md, "Compile once per
    //   fleet").
    // wasmtime also checks the artifact's header (its kind, version, target, compiler flags
    // and wasm features) against `engine` and returns an error, not undefined behaviour, for
    // one built differently.
    if component {
        unsafe { Component::deserialize(engine, artifact) }.map(Compiled::Component)
    } else {
        unsafe { Module::deserialize(engine, artifact) }.map(Compiled::Module)
    }
}

/// The child's side: `sweep compile-module --cpu-secs N --memory-bytes M`. Sets its own
/// limits and priority first, then compiles stdin to stdout. Returns the exit code.
pub fn compile_module_main(cpu_secs: u64, memory_bytes: u64) -> i32 {
    use rustix::process::{nice, setrlimit, Resource, Rlimit};

    let _ = nice(COMPILE_NICE);
    // Soft limit: SIGXCPU at the budget; hard limit a second later: SIGKILL.
    let cpu = Rlimit { current: Some(cpu_secs), maximum: Some(cpu_secs.saturating_add(1)) };
    let memory = Rlimit { current: Some(memory_bytes), maximum: Some(memory_bytes) };
    // No core file when the CPU limit's SIGXCPU ends it.
    let none = Rlimit { current: Some(0), maximum: Some(0) };
    for (resource, limit, name) in [
        (Resource::Core, none, "RLIMIT_CORE"),
        (Resource::Cpu, cpu, "RLIMIT_CPU"),
        (Resource::As, memory, "RLIMIT_AS"),
    ] {
        if let Err(e) = setrlimit(resource, limit) {
            eprintln!("cannot set {name}: {e}");
            return EXIT_SETUP;
        }
    }
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut bytes) {
        eprintln!("cannot read the module from stdin: {e}");
        return EXIT_SETUP;
    }
    let engine = match Engine::new(&super::engine::base_config()) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("cannot create the engine: {e:#}");
            return EXIT_SETUP;
        }
    };
    let component = wasmparser::Parser::is_component(&bytes);
    let artifact = if component {
        engine.precompile_component(&bytes)
    } else {
        engine.precompile_module(&bytes)
    };
    let code = match artifact {
        Ok(artifact) => {
            let mut out = std::io::stdout().lock();
            match out.write_all(&artifact).and_then(|()| out.flush()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("cannot write the compiled module: {e}");
                    EXIT_SETUP
                }
            }
        }
        Err(e) => {
            eprintln!("{e:#}");
            // wasmtime validates a component only by compiling it: a component that failed
            // is taken as invalid (running out of memory aborts the child, which the parent
            // reads from the signal).
            if component || Module::validate(&engine, &bytes).is_err() {
                EXIT_INVALID
            } else {
                EXIT_RESOURCES
            }
        }
    };
    if let Some(stats) = own_usage() {
        eprintln!(
            "{STATS_PREFIX} cpu_ms={} peak_rss_kib={}",
            stats.cpu.as_millis(),
            stats.peak_rss_bytes >> 10
        );
    }
    code
}

/// This process's CPU time and peak RSS, from `/proc/self` (Linux).
fn own_usage() -> Option<CompileStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the file, 12 and 13 after the name.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux ABI Rust targets.
    let cpu = Duration::from_millis(ticks * 10);
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hwm = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    let kib = hwm.trim().trim_end_matches("kB").trim().parse::<u64>().ok()?;
    Some(CompileStats { cpu, peak_rss_bytes: kib * 1024 })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stats_line_is_split_from_the_message() {
        let (message, stats) =
            split_stats("error: bad\nmore\nsweep-compile-stats cpu_ms=1500 peak_rss_kib=2048\n");
        assert_eq!(message, "error: bad\nmore");
        let stats = stats.unwrap();
        assert_eq!(stats.cpu, Duration::from_millis(1500));
        assert_eq!(stats.peak_rss_bytes, 2 << 20);
        assert_eq!(split_stats("only text").1, None);
    }

    #[test]
    fn own_usage_reads_proc() {
        let usage = own_usage().unwrap();
        assert!(usage.peak_rss_bytes > 0);
    }
}
