//! Handlers: validation against the guest contract, and the compiled, link-ready form, for
//! preview-1 modules and WASI 0.2 components alike.
//!
//! Owns: [`ValidationError`], [`HandlerKind`], [`ModuleInfo`], [`CompiledModule`] and
//! [`prepare`], the one path from bytes to a runnable handler (used by upload validation and
//! by the runner alike, so an accepted upload is exactly a handler the runner can run).
//!
//! Invariants:
//! - only binary wasm is accepted (no text format); the binary's header says which kind it
//!   is ([`HandlerKind`]): a core module or a component;
//! - a module: every import is from `wasi_snapshot_preview1` and resolves against the
//!   runner's WASI linker; a rejected import is named (module and field); `_start` is
//!   exported as a `() -> ()` function, and a module that imports WASI exports its `memory`
//!   (WASI calls trap without it);
//! - a component: it exports `wasi:cli/run` (0.2.x; else [`ValidationError::MissingRunExport`]
//!   lists what it does export) and every import resolves against the component linker
//!   (WASI 0.2 and `wasi:http`); it is kept as a `CommandPre`, instantiated per task;
//! - a module whose declared initial memory is above the memory limit it would run with is
//!   refused in those terms, before compiling (the pooling allocator would refuse it in its
//!   own words, the on-demand one only when a task runs);
//! - a module over a structural limit is refused before compiling, and the compile itself
//!   goes through the sandbox's `Compiler` (child process and budget, see `compiler`);
//! - a [`CompiledModule`]'s `sha256` is the hex SHA-256 of the exact bytes it was built from;
//! - [`CompiledModule::resident_bytes`] (what the module cache weighs it by) is its compiled
//!   image, rounded up to whole pages, plus its measured overhead ([`ENTRY_OVERHEAD_BYTES`]
//!   and a [`IMAGE_OVERHEAD_DIVISOR`]-th of the image).

use std::fmt;

use sha2::{Digest, Sha256};
use wasmtime::component::{self, Component};
use wasmtime::{ExternType, Linker, Module, ModuleExport, UnknownImportError};
use wasmtime_wasi::p2::bindings::CommandPre;

use super::compiler::{Compiled, Compiler};
use super::component::{check_exports, ComponentState};
use super::limits::LimitExceeded;
use super::store::StoreState;
use super::BoxError;

/// The only import namespace a handler may use.
pub const WASI_MODULE: &str = "wasi_snapshot_preview1";
/// The entry point of a WASI command.
pub const START_EXPORT: &str = "_start";
/// The memory WASI reads and writes through.
pub const MEMORY_EXPORT: &str = "memory";

const WASM_MAGIC: [u8; 4] = *b"\0asm";

/// Why a module was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// Not a WebAssembly binary at all.
    #[error("not a WebAssembly binary (missing the \\0asm header)")]
    NotWasm,
    /// A WebAssembly binary of a version that is neither a core module nor a component.
    #[error("neither a core WebAssembly module nor a component (unknown binary version)")]
    NotCoreModule,
    /// A component that does not export `wasi:cli/run`: not a WASI command.
    #[error(
        "component does not export `wasi:cli/run` (a WASI 0.2 command, such as a `main` built for wasm32-wasip2); it exports: {}",
        if exports.is_empty() { "nothing".to_owned() } else { exports.join(", ") }
    )]
    MissingRunExport {
        /// What it exports instead.
        exports: Vec<String>,
    },
    /// A component import the runner does not provide (or with another type).
    #[error("component cannot be linked against WASI 0.2 and wasi:http")]
    ComponentLink(#[source] BoxError),
    /// Malformed or uses a disabled feature.
    #[error("module failed to compile")]
    Compile(#[source] BoxError),
    /// No `_start` function: not a WASI command.
    #[error("module does not export a `_start` function (is it a WASI command built for wasm32-wasip1?)")]
    MissingStart,
    /// `_start` exists but has the wrong type.
    #[error("`_start` must have type () -> (), found {found}")]
    BadStartSignature {
        /// The actual type, rendered.
        found: String,
    },
    /// Imports WASI but exports no `memory`: every WASI call would trap.
    #[error("module imports WASI functions but does not export its linear memory as `memory`")]
    MissingMemoryExport,
    /// Import from a namespace other than `wasi_snapshot_preview1`.
    #[error("forbidden import `{module}::{name}`: handlers may only import from `wasi_snapshot_preview1`")]
    ForbiddenImport {
        /// Import module.
        module: String,
        /// Import field.
        name: String,
    },
    /// A `wasi_snapshot_preview1` import the runner does not provide.
    #[error("unknown WASI import `{module}::{name}`")]
    UnknownImport {
        /// Import module.
        module: String,
        /// Import field.
        name: String,
    },
    /// Its memory starts larger than the limit it would run with: no task could instantiate it.
    #[error("module needs {} at start; its limit is {}", mib(*needs_bytes), mib(*limit_bytes))]
    MemoryTooLarge {
        /// The declared initial size of its memories, in bytes.
        needs_bytes: u64,
        /// The memory limit the module would run with, in bytes.
        limit_bytes: u64,
    },
    /// Imports resolve by name but don't link (e.g. wrong function type).
    #[error("module cannot be linked against WASI preview 1")]
    Link(#[source] BoxError),
    /// Over a structural limit or the compile budget.
    #[error(transparent)]
    LimitExceeded(#[from] LimitExceeded),
    /// The compiler itself failed (could not start, or ended in a way no module explains):
    /// the runner's fault, not the module's.
    #[error("the module compiler failed: {reason}")]
    CompilerFailed {
        /// What went wrong.
        reason: String,
    },
}

/// Which kind of WebAssembly a handler is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerKind {
    /// A core module: a WASI preview-1 command (`wasm32-wasip1`).
    Module,
    /// A component: a WASI 0.2 command (`wasm32-wasip2`).
    Component,
}

impl HandlerKind {
    /// `module` or `component`, as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            HandlerKind::Module => "module",
            HandlerKind::Component => "component",
        }
    }

    /// The kind `bytes` are, from the binary's header; `None` for bytes that are not
    /// WebAssembly at all.
    pub fn of(bytes: &[u8]) -> Option<Result<HandlerKind, ValidationError>> {
        if bytes.get(..4) != Some(&WASM_MAGIC[..]) {
            return None;
        }
        Some(if wasmparser::Parser::is_core_wasm(bytes) {
            Ok(HandlerKind::Module)
        } else if wasmparser::Parser::is_component(bytes) {
            Ok(HandlerKind::Component)
        } else {
            Err(ValidationError::NotCoreModule)
        })
    }
}

/// Facts about a validated handler, for the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Hex SHA-256 of the module bytes.
    pub sha256: String,
    /// Size of the module bytes.
    pub size_bytes: usize,
    /// Module or component.
    pub kind: HandlerKind,
    /// What it imports, in import order: a module's WASI functions (`fd_write`), a
    /// component's interfaces (`wasi:cli/stdin@0.2.6`).
    pub wasi_imports: Vec<String>,
}

/// A compiled handler, linked and ready to instantiate once per task. Cheap to clone (the
/// compiled code is shared).
#[derive(Clone)]
pub struct CompiledModule {
    pub(crate) handler: Handler,
    info: ModuleInfo,
    /// Length of the compiled image (code, data, metadata) wasmtime keeps for it.
    image_bytes: usize,
}

/// The link-ready form of each kind.
#[derive(Clone)]
pub(crate) enum Handler {
    /// A preview-1 module and its `_start`.
    Module { pre: wasmtime::InstancePre<StoreState>, start: ModuleExport },
    /// A component whose `wasi:cli/run` is looked up.
    Component(CommandPre<ComponentState>),
}

/// What one compiled module costs a runner beyond its compiled image: wasmtime's module and
/// instance-pre state, the linker definitions it resolved, the cache entry. Measured, not
/// guessed, by `sweep-bench module-footprint` (distinct copies compiled into the cache and
/// held; growth of the resident set per module, less the image in whole pages): about 4.7 KB
/// plus 4.1% of the image. Tiny modules (16 KiB of image pages): 4,468 to 5,320 bytes over
/// 1,000 to 10,000 modules; modules/noop (299,008): 16,818; modules/wordcount (454,656):
/// 23,142. Weighed as this constant plus [`IMAGE_OVERHEAD_DIVISOR`]-th of the image, which
/// covers each measurement (see docs/architecture.md, "Bounded memory").
pub const ENTRY_OVERHEAD_BYTES: usize = 6 * 1024;

/// The part of the per-entry overhead that grows with the module: one byte per this many
/// bytes of image pages (4.2%; measured 4.1%, see [`ENTRY_OVERHEAD_BYTES`]).
pub const IMAGE_OVERHEAD_DIVISOR: usize = 24;

/// The page size images are mapped in.
const PAGE_BYTES: usize = 4096;

impl CompiledModule {
    /// Hex SHA-256 of the bytes this was compiled from (the module cache key).
    pub fn sha256(&self) -> &str {
        &self.info.sha256
    }

    /// What validation learned about the module.
    pub fn info(&self) -> &ModuleInfo {
        &self.info
    }

    /// Module or component.
    pub fn kind(&self) -> HandlerKind {
        self.info.kind
    }

    /// Length of its compiled image in bytes (`wasmtime::Module::image_range`).
    pub fn image_bytes(&self) -> usize {
        self.image_bytes
    }

    /// The memory this compiled module keeps resident, as the module cache weighs it: its
    /// image in whole pages, plus [`ENTRY_OVERHEAD_BYTES`] and a [`IMAGE_OVERHEAD_DIVISOR`]-th
    /// of those pages.
    pub fn resident_bytes(&self) -> usize {
        let pages = self.image_bytes.div_ceil(PAGE_BYTES).saturating_mul(PAGE_BYTES);
        pages + pages / IMAGE_OVERHEAD_DIVISOR + ENTRY_OVERHEAD_BYTES
    }
}

impl fmt::Debug for CompiledModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledModule").field("info", &self.info).finish_non_exhaustive()
    }
}

/// `bytes` in MiB as people write it: whole when whole, else with two decimals.
fn mib(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{:.2} MiB", bytes as f64 / MIB as f64)
    }
}

/// The initial size in bytes of the largest memory `bytes` defines (a module has one; each
/// core module inside a component may have one, and the limit applies to each), read from
/// the memory sections without compiling. `None` when the binary does not parse that far:
/// the compile then names what is wrong.
fn initial_memory_bytes(bytes: &[u8]) -> Option<u64> {
    let component = wasmparser::Parser::is_component(bytes);
    let mut largest: u64 = 0;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.ok()? {
            wasmparser::Payload::MemorySection(memories) => {
                let mut total: u64 = 0;
                for memory in memories {
                    let memory = memory.ok()?;
                    let size = memory.initial.saturating_mul(u64::from(memory.page_size()));
                    total = total.saturating_add(size);
                }
                largest = largest.max(total);
                if !component {
                    return Some(largest);
                }
            }
            // Sections come in order: past these, a module has no memory section to come.
            wasmparser::Payload::CodeSectionStart { .. } | wasmparser::Payload::End(_)
                if !component =>
            {
                return Some(largest)
            }
            _ => {}
        }
    }
    Some(largest)
}

/// Refuses a module (or component) whose memory starts above `limit_bytes`.
pub(crate) fn check_initial_memory(bytes: &[u8], limit_bytes: u64) -> Result<(), ValidationError> {
    match initial_memory_bytes(bytes) {
        Some(needs_bytes) if needs_bytes > limit_bytes => {
            Err(ValidationError::MemoryTooLarge { needs_bytes, limit_bytes })
        }
        _ => Ok(()),
    }
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Validates `bytes` against the guest contract and compiles it with `compiler` (structural
/// limits first). CPU-heavy or blocking (a full compile): call it from a blocking context.
/// With the handler comes the artifact the compile child wrote, if it ran in one.
pub(crate) fn prepare(
    linker: &Linker<StoreState>,
    component_linker: &component::Linker<ComponentState>,
    compiler: &Compiler,
    bytes: &[u8],
) -> Result<(CompiledModule, Option<Vec<u8>>), ValidationError> {
    HandlerKind::of(bytes).ok_or(ValidationError::NotWasm)??;
    let (compiled, artifact) = compiler.compile(linker.engine(), bytes)?;
    let module = link(linker, component_linker, compiled, sha256_hex(bytes), bytes.len())?;
    Ok((module, artifact))
}

/// Checks a compiled handler against the guest contract and links it: the module built from
/// `size_bytes` bytes whose hex SHA-256 is `sha256`.
pub(crate) fn link(
    linker: &Linker<StoreState>,
    component_linker: &component::Linker<ComponentState>,
    compiled: Compiled,
    sha256: String,
    size_bytes: usize,
) -> Result<CompiledModule, ValidationError> {
    let (kind, handler, wasi_imports, image) = match compiled {
        Compiled::Module(module) => {
            let (handler, imports) = link_module(linker, &module)?;
            (HandlerKind::Module, handler, imports, module.image_range())
        }
        Compiled::Component(component) => {
            let (handler, imports) = link_component(component_linker, &component)?;
            (HandlerKind::Component, handler, imports, component.image_range())
        }
    };
    let image_bytes = (image.end as usize).saturating_sub(image.start as usize);
    Ok(CompiledModule {
        handler,
        image_bytes,
        info: ModuleInfo { sha256, size_bytes, kind, wasi_imports },
    })
}

/// A module's imports checked and linked, its `_start` found.
fn link_module(
    linker: &Linker<StoreState>,
    module: &Module,
) -> Result<(Handler, Vec<String>), ValidationError> {
    let mut wasi_imports = Vec::new();
    for import in module.imports() {
        if import.module() != WASI_MODULE {
            return Err(ValidationError::ForbiddenImport {
                module: import.module().to_owned(),
                name: import.name().to_owned(),
            });
        }
        wasi_imports.push(import.name().to_owned());
    }

    let exports_memory = matches!(module.get_export(MEMORY_EXPORT), Some(ExternType::Memory(_)));
    if !wasi_imports.is_empty() && !exports_memory {
        return Err(ValidationError::MissingMemoryExport);
    }

    let start = match module.get_export(START_EXPORT) {
        Some(ExternType::Func(ty)) if ty.params().len() == 0 && ty.results().len() == 0 => {
            module.get_export_index(START_EXPORT).ok_or(ValidationError::MissingStart)?
        }
        Some(ExternType::Func(ty)) => {
            return Err(ValidationError::BadStartSignature { found: ty.to_string() })
        }
        Some(_) | None => return Err(ValidationError::MissingStart),
    };

    let pre = linker.instantiate_pre(module).map_err(|e| {
        match e.downcast_ref::<UnknownImportError>() {
            Some(unknown) => ValidationError::UnknownImport {
                module: unknown.module().to_owned(),
                name: unknown.name().to_owned(),
            },
            None => ValidationError::Link(e.into_boxed_dyn_error()),
        }
    })?;
    Ok((Handler::Module { pre, start }, wasi_imports))
}

/// A component's `wasi:cli/run` export checked, its imports linked.
fn link_component(
    linker: &component::Linker<ComponentState>,
    component: &Component,
) -> Result<(Handler, Vec<String>), ValidationError> {
    let engine = linker.engine();
    check_exports(engine, component)
        .map_err(|exports| ValidationError::MissingRunExport { exports })?;
    let imports =
        component.component_type().imports(engine).map(|(name, _)| name.to_owned()).collect();
    let link = |e: wasmtime::Error| ValidationError::ComponentLink(e.into_boxed_dyn_error());
    let pre = linker.instantiate_pre(component).map_err(link)?;
    let command = CommandPre::new(pre).map_err(link)?;
    Ok((Handler::Component(command), imports))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn initial_memory_is_read_without_compiling() {
        let wasm = wat::parse_str("(module (memory (export \"memory\") 65536))").unwrap();
        assert_eq!(initial_memory_bytes(&wasm), Some(4 << 30));
        let e = check_initial_memory(&wasm, 32 << 20).unwrap_err();
        assert_eq!(e.to_string(), "module needs 4096 MiB at start; its limit is 32 MiB");
        assert!(check_initial_memory(&wasm, 4 << 30).is_ok());

        let small = wat::parse_str("(module (memory 17) (func (export \"_start\")))").unwrap();
        assert_eq!(initial_memory_bytes(&small), Some(17 * 65536));
        let e = check_initial_memory(&small, 1 << 20).unwrap_err();
        assert_eq!(e.to_string(), "module needs 1.06 MiB at start; its limit is 1 MiB");
        let none = wat::parse_str("(module (func (export \"_start\")))").unwrap();
        assert_eq!(initial_memory_bytes(&none), Some(0));
        assert_eq!(initial_memory_bytes(b"\0asm\x01\0\0\0\x05\xff"), None, "truncated");
    }
}
