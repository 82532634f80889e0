//! `grow` fixture: allocates and touches 1 MiB chunks, keeping them all,
//! until the memory limit refuses to grow linear memory. The failed
//! allocation then aborts (a trap on wasm32-wasip1). Do not run it natively
//! without a `ulimit -v`.

use std::hint::black_box;

const CHUNK: usize = 1 << 20;

fn main() {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; CHUNK];
        // Touch every page so the memory is really committed, natively too.
        for page in chunk.chunks_mut(4096) {
            page[0] = 1;
        }
        chunks.push(black_box(chunk));
    }
}
