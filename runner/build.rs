//! Rebuilds the crate when a migration is added or edited: `sqlx::migrate!` embeds
//! `../migrations` at compile time, and cargo does not know the macro reads that directory, so
//! a new migration committed without a Rust change would not be embedded.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
