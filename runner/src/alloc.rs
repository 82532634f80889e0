//! The global allocator of the `sweep` binary (and of `sweep-bench`, which hosts a runner):
//! mimalloc, or the system allocator for a process whose memory `RLIMIT_AS` must bound.
//!
//! Owns: [`RoleAllocator`] and the choice between the two allocators.
//!
//! Why mimalloc: a runner allocates and frees a few hundred small blocks per task (the claimed
//! row, the store, the WASI context, the report). Drains of the Rust SDK guest alternated with
//! the system allocator: runner CPU per task 18.8-19.5 µs against 21.2-22.0 µs, 40,600-42,000
//! against 38,200-39,700 tasks/s (benches/README.md, 2026-12-03).
//!
//! Why without transparent huge pages: where THP is `always`, mimalloc's memory is backed by
//! 2 MiB pages, and each one it hands back to the kernel after its purge delay and touches
//! again is a fresh huge page the kernel zeroes whole (`clear_page_erms` under
//! `do_huge_pmd_anonymous_page`: 8% of the runner's samples, 2-3 µs of system time per task).
//! So a process on mimalloc disables THP for itself (`PR_SET_THP_DISABLE`, what mimalloc's own
//! `MIMALLOC_ALLOW_THP=0` does), before its first block. Guest memories are unaffected: their
//! accessible part is reset page by page and is never a whole aligned 2 MiB anyway.
//!
//! Invariants:
//! - the choice is made once, at the process's first allocation (before `main`), from
//!   [`ALLOCATOR_ENV`], and never changes, so every block is freed by the allocator that
//!   allocated it; making it allocates nothing (`getenv` reads the environment in place);
//! - the compile child runs on the system allocator (its parent sets
//!   `SWEEP_ALLOCATOR=system`, see `sandbox/compiler.rs`): mimalloc reserves address space up
//!   front, a GiB at a time, which the child's `RLIMIT_AS` refuses (its compiles failed in
//!   `compile_limits`), and what it committed inside a reservation made before the limit was
//!   set would not be counted against it.

// A global allocator is an `unsafe impl` by definition; each method only forwards to an
// allocator that upholds the same contract.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::CStr;
use std::sync::atomic::{AtomicU8, Ordering};

use mimalloc::MiMalloc;

/// The environment variable that picks the allocator: [`SYSTEM`] for the system allocator;
/// unset or anything else, mimalloc.
pub const ALLOCATOR_ENV: &str = as_str(ALLOCATOR_ENV_C);
/// [`ALLOCATOR_ENV`]'s value for the system allocator.
pub const SYSTEM: &str = as_str(SYSTEM_C);
// Spelled once, as C strings for `getenv` before `main`; the `&str` forms are derived.
const ALLOCATOR_ENV_C: &CStr = c"SWEEP_ALLOCATOR";
const SYSTEM_C: &CStr = c"system";

const fn as_str(c: &'static CStr) -> &'static str {
    match c.to_str() {
        Ok(s) => s,
        Err(_) => panic!("not UTF-8"),
    }
}

const UNDECIDED: u8 = 0;
const MIMALLOC: u8 = 1;
const CHOSE_SYSTEM: u8 = 2;

static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// mimalloc, or the system allocator when `SWEEP_ALLOCATOR=system`. Install it with
/// `#[global_allocator] static GLOBAL: sweep::alloc::RoleAllocator = sweep::alloc::RoleAllocator;`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoleAllocator;

impl RoleAllocator {
    /// The allocator this process uses, chosen at its first allocation.
    fn chosen() -> &'static dyn GlobalAlloc {
        let system = match CHOICE.load(Ordering::Relaxed) {
            MIMALLOC => false,
            CHOSE_SYSTEM => true,
            _ => {
                // SAFETY: the name is NUL-terminated, and the value is read at once. The first
                // allocation happens before `main`, while only the main thread exists, so
                // nothing changes the environment meanwhile. Two threads racing here later
                // would read the same value and store the same choice.
                let system = unsafe {
                    let value = libc::getenv(ALLOCATOR_ENV_C.as_ptr());
                    !value.is_null() && CStr::from_ptr(value) == SYSTEM_C
                };
                if !system {
                    // SAFETY: a plain syscall on this process's own flags; it allocates
                    // nothing. Where it fails (an old kernel), THP stays as it was: slower,
                    // not wrong.
                    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
                }
                CHOICE.store(if system { CHOSE_SYSTEM } else { MIMALLOC }, Ordering::Relaxed);
                system
            }
        };
        if system {
            &System
        } else {
            &MiMalloc
        }
    }
}

// SAFETY: every method forwards, with the caller's arguments, to the allocator chosen once for
// the whole process, so a block is always freed or resized by the allocator that made it.
unsafe impl GlobalAlloc for RoleAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { Self::chosen().alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe { Self::chosen().alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { Self::chosen().dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe { Self::chosen().realloc(ptr, layout, new_size) }
    }
}
