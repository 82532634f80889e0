//! `spinloop` fixture: an endless busy loop that ignores its payload. Only
//! fuel or the wall-clock (epoch) limit stops it; `black_box` keeps the loop
//! from being optimised away. (Not named `spin`: a crate in the dependency
//! graph already is, which would make `cargo -p spin` ambiguous.)

use std::hint::black_box;

fn main() {
    let mut counter: u64 = 0;
    loop {
        counter = black_box(counter.wrapping_add(1));
    }
}
