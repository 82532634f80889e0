//! Module validation (the upload check) and the sha256-keyed module cache.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use sweep::sandbox::{
    sha256_hex, ModuleCache, Sandbox, SandboxConfig, SandboxError, ValidationError,
    ENTRY_OVERHEAD_BYTES,
};
use sweep_dev::modules::distinct_module;

const WASI: &str = "wasi_snapshot_preview1";

/// A minimal WASI command: imports `fd_write`, exports `memory` and `_start`.
const COMMAND: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")))"#;

use sweep_dev::modules::EMPTY_MODULE_WAT as NOOP;

fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| Sandbox::new(SandboxConfig::default()).expect("sandbox builds"))
}

#[test]
fn validation_accepts_a_wasi_command() -> anyhow::Result<()> {
    let bytes = wat::parse_str(COMMAND)?;
    let info = sandbox().validate_module(&bytes)?;
    assert_eq!(info.wasi_imports, ["fd_write", "proc_exit"]);
    assert_eq!(info.size_bytes, bytes.len());
    assert_eq!(info.sha256, sha256_hex(&bytes));
    assert_eq!(info.sha256.len(), 64);
    Ok(())
}

#[test]
fn validation_rejects_bad_modules_with_typed_errors() -> anyhow::Result<()> {
    let sb = sandbox();
    let check = |bytes: &[u8]| sb.validate_module(bytes).err();

    assert!(matches!(check(b"hello, world"), Some(ValidationError::NotWasm)));
    assert!(matches!(check(b""), Some(ValidationError::NotWasm)));
    assert!(matches!(check(b"\0asm\x02\x00\x00\x00"), Some(ValidationError::NotCoreModule)));
    // The empty component: valid, but not a command.
    match check(b"\0asm\x0d\x00\x01\x00") {
        Some(e @ ValidationError::MissingRunExport { .. }) => assert_eq!(
            e.to_string(),
            "component does not export `wasi:cli/run` (a WASI 0.2 command, such as a `main` built for wasm32-wasip2); it exports: nothing"
        ),
        other => panic!("expected a missing run export, got {other:?}"),
    }
    assert!(matches!(check(b"\0asm\x01\x00\x00\x00\xff\xff"), Some(ValidationError::Compile(_))));

    let no_start = wat::parse_str(r#"(module (func (export "main")))"#)?;
    assert!(matches!(check(&no_start), Some(ValidationError::MissingStart)));

    let bad_sig = wat::parse_str(r#"(module (func (export "_start") (param i32)))"#)?;
    assert!(matches!(check(&bad_sig), Some(ValidationError::BadStartSignature { .. })));

    let forbidden =
        wat::parse_str(r#"(module (import "env" "host_fn" (func)) (func (export "_start")))"#)?;
    match check(&forbidden) {
        Some(ValidationError::ForbiddenImport { module, name }) => {
            assert_eq!((module.as_str(), name.as_str()), ("env", "host_fn"));
        }
        other => anyhow::bail!("expected ForbiddenImport, got {other:?}"),
    }
    let err = sb.validate_module(&forbidden).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("env::host_fn"), "{err}");

    let unknown = wat::parse_str(
        r#"(module (import "wasi_snapshot_preview1" "no_such_call" (func))
            (memory (export "memory") 1) (func (export "_start")))"#,
    )?;
    match check(&unknown) {
        Some(ValidationError::UnknownImport { module, name }) => {
            assert_eq!((module.as_str(), name.as_str()), (WASI, "no_such_call"));
        }
        other => anyhow::bail!("expected UnknownImport, got {other:?}"),
    }

    let no_memory = wat::parse_str(
        r#"(module (import "wasi_snapshot_preview1" "proc_exit" (func (param i32))) (func (export "_start")))"#,
    )?;
    assert!(matches!(check(&no_memory), Some(ValidationError::MissingMemoryExport)));

    let wrong_type = wat::parse_str(
        r#"(module (import "wasi_snapshot_preview1" "proc_exit" (func (param i64)))
            (memory (export "memory") 1) (func (export "_start")))"#,
    )?;
    assert!(matches!(check(&wrong_type), Some(ValidationError::Link(_))));
    Ok(())
}

#[test]
fn compile_wraps_validation_errors() {
    assert!(matches!(
        sandbox().compile(b"nope"),
        Err(SandboxError::Invalid(ValidationError::NotWasm))
    ));
}

#[tokio::test]
async fn module_cache_compiles_once_and_checks_hashes() -> anyhow::Result<()> {
    let cache = ModuleCache::new(sandbox().clone());
    let bytes = wat::parse_str(NOOP)?;
    let sha = sha256_hex(&bytes);
    let loads = AtomicUsize::new(0);
    let load = || async {
        loads.fetch_add(1, Ordering::SeqCst);
        // Stay pending a moment, so the other callers arrive while this load is in flight.
        tokio::task::yield_now().await;
        Ok::<_, std::io::Error>(bytes.clone())
    };
    let all = futures::future::join_all((0..8).map(|_| cache.get_or_compile(&sha, load))).await;
    let first = all[0].as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
    for other in &all {
        let other = other.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        assert!(Arc::ptr_eq(first, other), "every concurrent miss gets the one compile");
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1, "eight concurrent misses, one load");
    assert_eq!(first.sha256(), sha);
    assert!(cache.get(&sha).await.is_some());
    cache.settle().await;
    assert_eq!(cache.len(), 1);

    let wrong = "0".repeat(64);
    let res =
        cache.get_or_compile(&wrong, || async { Ok::<_, std::io::Error>(bytes.clone()) }).await;
    assert!(matches!(res.as_ref().map_err(|e| &**e), Err(SandboxError::HashMismatch { .. })));
    let res = cache
        .get_or_compile(&wrong, || async { Err::<Vec<u8>, _>(std::io::Error::other("db down")) })
        .await;
    assert!(matches!(res.as_ref().map_err(|e| &**e), Err(SandboxError::Load { .. })));
    cache.settle().await;
    assert_eq!(cache.len(), 1, "failures leave no entry");

    // Concurrent misses whose load fails share that one failure.
    let other = wat::parse_str(COMMAND)?;
    let other_sha = sha256_hex(&other);
    let failed_loads = AtomicUsize::new(0);
    let failing = || async {
        failed_loads.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        Err::<Vec<u8>, _>(std::io::Error::other("db down"))
    };
    let (a, b) = tokio::join!(
        cache.get_or_compile(&other_sha, failing),
        cache.get_or_compile(&other_sha, failing)
    );
    match (a, b) {
        (Err(a), Err(b)) => assert!(Arc::ptr_eq(&a, &b), "one shared error"),
        other => anyhow::bail!("expected two errors, got {other:?}"),
    }
    assert_eq!(failed_loads.load(Ordering::SeqCst), 1);
    // A failed load leaves nothing behind: the next call for that key loads again.
    let m = cache.get_or_compile(&other_sha, || async { Ok::<_, std::io::Error>(other) }).await?;
    assert_eq!(m.sha256(), other_sha);
    assert!(cache.remove(&other_sha).await);
    assert!(cache.remove(&sha).await);
    cache.settle().await;
    assert!(cache.is_empty());
    Ok(())
}

#[tokio::test]
async fn module_cache_evicts_past_its_byte_bound() -> anyhow::Result<()> {
    let one = sandbox().compile(&distinct_module(0))?;
    assert!(one.image_bytes() > 0, "wasmtime reports the compiled image");
    assert!(one.resident_bytes() >= ENTRY_OVERHEAD_BYTES + one.image_bytes());
    // Room for four entries of this size.
    let weight = one.resident_bytes() as u64;
    let cache = ModuleCache::with_max_bytes(sandbox().clone(), 4 * weight);
    let mut shas = Vec::new();
    for n in 0..40 {
        let bytes = distinct_module(n);
        shas.push(sha256_hex(&bytes));
        let m = cache.insert(bytes).await?;
        assert_eq!(m.resident_bytes() as u64, weight, "the modules weigh the same");
        cache.settle().await;
        assert!(
            cache.weighted_bytes() <= cache.max_bytes(),
            "after {n}: {} > {}",
            cache.weighted_bytes(),
            cache.max_bytes()
        );
    }
    assert!((1..=4).contains(&cache.len()), "{} entries", cache.len());
    let mut held = 0;
    for sha in &shas {
        held += usize::from(cache.get(sha).await.is_some());
    }
    assert_eq!(held as u64, cache.len(), "what is counted is what can be found");

    // An evicted module compiles again on its next use.
    let evicted = shas.iter().position(|s| !cache.contains(s)).expect("some were evicted");
    let loads = AtomicUsize::new(0);
    let again = cache
        .get_or_compile(&shas[evicted], || async {
            loads.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(distinct_module(evicted as u64))
        })
        .await?;
    assert_eq!(again.sha256(), shas[evicted]);
    assert_eq!(loads.load(Ordering::SeqCst), 1);

    // A module compiled elsewhere goes in under its own hash.
    let elsewhere = Arc::new(sandbox().compile(&distinct_module(1000))?);
    cache.insert_compiled(Arc::clone(&elsewhere)).await;
    let found = cache.get(elsewhere.sha256()).await.expect("inserted");
    assert!(Arc::ptr_eq(&found, &elsewhere));
    Ok(())
}
