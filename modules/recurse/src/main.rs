//! `recurse` fixture: unbounded, non-tail recursion that ends in a stack
//! overflow trap (wasmtime's `Trap::StackOverflow`).
//!
//! The frames hold only wasm locals, never Rust's shadow stack in linear
//! memory: with `black_box` inside `depth`, each frame spilled to the shadow
//! stack, and with a large engine stack the 1 MiB shadow stack ran out first,
//! surfacing as an out-of-bounds memory access instead.

use std::hint::black_box;

fn depth(n: u64) -> u64 {
    if n == u64::MAX {
        return n;
    }
    // Work after the call keeps it from being a tail call, and rotate-then-xor
    // is not an accumulator that LLVM could fold into a loop.
    depth(n + 1).rotate_left(7) ^ n
}

fn main() {
    // An opaque start, so nothing can be precomputed.
    let result = depth(black_box(0));
    std::process::exit((result & 1) as i32)
}
