//! What a module may cost to compile: the structural limits read with the parser before any
//! compile, and the compile's own CPU, memory and wall-clock budget.
//!
//! Owns: [`CompileLimits`] (operator settings, `DEFAULT_*`), [`LimitExceeded`] (which limit,
//! what value) and [`check_structure`].
//!
//! Why: compile time grows with the number of functions and the code size far more than with
//! the byte size of a module (a 1.6 MB module of tiny functions took 16 s of two cores), so
//! the byte limit alone admits modules that starve a runner. The structural limits are cheap
//! (one pass of the parser, no validation, no compile) and refuse the obvious bombs before a
//! compiler starts; the budget bounds whatever gets past them.
//!
//! Invariants:
//! - [`check_structure`] never compiles and never allocates in proportion to a function body;
//!   a module that does not parse passes it (the compile then names what is wrong);
//! - every refusal names the limit and the module's value, in the units of the setting.

use std::fmt;
use std::time::Duration;

/// Default: most functions a module may define.
pub const DEFAULT_MAX_FUNCTIONS: u32 = 20_000;
/// Default: most bytes of function bodies (the code section) in a module. Measured (see
/// `sweep-bench compile`): straight-line code costs cranelift up to ~10 µs of CPU per byte,
/// so this keeps the costliest admitted module under the default CPU budget.
pub const DEFAULT_MAX_CODE_BYTES: u64 = 768 * 1024;
/// Default: most bytes in one function body (the cost per byte, and the compile's memory,
/// grow with a function's size: four 200 KiB functions took 12 s and 650 MiB).
pub const DEFAULT_MAX_FUNCTION_BYTES: u64 = 64 * 1024;
/// Default: most locals one function may declare.
pub const DEFAULT_MAX_LOCALS: u32 = 10_000;
/// Default: CPU time one compile may use (all its threads together).
pub const DEFAULT_COMPILE_CPU: Duration = Duration::from_secs(10);
/// Default: address space one compile may map.
pub const DEFAULT_COMPILE_MEMORY_BYTES: u64 = 1024 * 1024 * 1024;
/// Default: wall-clock time after which a compile is killed.
pub const DEFAULT_COMPILE_WALL: Duration = Duration::from_secs(60);
/// Default: compiles that run at once in one process; more wait their turn.
pub const DEFAULT_MAX_CONCURRENT_COMPILES: usize = 2;

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
    /// CPU time one compile may use, all threads together (`RLIMIT_CPU` of the compiler).
    pub cpu: Duration,
    /// Address space one compile may map (`RLIMIT_AS` of the compiler).
    pub memory_bytes: u64,
    /// Wall-clock time after which a compiler is killed (it runs at a lower priority, so a
    /// busy host may stretch its CPU budget over longer than that budget).
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
            memory_bytes: DEFAULT_COMPILE_MEMORY_BYTES,
            wall: DEFAULT_COMPILE_WALL,
            max_concurrent: DEFAULT_MAX_CONCURRENT_COMPILES,
        }
    }
}

impl CompileLimits {
    /// The first field that is zero, if any (every limit must allow something).
    pub(crate) fn zero_field(&self) -> Option<&'static str> {
        [
            ("compile.max_functions", self.max_functions == 0),
            ("compile.max_code_bytes", self.max_code_bytes == 0),
            ("compile.max_function_bytes", self.max_function_bytes == 0),
            ("compile.max_locals", self.max_locals == 0),
            ("compile.cpu", self.cpu.as_secs() == 0),
            ("compile.memory_bytes", self.memory_bytes == 0),
            ("compile.wall", self.wall.is_zero()),
            ("compile.max_concurrent", self.max_concurrent == 0),
        ]
        .into_iter()
        .find_map(|(field, zero)| zero.then_some(field))
    }
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
/// headers and function-body prefixes (sizes, local declarations).
pub fn check_structure(bytes: &[u8], limits: &CompileLimits) -> Result<(), LimitExceeded> {
    let mut index: u32 = 0;
    // A component holds several core modules: the limits apply to all of them together.
    let (mut functions, mut code_bytes) = (0u64, 0u64);
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { return Ok(()) };
        match payload {
            wasmparser::Payload::CodeSectionStart { count, size, .. } => {
                functions = functions.saturating_add(u64::from(count));
                code_bytes = code_bytes.saturating_add(u64::from(size));
                if functions > u64::from(limits.max_functions) {
                    let (count, limit) = (functions, limits.max_functions);
                    return Err(LimitExceeded::Functions { count, limit });
                }
                if code_bytes > limits.max_code_bytes {
                    let (size, limit) = (code_bytes, limits.max_code_bytes);
                    return Err(LimitExceeded::CodeBytes { size, limit });
                }
            }
            wasmparser::Payload::CodeSectionEntry(body) => {
                let size = body.range().len() as u64;
                if size > limits.max_function_bytes {
                    let limit = limits.max_function_bytes;
                    return Err(LimitExceeded::FunctionBytes { index, size, limit });
                }
                let Ok(locals) = body.get_locals_reader() else { return Ok(()) };
                let mut count: u64 = 0;
                for local in locals {
                    let Ok((n, _ty)) = local else { return Ok(()) };
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
    Ok(())
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
        assert_eq!(check_structure(&functions(3, ""), &limits), Ok(()));
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
        assert_eq!(check_structure(b"nope", &CompileLimits::default()), Ok(()));
        assert_eq!(check_structure(b"\0asm\x01\0\0\0\x0a\xff", &CompileLimits::default()), Ok(()));
    }
}
