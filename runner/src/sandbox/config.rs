//! Sandbox settings: the engine-wide [`SandboxConfig`] and the per-task [`Limits`].
//!
//! Owns: the `DEFAULT_*` constants, [`SandboxConfig::validate`], and the pure
//! [`Limits::resolve`] that turns runner defaults + a module's [`LimitOverrides`] into the
//! limits one task runs under.
//!
//! Invariants:
//! - a validated config has `defaults <= maxima` field by field, every limit non-zero, and a
//!   memory maximum that fits a 32-bit linear memory (the pooling allocator is sized from it)
//!   and a timeout maximum of at most 24 h (deadline arithmetic can never overflow);
//! - [`Limits::resolve`] never returns a value above `maxima`, whatever the override says, so a
//!   module registration can tighten limits but never loosen them past the runner's caps.
//!
//! No environment reads here: the CLI parses flags/env once and fills these structs.

use std::time::Duration;

use super::compiler::CompilerKind;
use super::limits::CompileLimits;

/// Runner default: fuel units per task (roughly one unit per executed wasm operator).
pub const DEFAULT_FUEL: u64 = 2_000_000_000;
/// Runner default: wall-clock budget per task.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Runner default: linear-memory ceiling per task.
pub const DEFAULT_MEMORY_BYTES: u64 = 64 * 1024 * 1024;
/// Runner default: largest stdout (the JSON result) a task may produce.
pub const DEFAULT_OUTPUT_BYTES: usize = 1024 * 1024;

/// Hard cap on fuel, whatever a module asks for.
pub const MAX_FUEL: u64 = 200_000_000_000;
/// Hard cap on wall-clock time.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Hard cap on linear memory; also sizes each pooling-allocator memory slot.
pub const MAX_MEMORY_BYTES: u64 = 512 * 1024 * 1024;
/// Hard cap on stdout.
pub const MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

/// Default number of tasks that may run at once (= pooling allocator slots).
pub const DEFAULT_MAX_CONCURRENCY: u32 = 16;
/// Default period of the epoch ticker thread.
pub const DEFAULT_EPOCH_TICK: Duration = Duration::from_millis(10);

/// Largest memory a 32-bit wasm linear memory can address.
const WASM32_MEMORY_LIMIT: u64 = 4 * 1024 * 1024 * 1024;
const MIN_EPOCH_TICK: Duration = Duration::from_millis(1);
const MAX_EPOCH_TICK: Duration = Duration::from_secs(1);
const MAX_CONCURRENCY_LIMIT: u32 = 10_000;
/// Longest timeout a runner may allow at all (keeps deadline arithmetic far from overflow).
const TIMEOUT_LIMIT: Duration = Duration::from_secs(24 * 60 * 60);

/// Why a [`SandboxConfig`] or [`LimitOverrides`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A limit was zero.
    #[error("{field} must be greater than zero")]
    Zero {
        /// Which field.
        field: &'static str,
    },
    /// A default exceeds the corresponding maximum.
    #[error("default {field} ({default}) exceeds the maximum ({maximum})")]
    DefaultAboveMaximum {
        /// Which field.
        field: &'static str,
        /// The default, rendered.
        default: String,
        /// The maximum, rendered.
        maximum: String,
    },
    /// Two settings that cannot go together.
    #[error("{0}")]
    Conflict(&'static str),
    /// A value is outside the range this runner supports.
    #[error("{field} = {value} is outside the supported range {range}")]
    OutOfRange {
        /// Which field.
        field: &'static str,
        /// The value, rendered.
        value: String,
        /// The supported range, rendered.
        range: &'static str,
    },
}

/// Resource limits for one task run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Fuel units; running out stops the guest with `OutOfFuel`.
    pub fuel: u64,
    /// Wall-clock budget, instantiation included; exceeding it stops the guest with `Timeout`.
    pub timeout: Duration,
    /// Linear-memory ceiling in bytes; a `memory.grow` past it stops the guest with `MemoryLimit`.
    pub memory_bytes: u64,
    /// Stdout ceiling in bytes; a write past it stops the guest with `OutputTooLarge`.
    pub output_bytes: usize,
}

impl Limits {
    /// The runner's default limits.
    pub const DEFAULT: Limits = Limits {
        fuel: DEFAULT_FUEL,
        timeout: DEFAULT_TIMEOUT,
        memory_bytes: DEFAULT_MEMORY_BYTES,
        output_bytes: DEFAULT_OUTPUT_BYTES,
    };

    /// The runner's hard caps.
    pub const MAXIMA: Limits = Limits {
        fuel: MAX_FUEL,
        timeout: MAX_TIMEOUT,
        memory_bytes: MAX_MEMORY_BYTES,
        output_bytes: MAX_OUTPUT_BYTES,
    };

    /// The limits a task runs under: each field is the module's override if it has one, else
    /// the runner default, and in both cases no more than the runner maximum.
    pub fn resolve(defaults: &Limits, overrides: &LimitOverrides, maxima: &Limits) -> Limits {
        Limits {
            fuel: overrides.fuel.unwrap_or(defaults.fuel),
            timeout: overrides.timeout.unwrap_or(defaults.timeout),
            memory_bytes: overrides.memory_bytes.unwrap_or(defaults.memory_bytes),
            output_bytes: overrides.output_bytes.unwrap_or(defaults.output_bytes),
        }
        .capped_by(maxima)
    }

    /// Each field of `self`, lowered to `maxima` where it is above.
    pub fn capped_by(&self, maxima: &Limits) -> Limits {
        Limits {
            fuel: self.fuel.min(maxima.fuel),
            timeout: self.timeout.min(maxima.timeout),
            memory_bytes: self.memory_bytes.min(maxima.memory_bytes),
            output_bytes: self.output_bytes.min(maxima.output_bytes),
        }
    }

    fn check_nonzero(&self) -> Result<(), ConfigError> {
        let zero = |field| Err(ConfigError::Zero { field });
        if self.fuel == 0 {
            return zero("fuel");
        }
        if self.timeout.is_zero() {
            return zero("timeout");
        }
        if self.memory_bytes == 0 {
            return zero("memory_bytes");
        }
        if self.output_bytes == 0 {
            return zero("output_bytes");
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Per-module limit overrides, as stored with a module registration. `None` = runner default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitOverrides {
    /// Fuel override.
    pub fuel: Option<u64>,
    /// Timeout override.
    pub timeout: Option<Duration>,
    /// Memory override, bytes.
    pub memory_bytes: Option<u64>,
    /// Stdout override, bytes.
    pub output_bytes: Option<usize>,
}

impl LimitOverrides {
    /// Rejects zero-valued overrides (a zero limit would fail every run). Values above the
    /// runner maxima are accepted here and capped by [`Limits::resolve`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        let zero = |field| Err(ConfigError::Zero { field });
        match *self {
            LimitOverrides { fuel: Some(0), .. } => zero("fuel"),
            LimitOverrides { timeout: Some(t), .. } if t.is_zero() => zero("timeout"),
            LimitOverrides { memory_bytes: Some(0), .. } => zero("memory_bytes"),
            LimitOverrides { output_bytes: Some(0), .. } => zero("output_bytes"),
            _ => Ok(()),
        }
    }
}

/// Engine-wide sandbox settings, fixed for the life of a runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Try the pooling instance allocator first (falls back to on-demand if it can't be set up).
    pub pooling: bool,
    /// Tasks that may run at once; sizes the pool. Instantiations beyond it fail.
    pub max_concurrency: u32,
    /// Period of the epoch ticker: the granularity of timeouts and of yields to tokio.
    pub epoch_tick: Duration,
    /// Limits for modules that don't override them.
    pub defaults: Limits,
    /// Caps no override can exceed.
    pub maxima: Limits,
    /// What a module may be and cost to compile (structural limits, compile budget).
    pub compile: CompileLimits,
    /// Where modules are compiled.
    pub compiler: CompilerKind,
    /// Instantiate linear memories from a copy-on-write image of their initial contents
    /// (wasmtime's `memory_init_cow`): a big pre-initialized guest (CPython, SpiderMonkey) maps
    /// its image instead of copying it. Off only to measure what the image buys
    /// (`benches/benches/components.rs`).
    pub memory_images: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            pooling: true,
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            epoch_tick: DEFAULT_EPOCH_TICK,
            defaults: Limits::DEFAULT,
            maxima: Limits::MAXIMA,
            compile: CompileLimits::default(),
            compiler: CompilerKind::default(),
            memory_images: true,
        }
    }
}

impl SandboxConfig {
    /// Cross-checks the fields; see the module invariants.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_CONCURRENCY_LIMIT).contains(&self.max_concurrency) {
            return Err(ConfigError::OutOfRange {
                field: "max_concurrency",
                value: self.max_concurrency.to_string(),
                range: "1..=10000",
            });
        }
        if !(MIN_EPOCH_TICK..=MAX_EPOCH_TICK).contains(&self.epoch_tick) {
            return Err(ConfigError::OutOfRange {
                field: "epoch_tick",
                value: format!("{:?}", self.epoch_tick),
                range: "1ms..=1s",
            });
        }
        self.defaults.check_nonzero()?;
        self.maxima.check_nonzero()?;
        if let Some(field) = self.compile.zero_field() {
            return Err(ConfigError::Zero { field });
        }
        if self.maxima.timeout > TIMEOUT_LIMIT {
            return Err(ConfigError::OutOfRange {
                field: "maxima.timeout",
                value: format!("{:?}", self.maxima.timeout),
                range: "1ns..=24h",
            });
        }
        // The child compiles with wasmtime's defaults, images on; an engine without them
        // refuses its artifacts (wasmtime checks the setting when it loads one).
        if !self.memory_images && self.compiler != CompilerKind::InProcess {
            return Err(ConfigError::Conflict(
                "memory_images off needs the in-process compiler (the compile child's \
                 artifacts are made for memory images)",
            ));
        }
        if self.maxima.memory_bytes > WASM32_MEMORY_LIMIT {
            return Err(ConfigError::OutOfRange {
                field: "maxima.memory_bytes",
                value: self.maxima.memory_bytes.to_string(),
                range: "1..=4GiB",
            });
        }
        let (d, m) = (&self.defaults, &self.maxima);
        let above = |field, default: String, maximum: String| {
            Err(ConfigError::DefaultAboveMaximum { field, default, maximum })
        };
        if d.fuel > m.fuel {
            return above("fuel", d.fuel.to_string(), m.fuel.to_string());
        }
        if d.timeout > m.timeout {
            return above("timeout", format!("{:?}", d.timeout), format!("{:?}", m.timeout));
        }
        if d.memory_bytes > m.memory_bytes {
            return above("memory_bytes", d.memory_bytes.to_string(), m.memory_bytes.to_string());
        }
        if d.output_bytes > m.output_bytes {
            return above("output_bytes", d.output_bytes.to_string(), m.output_bytes.to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        assert_eq!(SandboxConfig::default().validate(), Ok(()));
    }

    #[test]
    fn resolve_uses_defaults_without_overrides() {
        let got = Limits::resolve(&Limits::DEFAULT, &LimitOverrides::default(), &Limits::MAXIMA);
        assert_eq!(got, Limits::DEFAULT);
    }

    #[test]
    fn resolve_prefers_overrides_below_maxima() {
        let o = LimitOverrides {
            fuel: Some(7),
            timeout: Some(Duration::from_secs(2)),
            memory_bytes: Some(1 << 20),
            output_bytes: Some(10),
        };
        let got = Limits::resolve(&Limits::DEFAULT, &o, &Limits::MAXIMA);
        assert_eq!(
            got,
            Limits {
                fuel: 7,
                timeout: Duration::from_secs(2),
                memory_bytes: 1 << 20,
                output_bytes: 10
            }
        );
    }

    #[test]
    fn resolve_caps_overrides_at_maxima() {
        let o = LimitOverrides {
            fuel: Some(u64::MAX),
            timeout: Some(Duration::from_secs(86_400)),
            memory_bytes: Some(u64::MAX),
            output_bytes: Some(usize::MAX),
        };
        assert_eq!(Limits::resolve(&Limits::DEFAULT, &o, &Limits::MAXIMA), Limits::MAXIMA);
    }

    #[test]
    fn resolve_caps_defaults_too() {
        let maxima = Limits { fuel: 1, ..Limits::MAXIMA };
        let got = Limits::resolve(&Limits::DEFAULT, &LimitOverrides::default(), &maxima);
        assert_eq!(got.fuel, 1);
    }

    #[test]
    fn memory_images_off_needs_the_in_process_compiler() {
        let child = CompilerKind::Child { program: "sweep".into() };
        let off = SandboxConfig { memory_images: false, ..SandboxConfig::default() };
        assert!(off.validate().is_ok());
        let cfg = SandboxConfig { compiler: child, ..off };
        assert!(matches!(cfg.validate(), Err(ConfigError::Conflict(_))));
    }

    #[test]
    fn validate_rejects_default_above_maximum() {
        let cfg = SandboxConfig {
            defaults: Limits { memory_bytes: MAX_MEMORY_BYTES + 1, ..Limits::DEFAULT },
            ..SandboxConfig::default()
        };
        assert!(matches!(
            cfg.validate(),
            Err(ConfigError::DefaultAboveMaximum { field: "memory_bytes", .. })
        ));
    }

    #[test]
    fn validate_rejects_bad_ranges_and_zeros() {
        let zero_conc = SandboxConfig { max_concurrency: 0, ..SandboxConfig::default() };
        assert!(matches!(zero_conc.validate(), Err(ConfigError::OutOfRange { .. })));
        let slow_tick =
            SandboxConfig { epoch_tick: Duration::from_secs(5), ..SandboxConfig::default() };
        assert!(slow_tick.validate().is_err());
        let zero_fuel = SandboxConfig {
            defaults: Limits { fuel: 0, ..Limits::DEFAULT },
            ..SandboxConfig::default()
        };
        assert_eq!(zero_fuel.validate(), Err(ConfigError::Zero { field: "fuel" }));
        let huge_memory = SandboxConfig {
            maxima: Limits { memory_bytes: 8 << 30, ..Limits::MAXIMA },
            ..SandboxConfig::default()
        };
        assert!(huge_memory.validate().is_err());
        let forever = SandboxConfig {
            maxima: Limits { timeout: Duration::MAX, ..Limits::MAXIMA },
            ..SandboxConfig::default()
        };
        assert!(forever.validate().is_err());
    }

    #[test]
    fn overrides_reject_zero() {
        assert_eq!(LimitOverrides::default().validate(), Ok(()));
        let o = LimitOverrides { timeout: Some(Duration::ZERO), ..LimitOverrides::default() };
        assert_eq!(o.validate(), Err(ConfigError::Zero { field: "timeout" }));
    }
}
