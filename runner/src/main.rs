//! `sweep`: parse the command line, set up tracing, hand off to the library. The only place
//! that uses `anyhow`.

mod cli;

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[global_allocator]
static GLOBAL: sweep::alloc::RoleAllocator = sweep::alloc::RoleAllocator;

fn main() -> anyhow::Result<()> {
    let args = cli::Cli::parse();
    // A compiler child: no runtime, no tracing; its limits go on before anything else.
    if let cli::Command::CompileModule(compile) = &args.command {
        std::process::exit(sweep::sandbox::compile_module_main(
            compile.cpu_secs,
            compile.memory_bytes,
        ));
    }
    tokio::runtime::Runtime::new()?.block_on(run(args))
}

async fn run(args: cli::Cli) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    cli::dispatch(args).await
}
