//! Compile turns: at most one upload compile per tenant at a time.
//!
//! Owns: [`CompileTurns`] and its [`Turn`] guard.
//!
//! Why: compiles share a few process-wide slots (`sandbox::CompileLimits::max_concurrent`);
//! a tenant uploading several costly modules at once would take all of them and make every
//! other tenant's upload wait. With one turn each, a tenant holds at most one slot.
//!
//! Invariant: a tenant's turn is held from before its compile starts until that compile has
//! really ended (the guard moves into the blocking compile), even when the request stopped
//! waiting; a second upload meanwhile is refused at once, not queued.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// The tenants with an upload compile in progress.
#[derive(Debug, Default)]
pub(crate) struct CompileTurns {
    busy: Mutex<HashSet<String>>,
}

/// One tenant's turn; given back on drop.
#[derive(Debug)]
pub(crate) struct Turn {
    turns: Arc<CompileTurns>,
    tenant: String,
}

impl CompileTurns {
    fn busy(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.busy.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `tenant`'s turn, or `None` while it already has one.
    pub(crate) fn take(self: &Arc<Self>, tenant: &str) -> Option<Turn> {
        self.busy()
            .insert(tenant.to_owned())
            .then(|| Turn { turns: Arc::clone(self), tenant: tenant.to_owned() })
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.busy().remove(&self.tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_turn_per_tenant_until_it_is_dropped() {
        let turns = Arc::new(CompileTurns::default());
        let a = turns.take("a");
        assert!(a.is_some());
        assert!(turns.take("a").is_none(), "a second turn for the same tenant");
        assert!(turns.take("b").is_some(), "another tenant is not held up");
        drop(a);
        assert!(turns.take("a").is_some(), "the turn comes back on drop");
    }
}
