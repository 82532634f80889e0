//! What a module may cost to compile: the structural limits read with the parser before any
//! compile, and the compile's own CPU, memory and wall-clock budget, which grows with the
//! module's code.
//!
//! Owns: [`CompileLimits`] (operator settings, `DEFAULT_*`), [`Structure`] (what the parser
//! counted), [`CompileBudget`] (what one compile may use), [`LimitExceeded`] (which limit,
//! what value) and [`check_structure`].
//!
//! Why: compile cost grows with the code far more than with the byte size of a module, and
//! how fast depends on its shape. Ordinary code, a language runtime included, costs the
//! compile child about 3 s of CPU per MiB of code (a componentize-py component: 6.3 MiB of
//! code in 13,572 functions, 18.5 s); the costliest shapes (long straight-line functions,
//! tens of thousands of tiny ones, one 512 KiB function) cost 7 to 11 s per MiB
//! (docs/architecture.md, "The budget"). So a module gets a base budget plus an allowance
//! per MiB of code (`cpu_per_code_mib`, above what ordinary code needs, below what the costly
//! shapes need): a real runtime of tens of MiB fits, a hostile module outgrows its budget
//! past 1 to 2 MiB whatever its size, and the caps (`max_cpu`, `max_memory_bytes`) bound
//! every compile. The structural limits are cheap (one pass of the parser, no validation, no
//! compile) and refuse the pathological shapes (a function body over `max_function_bytes`,
//! more locals than `max_locals`) before a compiler starts.
//!
//! Invariants:
//! - [`check_structure`] never compiles and never allocates in proportion to a function body;
//!   a module that does not parse passes it (the compile then names what is wrong), with
//!   what was counted before the parser stopped;
//! - [`CompileLimits::budget_for`] never exceeds the caps and never falls below the base;
//! - every refusal names the limit and the module's value, in the units of the setting.

use std::fmt;
use std::time::Duration;

/// Default: most functions a module may define. A componentize-py component (CPython inside)
/// defines 13,572; the many-tiny-functions bomb is bounded by the CPU budget, which a few
/// MiB of code does not raise far.
pub const DEFAULT_MAX_FUNCTIONS: u32 = 100_000;
/// Default: most bytes of function bodies (the code section, all core modules of a component
/// together) in a module: the code of any module the default upload limit (64 MiB) admits.
pub const DEFAULT_MAX_CODE_BYTES: u64 = 48 << 20;
/// Default: most bytes in one function body. The cost per byte, and the compile's memory,
/// grow with a function's size (four 200 KiB functions took 12 s and 650 MiB); CPython's
/// interpreter loop (`_PyEval_EvalFrameDefault`) is one function of 417 KiB.
pub const DEFAULT_MAX_FUNCTION_BYTES: u64 = 512 * 1024;
/// Default: most locals one function may declare (CPython's most: 271).
pub const DEFAULT_MAX_LOCALS: u32 = 10_000;
/// Default: CPU time any compile may use (all its threads together), before the allowance
/// for its code (a Rust guest of a few hundred KiB of code needs 1 to 2 s).
pub const DEFAULT_COMPILE_CPU: Duration = Duration::from_secs(5);
/// Default: CPU time added to a compile's budget per MiB of code. Ordinary code needs about
/// 3 s per MiB (fuel and epoch checks included); the costly shapes 7 to 11 s, so they
/// outgrow their budget past 1 to 2 MiB.
pub const DEFAULT_COMPILE_CPU_PER_CODE_MIB: Duration = Duration::from_secs(4);
/// Default: most CPU time one compile may use, whatever its code.
pub const DEFAULT_MAX_COMPILE_CPU: Duration = Duration::from_secs(180);
/// Default: address space any compile may map, before the allowance for its code.
pub const DEFAULT_COMPILE_MEMORY_BYTES: u64 = 1024 * 1024 * 1024;
/// Default: address space added to a compile's budget per MiB of code (the compiled code,
/// its metadata and the artifact grow with it).
pub const DEFAULT_COMPILE_MEMORY_PER_CODE_MIB: u64 = 64 << 20;
/// Default: most address space one compile may map, whatever its code.
pub const DEFAULT_MAX_COMPILE_MEMORY_BYTES: u64 = 4 << 30;
/// Default: wall-clock time after which a compile is killed, for a compile of the base CPU
/// budget; it grows in proportion with the CPU budget.
pub const DEFAULT_COMPILE_WALL: Duration = Duration::from_secs(60);
/// Default: compiles that run at once in one process; more wait their turn.
pub const DEFAULT_MAX_CONCURRENT_COMPILES: usize = 2;

const MIB: u64 = 1 << 20;

/// Limits on what a module may be and cost to compile. Set by the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileLimits {
    /// Most functions a module may define (imports not counted).
    pub max_functions: u32,
    /// Most bytes of function bodies in a module.
    pub max_code_bytes: u64,
    /// Most bytes in one function body.
    pub max_function_bytes: u64,
    /// Most locals one function may declare (parameters not counted).
    pub max_locals: u32,
    /// CPU time any compile may use, all threads together (`RLIMIT_CPU` of the compiler),
    /// before the allowance for its code.
    pub cpu: Duration,
    /// CPU time added per MiB of code (zero: every compile gets `cpu`).
    pub cpu_per_code_mib: Duration,
    /// Most CPU time one compile may use, whatever its code.
    pub max_cpu: Duration,
    /// Address space any compile may map (`RLIMIT_AS` of the compiler), before the
    /// allowance for its code.
    pub memory_bytes: u64,
    /// Address space added per MiB of code (zero: every compile gets `memory_bytes`).
    pub memory_per_code_mib: u64,
    /// Most address space one compile may map, whatever its code.
    pub max_memory_bytes: u64,
    /// Wall-clock time after which a compiler of the base CPU budget is killed (it runs at a
    /// lower priority, so a busy host may stretch its CPU budget over longer than that
    /// budget); it grows in proportion with the compile's CPU budget.
    pub wall: Duration,
    /// Compiles that run at once in one process.
    pub max_concurrent: usize,
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits {
            max_functions: DEFAULT_MAX_FUNCTIONS,
            max_code_bytes: DEFAULT_MAX_CODE_BYTES,
            max_function_bytes: DEFAULT_MAX_FUNCTION_BYTES,
            max_locals: DEFAULT_MAX_LOCALS,
            cpu: DEFAULT_COMPILE_CPU,
            cpu_per_code_mib: DEFAULT_COMPILE_CPU_PER_CODE_MIB,
            max_cpu: DEFAULT_MAX_COMPILE_CPU,
            memory_bytes: DEFAULT_COMPILE_MEMORY_BYTES,
            memory_per_code_mib: DEFAULT_COMPILE_MEMORY_PER_CODE_MIB,
            max_memory_bytes: DEFAULT_MAX_COMPILE_MEMORY_BYTES,
            wall: DEFAULT_COMPILE_WALL,
            max_concurrent: DEFAULT_MAX_CONCURRENT_COMPILES,
        }
    }
}

impl CompileLimits {
    /// What compiling a module with `code_bytes` of code may use: the base budget plus the
    /// allowance for its code, within the caps; the wall bound grows with the CPU budget.
    pub fn budget_for(&self, code_bytes: u64) -> CompileBudget {
        // Clamped: Duration::mul_f64 panics on overflow (the caps apply below anyway).
        let mib = (code_bytes as f64 / MIB as f64).min(1e6);
        let extra_cpu = self.cpu_per_code_mib.mul_f64(mib);
        // Whole seconds: RLIMIT_CPU counts them, and the refusal names them.
        let cpu = self.cpu.saturating_add(extra_cpu).min(self.max_cpu.max(self.cpu));
        let cpu = Duration::from_secs(cpu.as_secs() + u64::from(cpu.subsec_nanos() > 0));
        let extra_memory = (self.memory_per_code_mib as f64 * mib) as u64;
        let memory_bytes = self
            .memory_bytes
            .saturating_add(extra_memory)
            .min(self.max_memory_bytes.max(self.memory_bytes));
        let scale = cpu.as_secs_f64() / self.cpu.as_secs_f64().max(1.0);
        let wall = self.wall.mul_f64(scale.max(1.0));
        CompileBudget { cpu, memory_bytes, wall }
    }

    /// The longest wall-clock time any one compile may take before its child is killed: the
    /// wall bound of the largest CPU budget.
    pub fn longest_compile(&self) -> Duration {
        self.budget_for(u64::MAX).wall
    }

    /// The first field that is zero, if any (every limit must allow something).
    pub(crate) fn zero_field(&self) -> Option<&'static str> {
        [
            ("compile.max_functions", self.max_functions == 0),
            ("compile.max_code_bytes", self.max_code_bytes == 0),
            ("compile.max_function_bytes", self.max_function_bytes == 0),
            ("compile.max_locals", self.max_locals == 0),
            ("compile.cpu", self.cpu.as_secs() == 0),
            ("compile.max_cpu", self.max_cpu.as_secs() == 0),
            ("compile.memory_bytes", self.memory_bytes == 0),
            ("compile.max_memory_bytes", self.max_memory_bytes == 0),
            ("compile.wall", self.wall.is_zero()),
            ("compile.max_concurrent", self.max_concurrent == 0),
        ]
        .into_iter()
        .find_map(|(field, zero)| zero.then_some(field))
    }
}

/// What one compile may use, from [`CompileLimits::budget_for`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileBudget {
    /// CPU time, all threads together, in whole seconds.
    pub cpu: Duration,
    /// Address space in bytes.
    pub memory_bytes: u64,
    /// Wall-clock time.
    pub wall: Duration,
}

/// What [`check_structure`] counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Structure {
    /// Functions defined (all core modules of a component together).
    pub functions: u64,
    /// Bytes of function bodies (code sections).
    pub code_bytes: u64,
    /// Bytes of the largest function body.
    pub largest_function_bytes: u64,
}

/// The limit a module went over.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitExceeded {
    /// More functions than `max_functions`.
    Functions {
        /// Functions the module defines.
        count: u64,
        /// The limit.
        limit: u32,
    },
    /// A code section larger than `max_code_bytes`.
    CodeBytes {
        /// Bytes of its code section.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// A function body larger than `max_function_bytes`.
    FunctionBytes {
        /// Index of the function among those the module defines.
        index: u32,
        /// Bytes of its body.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// A function with more locals than `max_locals`.
    Locals {
        /// Index of the function among those the module defines.
        index: u32,
        /// Locals it declares.
        count: u64,
        /// The limit.
        limit: u32,
    },
    /// The compile used more CPU time than its budget.
    CompileTime {
        /// The budget.
        limit: Duration,
    },
    /// The compile needed more memory than its budget.
    CompileMemory {
        /// The budget in bytes.
        limit: u64,
    },
    /// The compile ran longer than its wall-clock bound.
    CompileWall {
        /// The bound.
        limit: Duration,
    },
}

impl LimitExceeded {
    /// The name of the limit, as the flag that sets it says it.
    pub fn limit_name(&self) -> &'static str {
        match self {
            LimitExceeded::Functions { .. } => "max_functions",
            LimitExceeded::CodeBytes { .. } => "max_code_bytes",
            LimitExceeded::FunctionBytes { .. } => "max_function_bytes",
            LimitExceeded::Locals { .. } => "max_locals",
            LimitExceeded::CompileTime { .. } => "compile_cpu",
            LimitExceeded::CompileMemory { .. } => "compile_memory",
            LimitExceeded::CompileWall { .. } => "compile_wall",
        }
    }
}

impl fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.limit_name();
        match self {
            LimitExceeded::Functions { count, limit } => {
                write!(f, "module defines {count} functions; the limit ({name}) is {limit}")
            }
            LimitExceeded::CodeBytes { size, limit } => {
                write!(f, "module has {size} bytes of code; the limit ({name}) is {limit}")
            }
            LimitExceeded::FunctionBytes { index, size, limit } => write!(
                f,
                "function {index} has a body of {size} bytes; the limit ({name}) is {limit}"
            ),
            LimitExceeded::Locals { index, count, limit } => {
                write!(f, "function {index} declares {count} locals; the limit ({name}) is {limit}")
            }
            LimitExceeded::CompileTime { limit } => write!(
                f,
                "compiling the module used more than its CPU time budget ({name}) of {} s",
                limit.as_secs()
            ),
            LimitExceeded::CompileMemory { limit } => write!(
                f,
                "compiling the module needed more than its memory budget ({name}) of {} MiB",
                limit >> 20
            ),
            LimitExceeded::CompileWall { limit } => write!(
                f,
                "compiling the module took longer than its wall-clock bound ({name}) of {} s",
                limit.as_secs()
            ),
        }
    }
}

impl std::error::Error for LimitExceeded {}

/// Refuses a module over one of the structural limits in `limits`, reading only section
/// headers and function-body prefixes (sizes, local declarations); says what it counted.
pub fn check_structure(bytes: &[u8], limits: &CompileLimits) -> Result<Structure, LimitExceeded> {
    let mut index: u32 = 0;
    // A component holds several core modules: the limits apply to all of them together.
    let mut seen = Structure::default();
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { return Ok(seen) };
        match payload {
            wasmparser::Payload::CodeSectionStart { count, size, .. } => {
                seen.functions = seen.functions.saturating_add(u64::from(count));
                seen.code_bytes = seen.code_bytes.saturating_add(u64::from(size));
                if seen.functions > u64::from(limits.max_functions) {
                    let (count, limit) = (seen.functions, limits.max_functions);
                    return Err(LimitExceeded::Functions { count, limit });
                }
                if seen.code_bytes > limits.max_code_bytes {
                    let (size, limit) = (seen.code_bytes, limits.max_code_bytes);
                    return Err(LimitExceeded::CodeBytes { size, limit });
                }
            }
            wasmparser::Payload::CodeSectionEntry(body) => {
                let size = body.range().len() as u64;
                seen.largest_function_bytes = seen.largest_function_bytes.max(size);
                if size > limits.max_function_bytes {
                    let limit = limits.max_function_bytes;
                    return Err(LimitExceeded::FunctionBytes { index, size, limit });
                }
                let Ok(locals) = body.get_locals_reader() else { return Ok(seen) };
                let mut count: u64 = 0;
                for local in locals {
                    let Ok((n, _ty)) = local else { return Ok(seen) };
                    count = count.saturating_add(u64::from(n));
                    if count > u64::from(limits.max_locals) {
                        let limit = limits.max_locals;
                        return Err(LimitExceeded::Locals { index, count, limit });
                    }
                }
                index = index.saturating_add(1);
            }
            _ => {}
        }
    }
    Ok(seen)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn functions(n: usize, body: &str) -> Vec<u8> {
        let mut wat = String::from("(module");
        for _ in 0..n {
            wat.push_str(&format!(" (func {body})"));
        }
        wat.push(')');
        wat::parse_str(&wat).unwrap()
    }

    #[test]
    fn each_structural_limit_is_named_with_the_value() {
        let limits = CompileLimits { max_functions: 3, ..CompileLimits::default() };
        let three = check_structure(&functions(3, ""), &limits).unwrap();
        assert_eq!(
            (three.functions, three.largest_function_bytes),
            (3, 2),
            "an empty body: no locals, end"
        );
        let e = check_structure(&functions(4, ""), &limits).unwrap_err();
        assert_eq!(e, LimitExceeded::Functions { count: 4, limit: 3 });
        assert_eq!(e.to_string(), "module defines 4 functions; the limit (max_functions) is 3");

        let limits = CompileLimits { max_code_bytes: 10, ..CompileLimits::default() };
        let e = check_structure(&functions(5, "nop nop"), &limits).unwrap_err();
        assert!(matches!(e, LimitExceeded::CodeBytes { limit: 10, .. }), "{e}");

        let limits = CompileLimits { max_function_bytes: 8, ..CompileLimits::default() };
        let big = wat::parse_str("(module (func) (func nop nop nop nop nop nop nop nop))").unwrap();
        let e = check_structure(&big, &limits).unwrap_err();
        assert_eq!(e, LimitExceeded::FunctionBytes { index: 1, size: 10, limit: 8 });

        let limits = CompileLimits { max_locals: 4, ..CompileLimits::default() };
        let locals =
            wat::parse_str("(module (func (param i32 i32 i32 i32 i32) (local i32 i64 i32 f32)) (func (local i32 i32) (local i64 i64 i64)))")
                .unwrap();
        let e = check_structure(&locals, &limits).unwrap_err();
        assert_eq!(e, LimitExceeded::Locals { index: 1, count: 5, limit: 4 });
        assert_eq!(e.to_string(), "function 1 declares 5 locals; the limit (max_locals) is 4");
    }

    #[test]
    fn what_does_not_parse_is_left_to_the_compile() {
        let none = Structure::default();
        assert_eq!(check_structure(b"nope", &CompileLimits::default()), Ok(none));
        assert_eq!(
            check_structure(b"\0asm\x01\0\0\0\x0a\xff", &CompileLimits::default()),
            Ok(none)
        );
    }

    #[test]
    fn the_budget_grows_with_code_within_the_caps() {
        let limits = CompileLimits::default();
        let base = limits.budget_for(0);
        assert_eq!(base.cpu, DEFAULT_COMPILE_CPU);
        assert_eq!(base.memory_bytes, DEFAULT_COMPILE_MEMORY_BYTES);
        assert_eq!(base.wall, DEFAULT_COMPILE_WALL);
        // A componentize-py component's code: 6.3 MiB (it needs ~18.5 s of CPU).
        let python = limits.budget_for(6_594_468);
        assert_eq!(python.cpu, Duration::from_secs(31));
        assert_eq!(python.memory_bytes >> 20, 1024 + 402);
        assert_eq!(python.wall, Duration::from_secs(372));
        // Half a MiB: whole seconds, rounded up.
        assert_eq!(limits.budget_for(MIB / 2 + 1).cpu, Duration::from_secs(8));
        let most = limits.budget_for(u64::MAX);
        assert_eq!(most.cpu, DEFAULT_MAX_COMPILE_CPU);
        assert_eq!(most.memory_bytes, DEFAULT_MAX_COMPILE_MEMORY_BYTES);
        assert_eq!(most.wall, Duration::from_secs(2160));
        // Without an allowance per MiB, every compile gets the base.
        let flat = CompileLimits {
            cpu_per_code_mib: Duration::ZERO,
            memory_per_code_mib: 0,
            ..CompileLimits::default()
        };
        assert_eq!(flat.budget_for(40 * MIB), base);
    }
}
