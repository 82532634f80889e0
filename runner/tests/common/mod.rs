//! The shared test helpers live in the development crate (`sweep_dev`), with the benches'.
#![allow(unused_imports)]

pub use sweep::queue::{FailureKind, TaskState};
pub use sweep_dev::{migrated, modules::*, testing::*, Stores};
