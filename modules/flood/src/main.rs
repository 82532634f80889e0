//! `flood` fixture: writes 64 KiB chunks to stdout forever, ignoring its
//! payload, until the host's output limit stops it. If a write fails (the
//! host refused more output, or a shell pipe closed) it exits with code 1.

use std::io::Write;

fn main() {
    let chunk = [b'x'; 64 * 1024];
    let mut stdout = std::io::stdout().lock();
    loop {
        if let Err(err) = stdout.write_all(&chunk) {
            eprintln!("flood: stdout write failed: {err}");
            std::process::exit(1);
        }
    }
}
