//! The `sweep` binary's allocator (src/alloc.rs): on mimalloc, the process turns transparent
//! huge pages off for itself before its first block; with `SWEEP_ALLOCATOR=system` it leaves
//! them as it found them. (That the compile child runs on the system allocator, which its
//! `RLIMIT_AS` needs, is shown by `compile_limits`: on mimalloc its compiles fail.)
//!
//! Read from `/proc/<pid>/status` of a `sweep compile-module` process while it waits for its
//! module on stdin: the test waits for that read (`/proc/<pid>/syscall`: `read` on fd 0), the
//! point by which the allocator has long been chosen.

#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `THP_enabled` of a `sweep compile-module` started with `allocator` as `SWEEP_ALLOCATOR`.
fn thp_enabled(allocator: Option<&str>) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sweep"));
    command
        .args(["compile-module", "--cpu-secs", "30", "--memory-bytes", &(16u64 << 30).to_string()])
        .env_remove("SWEEP_ALLOCATOR")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(allocator) = allocator {
        command.env("SWEEP_ALLOCATOR", allocator);
    }
    let mut child = command.spawn().unwrap();
    wait_for_stdin_read(&child);
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    drop(child.stdin.take());
    child.wait().unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("THP_enabled:"))
        .unwrap_or_else(|| panic!("no THP_enabled in /proc status: {status}"))
        .trim()
        .to_owned()
}

/// Waits until the child blocks in `read(0, ...)` (syscall 0 on x86-64, first argument 0).
fn wait_for_stdin_read(child: &Child) {
    let path = format!("/proc/{}/syscall", child.id());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let syscall = std::fs::read_to_string(&path).unwrap_or_default();
        if syscall.starts_with("0 0x0 ") {
            return;
        }
        assert!(Instant::now() < deadline, "sweep compile-module never read its stdin: {syscall}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn mimalloc_turns_huge_pages_off_and_the_system_allocator_leaves_them() {
    assert_eq!(thp_enabled(None), "0", "the default, mimalloc");
    assert_eq!(thp_enabled(Some("mimalloc")), "0", "anything but `system` is mimalloc");
    assert_eq!(thp_enabled(Some("system")), "1", "the system allocator leaves THP on");
}
