//! `sweep-bench`: end-to-end benchmarks of a real runner on a database of its own, which it
//! drops and creates afresh on every run (see `sweep_dev::bench`).

use clap::Parser;
use tracing_subscriber::EnvFilter;

// The product's allocator, so the runner this hosts measures as `sweep run` does.
#[global_allocator]
static GLOBAL: sweep::alloc::RoleAllocator = sweep::alloc::RoleAllocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = sweep_dev::bench::BenchArgs::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    sweep_dev::bench::bench(args).await
}
