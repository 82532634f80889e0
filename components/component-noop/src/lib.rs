//! `component-noop`: the WASI 0.2 component counterpart of `modules/noop`: reads the payload,
//! checks that it is JSON, returns `{}`. It does the work `modules/noop` does, so the two
//! measure what a component costs the sandbox next to a preview-1 module (benches/README.md).
//!
//! It exports `wasi:cli/run` itself (`wasip2::cli::command::export!` in a `cdylib`) instead of
//! through `fn main`: wasi-libc's command entry, which `fn main` gets, runs once per instance,
//! while this `run` may be called again, so runners keep its instance between tasks
//! (docs/guests.md, "Kept instances").

use std::io::{Read, Write};

use serde::de::IgnoredAny;

struct Noop;

impl wasip2::exports::cli::run::Guest for Noop {
    fn run() -> Result<(), ()> {
        let mut payload = Vec::new();
        let parsed =
            std::io::stdin().read_to_end(&mut payload).map_err(|e| e.to_string()).and_then(|_| {
                serde_json::from_slice::<IgnoredAny>(&payload).map_err(|e| e.to_string())
            });
        if let Err(e) = parsed {
            eprintln!("the payload is not JSON: {e}");
            // A payload that does not parse never will: permanent (exit 100).
            wasip2::cli::exit::exit_with_code(100);
        }
        let mut out = std::io::stdout();
        // A failed write is the host's to report (it reads what stdout received).
        let _ = out.write_all(b"{}");
        let _ = out.flush();
        Ok(())
    }
}

wasip2::cli::command::export!(Noop);
