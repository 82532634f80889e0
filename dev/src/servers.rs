//! What the servers tests start for themselves (Postgres in [`crate::pg`], PgBouncer in
//! [`crate::pgbouncer`]) share: both refuse to run as root, so when the tests run as root
//! their commands go through `runuser -u postgres`; both listen on a free local port.

use std::{path::Path, process::Command};

/// Whether this process runs as root (and its servers must run as `postgres`).
pub(crate) fn as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A command running `exe`, as the `postgres` user when this process is root.
pub(crate) fn server_command(exe: &Path) -> Command {
    if as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(exe);
        c
    } else {
        Command::new(exe)
    }
}

/// A port nobody listens on right now.
pub(crate) fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("local address").port()
}
