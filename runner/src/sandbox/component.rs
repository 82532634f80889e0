//! WASI 0.2 components as handlers: the WASI a component sees, its linker, the check that it
//! is a command, and its entry point.
//!
//! Owns: [`ComponentWasi`] (a component's per-task WASI state, renewed for each task a warm
//! instance runs), [`ComponentState`], the component linker ([`add_to_linker`]),
//! [`RUN_EXPORT`] and its check ([`check_exports`]), and calling `wasi:cli/run`
//! ([`call_run`]).
//!
//! Invariants:
//! - a component gets what a module gets (stdin = its payload, the same bounded stdout and
//!   stderr, the `SWEEP_*` variables then its `capabilities.env`, no arguments, no preopened
//!   directories, no sockets, no name lookups, no blocking of the host thread) plus one thing
//!   a module cannot have: `wasi:http/outgoing-handler`, whose every request goes through the
//!   egress layer (`http`), under the run's policy and limits;
//! - what a task sees of its own comes from state [`ComponentWasi::renew`] replaces: stdin
//!   and the output buffers (`pipes`), the environment (served by our own
//!   `wasi:cli/environment`, since `WasiCtx` fixes its list when built) and the egress
//!   hooks. What `WasiCtx` fixes (clocks, random, no sockets, no preopens) is the same for
//!   every task;
//! - a component is accepted only if it exports `wasi:cli/run` (0.2.x): the same command
//!   shape as a module's `_start`, so the contract (stdin, stdout, stderr, exit code) is one;
//! - `run` returning `err` is exit code 1; `wasi:cli/exit` `exit-with-code` carries any code,
//!   so 100 (permanent) reaches the classifier as it does from a module's `proc_exit`.

use bytes::Bytes;
use wasmtime::component::{Component, HasData, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::p2::bindings::cli::environment;
use wasmtime_wasi::p2::bindings::{Command, CommandPre};
use wasmtime_wasi::{I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::body::{HostFutureTrailers, HostIncomingBody, HostOutgoingBody};
use wasmtime_wasi_http::p2::types::{
    HostFutureIncomingResponse, HostIncomingResponse, HostOutgoingRequest,
};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::http::Egress;
use super::outcome::Ending;
use super::pipes::{BoundedOutput, TaskStdin};
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
    env: TaskEnv,
    stdin: TaskStdin,
    stdout: BoundedOutput,
    stderr: BoundedOutput,
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
        let stdin = TaskStdin::new(Bytes::from(input.payload.clone()));
        let mut builder = WasiCtxBuilder::new();
        builder
            .stdin(stdin.clone())
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_blocking_current_thread(false)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        ComponentWasi {
            ctx: builder.build(),
            table: ResourceTable::new(),
            http: WasiHttpCtx::new(),
            egress: Egress::new(&input.capabilities, stderr),
            env: TaskEnv::new(input),
            stdin,
            stdout: stdout.clone(),
            stderr: stderr.clone(),
        }
    }

    /// Makes this state the next task's, for an instance that ran a task before: `input`'s
    /// payload on stdin, empty output buffers (stdout of `output_bytes`), `input`'s
    /// environment and egress. Returns the output buffers.
    pub(crate) fn renew(
        &mut self,
        input: &TaskInput,
        output_bytes: usize,
        stderr_bytes: usize,
    ) -> (BoundedOutput, BoundedOutput) {
        self.stdin.fill(Bytes::from(input.payload.clone()));
        self.stdout.reset(output_bytes);
        self.stderr.reset(stderr_bytes);
        self.env = TaskEnv::new(input);
        self.egress = Egress::new(&input.capabilities, &self.stderr);
        (self.stdout.clone(), self.stderr.clone())
    }

    /// Whether the guest did anything this task that reached past its instance: read stdin,
    /// or asked for an HTTP request (refused ones included).
    pub(crate) fn reached_outside(&self) -> bool {
        self.stdin.was_read() || self.egress.asked() > 0
    }

    /// Whether the instance may run another task: it holds no `wasi:http` request, response,
    /// body or trailers (something that could still send, receive or count after its task
    /// ended) and at most [`MAX_HELD_RESOURCES`] resources in all.
    pub(crate) fn may_be_kept(&mut self) -> bool {
        let mut held = 0;
        for entry in self.table.iter_mut() {
            held += 1;
            let http = entry.is::<HostOutgoingRequest>()
                || entry.is::<HostOutgoingBody>()
                || entry.is::<HostFutureIncomingResponse>()
                || entry.is::<HostIncomingResponse>()
                || entry.is::<HostIncomingBody>()
                || entry.is::<HostFutureTrailers>();
            if http || held > MAX_HELD_RESOURCES {
                return false;
            }
        }
        true
    }
}

/// Most resources a kept instance may hold after a task. A guest that never drops handles
/// would otherwise grow its table, the host's memory and its own per-task cost without
/// bound: componentize-js keeps the stdin and stdout streams it opens, 2 a task, and its
/// 2,500th task on one instance took 3x its 1st. At this bound it is run on ~60 tasks.
pub(crate) const MAX_HELD_RESOURCES: usize = 128;

/// `wasi:cli/environment` for a component: the task's variables (see `TaskEnv`), no
/// arguments, no working directory.
impl environment::Host for TaskEnv {
    fn get_environment(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        Ok(self.vars().map(|(key, value)| (key.to_owned(), value.into_owned())).collect())
    }

    fn get_arguments(&mut self) -> wasmtime::Result<Vec<String>> {
        Ok(Vec::new())
    }

    fn initial_cwd(&mut self) -> wasmtime::Result<Option<String>> {
        Ok(None)
    }
}

/// The [`HasData`] that hands `wasi:cli/environment` the task's [`TaskEnv`].
struct TaskEnvironment;

impl HasData for TaskEnvironment {
    type Data<'a> = &'a mut TaskEnv;
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
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    // The task's environment in place of the list `WasiCtx` was built with (the same
    // interface name and version: wasmtime-wasi's own bindings define it).
    linker.allow_shadowing(true);
    environment::add_to_linker::<ComponentState, TaskEnvironment>(linker, |state| {
        &mut state.wasi.env
    })?;
    linker.allow_shadowing(false);
    Ok(())
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

/// Instantiates the component and calls `wasi:cli/run`; the instance, for a caller that
/// keeps it (`warm`).
pub(crate) async fn call_run(
    pre: &CommandPre<ComponentState>,
    store: &mut Store<ComponentState>,
) -> (Ending, Option<Command>) {
    let command = match pre.instantiate_async(&mut *store).await {
        Ok(command) => command,
        Err(e) => return (Ending::InstantiateFailed(e), None),
    };
    let ending = run_again(&command, store).await;
    (ending, Some(command))
}

/// Calls `wasi:cli/run` of an instance.
pub(crate) async fn run_again(command: &Command, store: &mut Store<ComponentState>) -> Ending {
    match command.wasi_cli_run().call_run(&mut *store).await {
        Ok(Ok(())) => Ending::Returned,
        // `run` returned `err`: what `exit(err)` means, exit code 1.
        Ok(Err(())) => Ending::CallFailed(wasmtime::Error::new(I32Exit(1))),
        Err(e) => Ending::CallFailed(e),
    }
}
