//! `sweep`: parse the command line, set up tracing, hand off to the library. The only place
//! that uses `anyhow`.
//!
//! An error ends the process with one line on stderr, `error: ` and the error with its causes
//! (`{:#}`), and exit status 1: never a backtrace, whatever `RUST_BACKTRACE` says (an error
//! here is the user's to read, not a bug report). Log lines are coloured only when stderr is a
//! terminal and `NO_COLOR` is unset.

mod cli;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[global_allocator]
static GLOBAL: sweep::alloc::RoleAllocator = sweep::alloc::RoleAllocator;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // A compiler child: no runtime, no tracing; its limits go on before anything else.
    if let cli::Command::CompileModule(compile) = &args.command {
        std::process::exit(sweep::sandbox::compile_module_main(
            compile.cpu_secs,
            compile.memory_bytes,
        ));
    }
    let ran = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run(args)));
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` is the chain on one line; `{:?}` would add anyhow's backtrace.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Colour codes only for a person at a terminal (<https://no-color.org>).
fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

async fn run(args: cli::Cli) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        .init();
    cli::dispatch(args).await
}
