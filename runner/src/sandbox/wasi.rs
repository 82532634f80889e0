//! The WASI a guest sees, in two layers: reads and writes of its stdin, stdout and stderr,
//! what those descriptors are, its (empty) arguments, its environment and its exit, served
//! straight from the store ([`GuestWasi`]); everything else by wasmtime-wasi's preview-1
//! context, built the first time a guest makes a call the first layer does not serve.
//!
//! Why: what a handler usually does is read its payload, write its result, exit and, with the
//! SDK's context, read the environment; C and Zig runtimes also ask what their stdio
//! descriptors are and read their arguments on the way in. Through wasmtime-wasi each of
//! those calls crosses its preview-2 resource table and boxed streams, and building that
//! context for every task seeds two random generators and allocates its table and streams:
//! together about a quarter of a Rust no-op's run (benches/README.md has the figures). A
//! guest that only does those things never needs the full context.
//!
//! Invariants:
//! - a guest cannot tell the layers apart: the calls served here give the errno, the traps
//!   (a bad pointer traps, as preview 1 specifies), the short reads and writes (only the
//!   first non-empty buffer of a call; output in 4 KiB pieces) and the hostcall-fuel checks
//!   that wasmtime-wasi gives for the same descriptors. The tests run both layers on the same
//!   probes and compare what the guest saw;
//! - stdio is served here only until the full context exists. It is then built with stdin at
//!   the position reached here and with the same output buffers, and every descriptor call
//!   goes to it from then on, so there is only ever one descriptor table (a guest that closes
//!   or renumbers fd 0-2 does it through the full context, after which this layer steps aside);
//! - the environment and the (empty) arguments do not change during a run, so they are
//!   always served here.

use std::borrow::Cow;

use bytes::Bytes;
use wasmtime::{AsContextMut, Caller, Extern, Linker};
use wasmtime_wasi::p1::wasi_snapshot_preview1::{self as p1_abi, WasiSnapshotPreview1 as _};
use wasmtime_wasi::p1::{self, types, WasiP1Ctx};
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{I32Exit, WasiCtxBuilder};
use wiggle::{GuestError, GuestMemory, GuestPtr, GuestType};

use super::module::WASI_MODULE;
use super::pipes::{BoundedOutput, OutputLimitExceeded, WRITE_PERMIT};
use super::store::{StoreState, TaskInput};

/// Descriptors as preview 1 numbers them.
const STDIN: i32 = 0;
const STDOUT: i32 = 1;
const STDERR: i32 = 2;

/// A guest's WASI state: stdio and environment served directly, the full preview-1 context
/// once it is needed.
pub(crate) struct GuestWasi {
    /// The payload not read yet.
    stdin: Bytes,
    stdout: BoundedOutput,
    stderr: BoundedOutput,
    env: TaskEnv,
    /// wasmtime-wasi's context, built on the first call this layer does not serve.
    full: Option<WasiP1Ctx>,
}

/// What the `SWEEP_*` variables say, kept unformatted (most guests never read them), and the
/// variables the run was given (its module's secrets).
pub(crate) struct TaskEnv {
    task_id: String,
    task_type: String,
    attempt: u32,
    max_attempts: u32,
    given: Vec<(String, String)>,
}

impl TaskEnv {
    pub(crate) fn new(input: &TaskInput) -> TaskEnv {
        TaskEnv {
            task_id: input.task_id.clone(),
            task_type: input.task_type.clone(),
            attempt: input.attempt,
            max_attempts: input.max_attempts,
            given: input.capabilities.env.clone(),
        }
    }

    /// The variables, in the order a guest sees them: the four `SWEEP_*` ones, then those the
    /// run was given, in their order.
    pub(crate) fn vars(&self) -> impl Iterator<Item = (&str, Cow<'_, str>)> {
        [
            ("SWEEP_TASK_ID", Cow::Borrowed(self.task_id.as_str())),
            ("SWEEP_TASK_TYPE", Cow::Borrowed(self.task_type.as_str())),
            ("SWEEP_ATTEMPT", Cow::Owned(self.attempt.to_string())),
            ("SWEEP_MAX_ATTEMPTS", Cow::Owned(self.max_attempts.to_string())),
        ]
        .into_iter()
        .chain(self.given.iter().map(|(k, v)| (k.as_str(), Cow::Borrowed(v.as_str()))))
    }
}

impl GuestWasi {
    /// Stdin = the payload, stdout/stderr = the run's buffers, the four `SWEEP_*` variables
    /// and the ones the run was given.
    pub(crate) fn new(input: &TaskInput, stdout: &BoundedOutput, stderr: &BoundedOutput) -> Self {
        GuestWasi {
            stdin: Bytes::from(input.payload.clone()),
            stdout: stdout.clone(),
            stderr: stderr.clone(),
            env: TaskEnv::new(input),
            full: None,
        }
    }

    /// Whether the full context has been built (stdio is no longer served here).
    pub(crate) fn is_full(&self) -> bool {
        self.full.is_some()
    }

    /// The full preview-1 context, built on first use: no preopens, no sockets, no host env or
    /// args, no blocking of the host thread; stdin continues where this layer left it.
    pub(crate) fn full(&mut self) -> &mut WasiP1Ctx {
        let Self { stdin, stdout, stderr, env, full } = self;
        full.get_or_insert_with(|| {
            let mut builder = WasiCtxBuilder::new();
            builder
                .stdin(MemoryInputPipe::new(std::mem::take(stdin)))
                .stdout(stdout.clone())
                .stderr(stderr.clone())
                .allow_blocking_current_thread(false)
                .allow_tcp(false)
                .allow_udp(false)
                .allow_ip_name_lookup(false);
            for (key, value) in env.vars() {
                builder.env(key, value);
            }
            builder.build_p1()
        })
    }

    /// `fd_read(0, ...)` as preview 1 does it over a memory pipe: the first non-empty buffer
    /// gets what is left of the payload, up to its length; 0 bytes at the end; `EINTR` for an
    /// empty buffer while bytes are left (a stream read of 0 bytes).
    fn read_stdin(
        &mut self,
        memory: &mut GuestMemory<'_>,
        fuel: &mut usize,
        iovs: GuestPtr<[types::Iovec]>,
    ) -> Result<u32, types::Error> {
        let buf = first_non_empty(memory, fuel, iovs, |iov: &types::Iovec| (iov.buf, iov.buf_len))?;
        let n = self.stdin.len().min(buf.len() as usize);
        if n == 0 && !self.stdin.is_empty() {
            return Err(types::Errno::Intr.into());
        }
        let read = self.stdin.split_to(n);
        let n = u32::try_from(n)?;
        // Checked even for 0 bytes at the end, as preview 1 does.
        memory.copy_from_slice(&read, GuestPtr::<u8>::new(buf.offset_base()).as_array(n))?;
        Ok(n)
    }

    /// `fd_write(1 or 2, ...)` as preview 1 does it: the first non-empty buffer, written whole
    /// in 4 KiB pieces; stdout over its limit traps (see `pipes`).
    fn write_stdio(
        &mut self,
        memory: &mut GuestMemory<'_>,
        fuel: &mut usize,
        fd: i32,
        ciovs: GuestPtr<[types::Ciovec]>,
    ) -> Result<u32, types::Error> {
        let buf = first_non_empty(memory, fuel, ciovs, |c: &types::Ciovec| (c.buf, c.buf_len))?;
        let bytes = memory.as_cow(buf).map_err(|e| types::Error::trap(e.into()))?;
        let out = if fd == STDOUT { &self.stdout } else { &self.stderr };
        // In the pieces wasmtime-wasi hands its streams (`blocking-write-and-flush` takes 4 KiB).
        for chunk in bytes.chunks(WRITE_PERMIT) {
            out.append(chunk)
                .map_err(|e: OutputLimitExceeded| types::Error::trap(wasmtime::Error::new(e)))?;
        }
        Ok(u32::try_from(bytes.len())?)
    }

    /// `environ_sizes_get`: how many variables, and the bytes of their `key=value\0` strings.
    fn environ_sizes(&self) -> Result<(u32, u32), types::Error> {
        let (mut count, mut bytes) = (0usize, 0usize);
        for (k, v) in self.env.vars() {
            count += 1;
            bytes += k.len() + 1 + v.len() + 1;
        }
        Ok((u32::try_from(count)?, u32::try_from(bytes)?))
    }

    /// `environ_get`: a pointer per variable at `environ`, the strings from `buf` on.
    fn environ_get(
        &self,
        memory: &mut GuestMemory<'_>,
        environ: GuestPtr<GuestPtr<u8>>,
        buf: GuestPtr<u8>,
    ) -> Result<(), types::Error> {
        let (mut environ, mut buf) = (environ, buf);
        for (key, value) in self.env.vars() {
            memory.write(environ, buf)?;
            environ = environ.add(1)?;
            for part in [key.as_bytes(), b"=", value.as_bytes(), b"\0"] {
                let len = u32::try_from(part.len())?;
                memory.copy_from_slice(part, buf.as_array(len))?;
                buf = buf.add(len)?;
            }
        }
        Ok(())
    }
}

/// The first non-empty buffer of a list of (c)iovecs, or an empty one, with the hostcall fuel
/// of the list and of that buffer taken: preview 1's `first_non_empty_iovec`.
fn first_non_empty<V: GuestType>(
    memory: &GuestMemory<'_>,
    fuel: &mut usize,
    list: GuestPtr<[V]>,
    buffer: impl Fn(&V) -> (GuestPtr<u8>, u32),
) -> Result<GuestPtr<[u8]>, types::Error> {
    consume_array(fuel, list)?;
    for item in list.iter() {
        let (buf, len) = buffer(&memory.read(item?)?);
        if len > 0 {
            let buf = buf.as_array(len);
            consume_array(fuel, buf)?;
            return Ok(buf);
        }
    }
    Ok(GuestPtr::new((0, 0)))
}

/// Hostcall fuel for copying `array` (preview 1's `consume_fuel_for_array`): a call may not
/// make the host copy more than the store's hostcall fuel.
fn consume_array<T>(fuel: &mut usize, array: GuestPtr<[T]>) -> Result<(), types::Error> {
    let bytes =
        usize::try_from(array.len())?.checked_mul(size_of::<T>()).ok_or(types::Errno::Overflow)?;
    if bytes > *fuel {
        return Err(types::Errno::Nomem.into());
    }
    *fuel -= bytes;
    Ok(())
}

/// Adds preview 1 to `linker`: wasmtime-wasi's, over the lazily built context, with the
/// calls [`GuestWasi`] serves in front of it.
pub(crate) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    p1::add_to_linker_async(linker, |state: &mut StoreState| state.wasi.full())?;
    linker.allow_shadowing(true);
    linker.func_wrap_async(
        WASI_MODULE,
        "fd_read",
        |mut caller: Caller<'_, StoreState>, (fd, iovs, len, nread): (i32, i32, i32, i32)| {
            Box::new(async move {
                if fd != STDIN || caller.data().wasi.is_full() {
                    let (mut memory, ctx) = full_context(&mut caller)?;
                    return p1_abi::fd_read(ctx, &mut memory, fd, iovs, len, nread).await;
                }
                served(&mut caller, |memory, wasi, fuel| {
                    let n = wasi.read_stdin(memory, fuel, list(iovs, len))?;
                    Ok(memory.write(GuestPtr::<u32>::new(nread as u32), n))
                })
            })
        },
    )?;
    linker.func_wrap_async(
        WASI_MODULE,
        "fd_write",
        |mut caller: Caller<'_, StoreState>, (fd, ciovs, len, nwritten): (i32, i32, i32, i32)| {
            Box::new(async move {
                if !(fd == STDOUT || fd == STDERR) || caller.data().wasi.is_full() {
                    let (mut memory, ctx) = full_context(&mut caller)?;
                    return p1_abi::fd_write(ctx, &mut memory, fd, ciovs, len, nwritten).await;
                }
                served(&mut caller, |memory, wasi, fuel| {
                    let n = wasi.write_stdio(memory, fuel, fd, list(ciovs, len))?;
                    Ok(memory.write(GuestPtr::<u32>::new(nwritten as u32), n))
                })
            })
        },
    )?;
    linker.func_wrap_async(
        WASI_MODULE,
        "fd_fdstat_get",
        |mut caller: Caller<'_, StoreState>, (fd, stat): (i32, i32)| {
            Box::new(async move {
                if !(STDIN..=STDERR).contains(&fd) || caller.data().wasi.is_full() {
                    let (mut memory, ctx) = full_context(&mut caller)?;
                    return p1_abi::fd_fdstat_get(ctx, &mut memory, fd, stat).await;
                }
                served(&mut caller, |memory, _wasi, _fuel| {
                    Ok(memory.write(GuestPtr::<types::Fdstat>::new(stat as u32), stdio_fdstat(fd)))
                })
            })
        },
    )?;
    linker.func_wrap(
        WASI_MODULE,
        "args_sizes_get",
        |mut caller: Caller<'_, StoreState>, count: i32, bytes: i32| {
            // A guest gets no arguments.
            served(&mut caller, |memory, _wasi, _fuel| {
                Ok(write_sizes(memory, (count, bytes), (0, 0)))
            })
        },
    )?;
    linker.func_wrap(
        WASI_MODULE,
        "args_get",
        |mut caller: Caller<'_, StoreState>, _argv: i32, _buf: i32| {
            served(&mut caller, |_memory, _wasi, _fuel| Ok(Ok(())))
        },
    )?;
    linker.func_wrap(
        WASI_MODULE,
        "environ_sizes_get",
        |mut caller: Caller<'_, StoreState>, count: i32, bytes: i32| {
            served(&mut caller, |memory, wasi, _fuel| {
                Ok(write_sizes(memory, (count, bytes), wasi.environ_sizes()?))
            })
        },
    )?;
    linker.func_wrap(
        WASI_MODULE,
        "environ_get",
        |mut caller: Caller<'_, StoreState>, environ: i32, buf: i32| {
            served(&mut caller, |memory, wasi, _fuel| {
                wasi.environ_get(memory, GuestPtr::new(environ as u32), GuestPtr::new(buf as u32))?;
                Ok(Ok(()))
            })
        },
    )?;
    linker.func_wrap(
        WASI_MODULE,
        "proc_exit",
        |mut caller: Caller<'_, StoreState>, status: i32| -> wasmtime::Result<()> {
            // A Rust guest ends with `proc_exit(0)`: without this, every run would build the
            // full context on its way out. The checks are wasmtime-wasi's, in its order.
            guest_memory(&mut caller)?;
            let status = status as u32;
            if status >= 126 {
                wasmtime::bail!("exit with invalid exit status outside of [0..126)");
            }
            Err(I32Exit(status as i32).into())
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// `fd_fdstat_get` of fd 0, 1 or 2, as wasmtime-wasi describes its stdio: neither the payload
/// nor the output buffers are terminals, so the type is unknown; stdin may be read, the others
/// written.
fn stdio_fdstat(fd: i32) -> types::Fdstat {
    let rights = if fd == STDIN { types::Rights::FD_READ } else { types::Rights::FD_WRITE };
    types::Fdstat {
        fs_filetype: types::Filetype::Unknown,
        fs_flags: types::Fdflags::empty(),
        fs_rights_base: rights,
        fs_rights_inheriting: rights,
    }
}

/// A guest's `(pointer, length)` list argument.
fn list<T>(ptr: i32, len: i32) -> GuestPtr<[T]> {
    // Reinterpreted as unsigned, as wiggle does: wasm has no signed pointers.
    GuestPtr::new((ptr as u32, len as u32))
}

/// The guest's memory, its WASI state and the store's hostcall fuel: what wasmtime-wasi's own
/// bindings look up before every call (and fail on the same way without a memory).
fn guest_memory<'a>(
    caller: &'a mut Caller<'_, StoreState>,
) -> wasmtime::Result<(GuestMemory<'a>, &'a mut GuestWasi, usize)> {
    let Some(Extern::Memory(memory)) = caller.get_export("memory") else {
        wasmtime::bail!("missing required memory export");
    };
    let fuel = caller.as_context_mut().hostcall_fuel();
    let (memory, state) = memory.data_and_store_mut(caller);
    Ok((GuestMemory::Unshared(memory), &mut state.wasi, fuel))
}

/// The guest's memory and [`GuestWasi::full`], with the hostcall fuel handed to it.
fn full_context<'a>(
    caller: &'a mut Caller<'_, StoreState>,
) -> wasmtime::Result<(GuestMemory<'a>, &'a mut WasiP1Ctx)> {
    let (memory, wasi, fuel) = guest_memory(caller)?;
    let ctx = wasi.full();
    ctx.set_hostcall_fuel(fuel);
    Ok((memory, ctx))
}

/// Runs a call served by [`GuestWasi`] the way wasmtime-wasi's bindings run theirs: the
/// body's `Err` is an errno for the guest (or a trap), and then nothing was written back; its
/// `Ok` holds the write-back of the results, where a bad pointer traps.
fn served(
    caller: &mut Caller<'_, StoreState>,
    body: impl FnOnce(
        &mut GuestMemory<'_>,
        &mut GuestWasi,
        &mut usize,
    ) -> Result<Result<(), GuestError>, types::Error>,
) -> wasmtime::Result<i32> {
    let (mut memory, wasi, mut fuel) = guest_memory(caller)?;
    match body(&mut memory, wasi, &mut fuel) {
        Ok(written) => {
            written?;
            Ok(types::Errno::Success as i32)
        }
        Err(e) => Ok(e.downcast()? as i32),
    }
}

/// The write-back of a `*_sizes_get` call's two results, a count and a byte size. The size
/// first: wasmtime-wasi's bindings store results last to first, so a bad size pointer traps
/// before the count is written.
fn write_sizes(
    memory: &mut GuestMemory<'_>,
    (count_ptr, bytes_ptr): (i32, i32),
    (count, bytes): (u32, u32),
) -> Result<(), GuestError> {
    memory.write(GuestPtr::<u32>::new(bytes_ptr as u32), bytes)?;
    memory.write(GuestPtr::<u32>::new(count_ptr as u32), count)
}
