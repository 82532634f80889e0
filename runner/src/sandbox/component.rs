//! WASI 0.2 components as handlers: the WASI a component sees, its linker, the check that it
//! is a command, and its entry point.
//!
//! Owns: [`ComponentWasi`] (a component's per-task WASI state), [`ComponentState`], the
//! component linker ([`add_to_linker`]), [`RUN_EXPORT`] and its check ([`check_exports`]),
//! and calling `wasi:cli/run` ([`call_run`]).
//!
//! Invariants:
//! - a component gets what a module gets (stdin = its payload, the same bounded stdout and
//!   stderr, the `SWEEP_*` variables then its `capabilities.env`, no arguments, no preopened
//!   directories, no sockets, no name lookups, no blocking of the host thread) plus one thing
//!   a module cannot have: `wasi:http/outgoing-handler`, whose every request goes through the
//!   egress layer (`http`), under the run's policy and limits;
//! - a component is accepted only if it exports `wasi:cli/run` (0.2.x): the same command
//!   shape as a module's `_start`, so the contract (stdin, stdout, stderr, exit code) is one;
//! - `run` returning `err` is exit code 1; `wasi:cli/exit` `exit-with-code` carries any code,
//!   so 100 (permanent) reaches the classifier as it does from a module's `proc_exit`.

use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::http::Egress;
use super::outcome::Ending;
use super::pipes::BoundedOutput;
use super::store::{TaskInput, TaskState};
use super::wasi::TaskEnv;

/// The export a handler component must have (any 0.2 version).
pub const RUN_EXPORT: &str = "wasi:cli/run";

/// A component's WASI state for one task.
pub(crate) struct ComponentWasi {
    ctx: WasiCtx,
    table: ResourceTable,
    http: WasiHttpCtx,
    pub(crate) egress: Egress,
}

/// A component's store state.
pub(crate) type ComponentState = TaskState<ComponentWasi>;

impl ComponentWasi {
    /// Stdin = the payload, stdout/stderr = the run's buffers, the task's environment, and
    /// outbound HTTP as `input.capabilities` allows.
    pub(crate) fn new(
        input: &TaskInput,
        stdout: &BoundedOutput,
        stderr: &BoundedOutput,
    ) -> ComponentWasi {
        let mut builder = WasiCtxBuilder::new();
        builder
            .stdin(MemoryInputPipe::new(input.payload.clone()))
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_blocking_current_thread(false)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        for (key, value) in TaskEnv::new(input).vars() {
            builder.env(key, value);
        }
        ComponentWasi {
            ctx: builder.build(),
            table: ResourceTable::new(),
            http: WasiHttpCtx::new(),
            egress: Egress::new(&input.capabilities, stderr),
        }
    }
}

impl WasiView for ComponentState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi.ctx, table: &mut self.wasi.table }
    }
}

impl WasiHttpView for ComponentState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        let ComponentWasi { table, http, egress, .. } = &mut self.wasi;
        WasiHttpCtxView { ctx: http, table, hooks: egress }
    }
}

/// Adds WASI 0.2 (the command world) and `wasi:http` (types and outgoing-handler) to
/// `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<ComponentState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)
}

/// Checks that `component` exports `wasi:cli/run` (`@0.2.x`); when it does not, the names
/// of what it does export.
pub(crate) fn check_exports(engine: &Engine, component: &Component) -> Result<(), Vec<String>> {
    let ty = component.component_type();
    let names: Vec<String> = ty.exports(engine).map(|(name, _)| name.to_owned()).collect();
    let is_run = |name: &str| {
        name == RUN_EXPORT || name.strip_prefix(RUN_EXPORT).is_some_and(|v| v.starts_with("@0.2."))
    };
    if names.iter().any(|name| is_run(name)) {
        Ok(())
    } else {
        Err(names)
    }
}

/// Instantiates the component and calls `wasi:cli/run`.
pub(crate) async fn call_run(
    pre: &CommandPre<ComponentState>,
    store: &mut Store<ComponentState>,
) -> Ending {
    let command = match pre.instantiate_async(&mut *store).await {
        Ok(command) => command,
        Err(e) => return Ending::InstantiateFailed(e),
    };
    match command.wasi_cli_run().call_run(&mut *store).await {
        Ok(Ok(())) => Ending::Returned,
        // `run` returned `err`: what `exit(err)` means, exit code 1.
        Ok(Err(())) => Ending::CallFailed(wasmtime::Error::new(I32Exit(1))),
        Err(e) => Ending::CallFailed(e),
    }
}
