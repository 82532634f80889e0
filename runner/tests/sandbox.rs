//! Sandbox runs against tiny inline `.wat` guests: every outcome, the guest's view of its
//! environment, and that misbehaving guests don't starve healthy ones. Each outcome is checked
//! under both the pooling and the on-demand allocator. Validation and the module cache are in
//! `sandbox_modules.rs`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sweep::sandbox::{
    AllocatorKind, Capabilities, CompiledModule, Limits, Outcome, Sandbox, SandboxConfig,
    TaskInput, TrapCause, Usage, CAPACITY_WAIT,
};

const WASI: &str = "wasi_snapshot_preview1";

use sweep_dev::testing::{both_allocators as both, shared_sandbox as sandbox};

fn compile(sandbox: &Sandbox, wat: &str) -> anyhow::Result<CompiledModule> {
    Ok(sandbox.compile(&wat::parse_str(wat)?)?)
}

fn input(payload: serde_json::Value) -> TaskInput {
    TaskInput::new("task-123", "echo", 2, 5, &payload)
}

/// Short limits so misbehaving fixtures end quickly.
fn limits() -> Limits {
    Limits {
        fuel: 50_000_000,
        timeout: Duration::from_secs(2),
        memory_bytes: 4 * 1024 * 1024,
        output_bytes: 64 * 1024,
    }
}

/// Reads all of stdin into memory at 1024, then writes it back to stdout.
const ECHO: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start") (local $total i32) (local $n i32)
    (loop $read
      (i32.store (i32.const 0) (i32.add (i32.const 1024) (local.get $total)))
      (i32.store (i32.const 4) (i32.sub (i32.const 60000) (local.get $total)))
      (if (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)) (then unreachable))
      (local.set $n (i32.load (i32.const 8)))
      (local.set $total (i32.add (local.get $total) (local.get $n)))
      (br_if $read (local.get $n)))
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (local.get $total))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

/// Writes `msg` to stderr, then exits with `code`.
fn exit_with(code: i32, msg: &str) -> String {
    format!(
        r#"(module
  (import "{WASI}" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "{msg}")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const {len}))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
    (call $proc_exit (i32.const {code}))))"#,
        len = msg.len()
    )
}

/// Traps unless argc == 0; writes its environment (NUL-separated) to stderr; exits 1.
const ENV_TO_STDERR: &str = r#"(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $env_sizes (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $env_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (drop (call $args_sizes (i32.const 0) (i32.const 4)))
    (if (i32.load (i32.const 0)) (then unreachable))
    (drop (call $env_sizes (i32.const 0) (i32.const 4)))
    (drop (call $env_get (i32.const 64) (i32.const 1024)))
    (i32.store (i32.const 8) (i32.const 1024))
    (i32.store (i32.const 12) (i32.load (i32.const 4)))
    (drop (call $fd_write (i32.const 2) (i32.const 8) (i32.const 1) (i32.const 16)))
    (call $proc_exit (i32.const 1))))"#;

const SPIN: &str = r#"(module (func (export "_start") (loop $l (br $l))))"#;

/// Grows memory 1 MiB at a time for as long as growth succeeds.
const GROW: &str = r#"(module (memory 1)
  (func (export "_start")
    (loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))))"#;

const RECURSE: &str = r#"(module (func $f (call $f)) (func (export "_start") (call $f)))"#;

const UNREACHABLE: &str = r#"(module (func (export "_start") unreachable))"#;

/// Writes 1 KiB to stdout forever, ignoring errors.
const FLOOD: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 1024))
    (loop $l
      (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (br $l))))"#;

/// poll_oneoff on one relative monotonic-clock subscription of one hour.
const SLEEP_AN_HOUR: &str = r#"(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const 3600000000000))
    (i32.store16 (i32.const 40) (i32.const 0))
    (drop (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)))))"#;

/// Exits 0 after printing text that is not JSON.
const NOT_JSON: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "hello")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const 5))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

use sweep::queue::FailureKind;
use sweep_dev::modules::EMPTY_MODULE_WAT as NOOP;

async fn run(sandbox: &Sandbox, wat: &str, limits: Limits) -> anyhow::Result<Outcome> {
    let module = compile(sandbox, wat)?;
    Ok(sandbox.run(&module, &input(json!(null)), &limits).await.outcome)
}

#[test]
fn allocator_kinds() {
    assert_eq!(sandbox(false).allocator(), AllocatorKind::OnDemand);
    // Pooling may legitimately fall back on a constrained host; either way it is reported.
    println!("pooled sandbox uses: {}", sandbox(true).allocator());
}

#[tokio::test]
async fn echo_success_round_trips_json() -> anyhow::Result<()> {
    for sb in both() {
        let module = compile(sb, ECHO)?;
        let payload = json!({"n": 3, "s": "héllo"});
        let exec = sb.run(&module, &input(payload.clone()), &limits()).await;
        assert_eq!(exec.outcome, Outcome::Success(payload));
        assert!(exec.usage.fuel_used > 0 && exec.usage.fuel_used < limits().fuel);
        // One 64 KiB page, never grown; no HTTP.
        assert_eq!(
            exec.usage,
            Usage { fuel_used: exec.usage.fuel_used, peak_memory_bytes: 65536, ..Usage::default() }
        );
        assert_eq!(exec.failure_message(), None);
    }
    Ok(())
}

#[tokio::test]
async fn empty_stdout_is_null_and_garbage_is_invalid_output() -> anyhow::Result<()> {
    for sb in both() {
        assert_eq!(run(sb, NOOP, limits()).await?, Outcome::Success(json!(null)));
        let out = run(sb, NOT_JSON, limits()).await?;
        assert_eq!(out.failure_kind(), Some(FailureKind::InvalidOutput), "{out:?}");
    }
    Ok(())
}

#[tokio::test]
async fn exit_100_is_permanent_with_stderr_message() -> anyhow::Result<()> {
    for sb in both() {
        let out = run(sb, &exit_with(100, "bad input: no n"), limits()).await?;
        assert_eq!(
            out,
            Outcome::HandlerError {
                permanent: true,
                exit_code: 100,
                message: "bad input: no n".into()
            }
        );
        assert!(out.is_permanent());
    }
    Ok(())
}

#[tokio::test]
async fn exit_1_is_retryable() -> anyhow::Result<()> {
    for sb in both() {
        let out = run(sb, &exit_with(1, "try later"), limits()).await?;
        assert_eq!(out.failure_kind(), Some(FailureKind::HandlerError));
        assert!(!out.is_permanent());
        assert_eq!(out.message().as_deref(), Some("try later"));
    }
    Ok(())
}

#[tokio::test]
async fn guest_sees_only_sweep_env_and_no_args() -> anyhow::Result<()> {
    let out = run(sandbox(true), ENV_TO_STDERR, limits()).await?;
    let Outcome::HandlerError { message, .. } = out else {
        anyhow::bail!("expected a handler error, got {out:?}");
    };
    let vars: Vec<&str> = message.split('\0').filter(|v| !v.is_empty()).collect();
    assert_eq!(
        vars,
        [
            "SWEEP_TASK_ID=task-123",
            "SWEEP_TASK_TYPE=echo",
            "SWEEP_ATTEMPT=2",
            "SWEEP_MAX_ATTEMPTS=5"
        ]
    );
    Ok(())
}

#[tokio::test]
async fn given_variables_follow_the_sweep_ones() -> anyhow::Result<()> {
    let module = compile(sandbox(true), ENV_TO_STDERR)?;
    let mut input = input(json!(null));
    input.capabilities = Capabilities {
        env: vec![("MAIL_API_KEY".into(), "k-123".into()), ("EMPTY".into(), String::new())],
        ..Capabilities::none()
    };
    let out = sandbox(true).run(&module, &input, &limits()).await.outcome;
    let Outcome::HandlerError { message, .. } = out else {
        anyhow::bail!("expected a handler error, got {out:?}");
    };
    let vars: Vec<&str> = message.split('\0').filter(|v| !v.is_empty()).collect();
    assert_eq!(vars[4..], ["MAIL_API_KEY=k-123", "EMPTY="]);
    assert_eq!(vars.len(), 6);
    Ok(())
}

#[tokio::test]
async fn spinning_guest_with_big_fuel_times_out() -> anyhow::Result<()> {
    let limits = Limits { fuel: u64::MAX / 2, timeout: Duration::from_millis(300), ..limits() };
    for sb in both() {
        assert_eq!(run(sb, SPIN, limits).await?, Outcome::Timeout);
    }
    Ok(())
}

#[tokio::test]
async fn spinning_guest_with_small_fuel_runs_out() -> anyhow::Result<()> {
    for sb in both() {
        let module = compile(sb, SPIN)?;
        let exec = sb.run(&module, &input(json!(null)), &limits()).await;
        assert_eq!(exec.outcome, Outcome::OutOfFuel);
        assert_eq!(exec.usage.fuel_used, limits().fuel);
    }
    Ok(())
}

#[tokio::test]
async fn growing_past_the_limit_is_memory_limit() -> anyhow::Result<()> {
    for sb in both() {
        let module = compile(sb, GROW)?;
        let exec = sb.run(&module, &input(json!(null)), &limits()).await;
        assert_eq!(exec.outcome, Outcome::MemoryLimit);
        // 1 page, then 1 MiB steps up to the limit (4 MiB): the last that fits is the peak.
        assert_eq!(exec.usage.peak_memory_bytes, 65536 + 3 * (1 << 20));
    }
    Ok(())
}

#[tokio::test]
async fn initial_memory_past_the_limit_is_memory_limit() -> anyhow::Result<()> {
    // 128 pages = 8 MiB initial memory against a 4 MiB limit: refused at instantiation.
    let wat = r#"(module (memory 128) (func (export "_start")))"#;
    for sb in both() {
        assert_eq!(run(sb, wat, limits()).await?, Outcome::MemoryLimit);
    }
    Ok(())
}

#[tokio::test]
async fn unbounded_recursion_is_stack_overflow() -> anyhow::Result<()> {
    for sb in both() {
        assert_eq!(run(sb, RECURSE, limits()).await?, Outcome::StackOverflow);
    }
    Ok(())
}

#[tokio::test]
async fn unreachable_is_a_wasm_trap() -> anyhow::Result<()> {
    for sb in both() {
        let out = run(sb, UNREACHABLE, limits()).await?;
        assert!(
            matches!(
                out,
                Outcome::Trap {
                    cause: TrapCause::Wasm(wasmtime::Trap::UnreachableCodeReached),
                    ..
                }
            ),
            "{out:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn stdout_flood_is_stopped_as_output_too_large() -> anyhow::Result<()> {
    let limits = Limits { output_bytes: 4096, fuel: u64::MAX / 2, ..limits() };
    for sb in both() {
        assert_eq!(run(sb, FLOOD, limits).await?, Outcome::OutputTooLarge);
    }
    Ok(())
}

#[tokio::test]
async fn sleeping_in_poll_oneoff_times_out() -> anyhow::Result<()> {
    let limits = Limits { timeout: Duration::from_millis(300), ..limits() };
    for sb in both() {
        let module = compile(sb, SLEEP_AN_HOUR)?;
        let exec = sb.run(&module, &input(json!(null)), &limits).await;
        assert_eq!(exec.outcome, Outcome::Timeout);
        assert!(exec.duration < Duration::from_secs(60));
    }
    Ok(())
}

/// Healthy work completes while two spinners and a sleeper hold the only runtime thread:
/// spinners yield at every epoch tick, the sleeper waits on a tokio timer.
#[tokio::test(flavor = "current_thread")]
async fn misbehaving_guests_do_not_starve_a_healthy_one() -> anyhow::Result<()> {
    let sb = sandbox(true);
    let slow = Limits { fuel: u64::MAX / 2, timeout: Duration::from_millis(1500), ..limits() };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let jobs = [
        ("spin-1", SPIN, slow),
        ("spin-2", SPIN, slow),
        ("sleep", SLEEP_AN_HOUR, slow),
        ("healthy", ECHO, limits()),
    ];
    for (name, wat, limits) in jobs {
        let module = Arc::new(compile(sb, wat)?);
        let tx = tx.clone();
        // Spawned in order: the spinners are already running when the healthy task starts.
        tokio::spawn(async move {
            let exec = sb.run(&module, &input(json!({"ok": true})), &limits).await;
            let _ = tx.send((name, exec.outcome));
        });
    }
    drop(tx);
    let mut finished = Vec::new();
    while let Some(done) = rx.recv().await {
        finished.push(done);
    }
    assert_eq!(finished.len(), 4);
    assert_eq!(finished[0], ("healthy", Outcome::Success(json!({"ok": true}))));
    for (name, outcome) in &finished[1..] {
        assert_eq!(outcome, &Outcome::Timeout, "{name}");
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn limits_above_the_maxima_are_capped() -> anyhow::Result<()> {
    let sb = Sandbox::new(SandboxConfig {
        pooling: true,
        max_concurrency: 2,
        defaults: Limits { memory_bytes: 2 << 20, ..Limits::DEFAULT },
        maxima: Limits { memory_bytes: 2 << 20, ..Limits::MAXIMA },
        ..SandboxConfig::default()
    })?;
    let asks_for_more = Limits { memory_bytes: 1 << 30, ..limits() };
    assert_eq!(run(&sb, GROW, asks_for_more).await?, Outcome::MemoryLimit);
    Ok(())
}

/// A pooling sandbox of one slot, taken by a guest that sleeps until `hold` runs out; `None`
/// where the host has no pooling allocator.
async fn one_slot_held_for(
    hold: Duration,
) -> anyhow::Result<Option<(Sandbox, tokio::task::JoinHandle<sweep::sandbox::Execution>)>> {
    let sb = Sandbox::new(SandboxConfig {
        pooling: true,
        max_concurrency: 1,
        ..SandboxConfig::default()
    })?;
    if sb.allocator() != AllocatorKind::Pooling {
        eprintln!("pooling unavailable on this host; skipping");
        return Ok(None);
    }
    let sleeper = Arc::new(compile(&sb, SLEEP_AN_HOUR)?);
    let held = {
        let (sb, sleeper) = (sb.clone(), Arc::clone(&sleeper));
        let limits = Limits { timeout: hold, ..limits() };
        tokio::spawn(async move { sb.run(&sleeper, &input(json!(null)), &limits).await })
    };
    // On this single-threaded runtime the spawned run gets polled here: it instantiates
    // (taking the only slot) and parks in its sleep.
    tokio::task::yield_now().await;
    Ok(Some((sb, held)))
}

/// A run that finds no free slot in the pool waits for one: it starts as soon as the slot
/// comes back, and the guest never pays for the wait with a failed attempt.
#[tokio::test(flavor = "current_thread")]
async fn a_run_waits_for_a_free_pool_slot() -> anyhow::Result<()> {
    let Some((sb, held)) = one_slot_held_for(Duration::from_millis(200)).await? else {
        return Ok(());
    };
    let out = run(&sb, NOOP, limits()).await?;
    assert_eq!(out, Outcome::Success(json!(null)), "waited for the slot");
    assert_eq!(held.await?.outcome, Outcome::Timeout);
    Ok(())
}

/// A slot that never comes back within the wait is the runner's problem, typed as such
/// (`NoCapacity`, which the worker hands back to the queue uncounted), not blamed on the guest.
#[tokio::test(flavor = "current_thread")]
async fn a_pool_that_stays_full_is_no_capacity() -> anyhow::Result<()> {
    let Some((sb, held)) = one_slot_held_for(CAPACITY_WAIT * 3).await? else {
        return Ok(());
    };
    let out = run(&sb, NOOP, limits()).await?;
    assert!(matches!(out, Outcome::NoCapacity(_)), "{out:?}");
    assert_eq!(out.failure_kind(), Some(FailureKind::RunnerError), "if it were ever recorded");
    assert_eq!(held.await?.outcome, Outcome::Timeout);
    // The slot is free again.
    assert_eq!(run(&sb, NOOP, limits()).await?, Outcome::Success(json!(null)));
    Ok(())
}
