//! Bounded in-memory stdout/stderr for guests.
//!
//! Owns: [`BoundedOutput`], the only WASI output stream the sandbox hands to a guest, and
//! [`TaskStdin`], a component's stdin.
//!
//! Invariants:
//! - host memory held per stream never exceeds its capacity (plus one in-flight write of at
//!   most [`WRITE_PERMIT`] bytes while trimming), whatever the guest writes;
//! - [`Overflow::Stop`] (stdout): a write that would pass capacity records the overflow flag
//!   and fails with a *trap* ([`OutputLimitExceeded`]), so the guest is stopped at once rather
//!   than seeing an I/O error it could retry forever; the flag, not the error, is what the
//!   classifier reads;
//! - [`Overflow::KeepTail`] (stderr): writes never fail; the oldest bytes are dropped so the
//!   buffer holds the most recent output, where a handler's error message lives;
//! - every stream a guest opens on one of these reads or writes the one buffer: a warm
//!   instance (`warm`) that kept its streams from the task before reads the next task's
//!   payload and writes into the next task's output once the buffers are [`TaskStdin::fill`]ed
//!   and [`BoundedOutput::reset`].
//!
//! `wasmtime_wasi::p2::pipe::MemoryOutputPipe` was not used: at capacity its `check_write`
//! reports `Closed`, which WASI p1 turns into `EIO` for the guest (not a stop), and its traps
//! are untyped strings.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdinStream, StdoutStream};
use wasmtime_wasi::p2::{InputStream, OutputStream, Pollable, StreamError, StreamResult};

/// Bytes a guest may hand us per write call (WASI p1 already splits writes into 4 KiB chunks).
pub(crate) const WRITE_PERMIT: usize = 4096;

/// The guest's stdout passed its limit. Raised as a trap from the stdout stream.
#[derive(Debug, thiserror::Error)]
#[error("guest stdout exceeded the {limit}-byte output limit")]
pub(crate) struct OutputLimitExceeded {
    pub limit: usize,
}

/// What a [`BoundedOutput`] does when a write would pass its capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overflow {
    /// Record the overflow and trap the guest.
    Stop,
    /// Drop the oldest bytes.
    KeepTail,
}

#[derive(Debug)]
struct Buffer {
    bytes: Vec<u8>,
    capacity: usize,
    mode: Overflow,
    overflowed: bool,
}

/// A cloneable handle to one bounded in-memory output stream; clones share the buffer.
#[derive(Debug, Clone)]
pub(crate) struct BoundedOutput {
    buffer: Arc<Mutex<Buffer>>,
}

/// What a stream captured, taken after the run.
#[derive(Debug, Default)]
pub(crate) struct Captured {
    pub bytes: Vec<u8>,
    /// `Stop`: a write was refused. `KeepTail`: older bytes were dropped.
    pub overflowed: bool,
}

impl BoundedOutput {
    pub fn new(capacity: usize, mode: Overflow) -> Self {
        BoundedOutput {
            buffer: Arc::new(Mutex::new(Buffer {
                bytes: Vec::new(),
                capacity,
                mode,
                overflowed: false,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // Nothing panics while holding the lock; if something ever did, the bytes are still
        // a valid (bounded) buffer, so recover rather than propagate the poison.
        self.buffer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the captured bytes and the overflow flag, leaving the buffer empty.
    pub fn take(&self) -> Captured {
        let mut buf = self.lock();
        Captured { bytes: std::mem::take(&mut buf.bytes), overflowed: buf.overflowed }
    }

    /// Empties the buffer and clears its overflow for a new task, with that task's capacity.
    pub fn reset(&self, capacity: usize) {
        let mut buf = self.lock();
        buf.bytes.clear();
        buf.capacity = capacity;
        buf.overflowed = false;
    }

    /// Appends `data`; `Err` means the stream refused it (stdout over its limit).
    pub(super) fn append(&self, data: &[u8]) -> Result<(), OutputLimitExceeded> {
        let mut buf = self.lock();
        let room = buf.capacity - buf.bytes.len();
        match buf.mode {
            Overflow::Stop if buf.overflowed || data.len() > room => {
                buf.overflowed = true;
                Err(OutputLimitExceeded { limit: buf.capacity })
            }
            Overflow::Stop => {
                buf.bytes.extend_from_slice(data);
                Ok(())
            }
            Overflow::KeepTail => {
                let cap = buf.capacity;
                let data = &data[data.len().saturating_sub(cap)..];
                let excess = (buf.bytes.len() + data.len()).saturating_sub(cap);
                if excess > 0 {
                    buf.bytes.drain(..excess);
                    buf.overflowed = true;
                }
                buf.bytes.extend_from_slice(data);
                Ok(())
            }
        }
    }
}

impl IsTerminal for BoundedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for BoundedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for BoundedOutput {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for BoundedOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes).map_err(|e| StreamError::Trap(wasmtime::Error::new(e)))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Always grant a full permit, even when nearly full: the write that passes the limit
        // must reach `write` so it traps with our typed error instead of the guest waiting on
        // a zero permit.
        Ok(WRITE_PERMIT)
    }
}

impl tokio::io::AsyncWrite for BoundedOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(self.append(buf).map(|()| buf.len()).map_err(std::io::Error::other))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A component's stdin: the task's payload, then the end of the stream. Filled again for each
/// task a warm instance runs; whether the guest has read it since is what tells a command
/// that traps on entry from one that ran (`warm`).
#[derive(Debug, Clone)]
pub(crate) struct TaskStdin {
    state: Arc<Mutex<StdinState>>,
}

#[derive(Debug)]
struct StdinState {
    /// What is left of the payload.
    bytes: Bytes,
    /// Whether the guest asked for stdin since the last fill.
    read: bool,
}

impl TaskStdin {
    pub fn new(payload: Bytes) -> Self {
        TaskStdin { state: Arc::new(Mutex::new(StdinState { bytes: payload, read: false })) }
    }

    fn lock(&self) -> MutexGuard<'_, StdinState> {
        // As for `BoundedOutput`: nothing panics while holding it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes `payload` the stream's content, from its start.
    pub fn fill(&self, payload: Bytes) {
        *self.lock() = StdinState { bytes: payload, read: false };
    }

    /// Whether the guest read (or tried to read) stdin since the last fill.
    pub fn was_read(&self) -> bool {
        self.lock().read
    }
}

impl IsTerminal for TaskStdin {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdinStream for TaskStdin {
    fn p2_stream(&self) -> Box<dyn InputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncRead + Send + Sync> {
        // Only WASI 0.3's bindings read stdin this way, and they are not linked.
        Box::new(tokio::io::empty())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for TaskStdin {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl InputStream for TaskStdin {
    /// As `MemoryInputPipe` reads: up to `size` bytes, then `Closed` at the end.
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        let mut state = self.lock();
        state.read = true;
        if state.bytes.is_empty() {
            return Err(StreamError::Closed);
        }
        let size = size.min(state.bytes.len());
        Ok(state.bytes.split_to(size))
    }
}

/// The last at most `max` bytes of `s`, cut at a char boundary.
pub(crate) fn tail_str(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_mode_accepts_up_to_capacity_then_refuses() {
        let out = BoundedOutput::new(8, Overflow::Stop);
        assert!(out.append(b"1234").is_ok());
        assert!(out.append(b"5678").is_ok());
        assert!(out.append(b"9").is_err());
        // Once refused, always refused, even for an empty write.
        assert!(out.append(b"").is_err());
        let got = out.take();
        assert_eq!(got.bytes, b"12345678");
        assert!(got.overflowed);
    }

    #[test]
    fn stop_mode_refuses_a_single_oversized_write_without_storing_it() {
        let out = BoundedOutput::new(4, Overflow::Stop);
        assert!(out.append(b"12345").is_err());
        assert_eq!(out.take().bytes, b"");
    }

    #[test]
    fn keep_tail_mode_keeps_the_newest_bytes() {
        let out = BoundedOutput::new(5, Overflow::KeepTail);
        assert!(out.append(b"abc").is_ok());
        assert!(!out.lock().overflowed);
        assert!(out.append(b"defg").is_ok());
        let got = out.take();
        assert_eq!(got.bytes, b"cdefg");
        assert!(got.overflowed);
        let out = BoundedOutput::new(3, Overflow::KeepTail);
        assert!(out.append(b"0123456789").is_ok());
        assert_eq!(out.take().bytes, b"789");
    }

    #[test]
    fn stream_write_error_is_a_typed_trap() {
        let mut out = BoundedOutput::new(1, Overflow::Stop);
        match OutputStream::write(&mut out, Bytes::from_static(b"xy")) {
            Err(StreamError::Trap(e)) => assert!(e.is::<OutputLimitExceeded>()),
            other => panic!("expected a trap, got {other:?}"),
        }
    }

    #[test]
    fn reset_empties_and_sets_the_next_capacity() {
        let out = BoundedOutput::new(2, Overflow::Stop);
        assert!(out.append(b"abc").is_err());
        out.reset(4);
        assert!(out.append(b"abcd").is_ok());
        let got = out.take();
        assert_eq!(got.bytes, b"abcd");
        assert!(!got.overflowed);
    }

    #[test]
    fn stdin_reads_each_fill_to_its_end() {
        let stdin = TaskStdin::new(Bytes::from_static(b"abc"));
        let mut stream = stdin.p2_stream();
        assert!(!stdin.was_read());
        assert_eq!(stream.read(2).ok(), Some(Bytes::from_static(b"ab")));
        assert_eq!(stream.read(9).ok(), Some(Bytes::from_static(b"c")));
        assert!(matches!(stream.read(9), Err(StreamError::Closed)));
        assert!(stdin.was_read());
        // A stream kept from the task before reads the next one's payload.
        stdin.fill(Bytes::from_static(b"xy"));
        assert!(!stdin.was_read());
        assert_eq!(stream.read(9).ok(), Some(Bytes::from_static(b"xy")));
        assert!(matches!(stream.read(9), Err(StreamError::Closed)));
    }

    #[test]
    fn tail_str_respects_char_boundaries() {
        assert_eq!(tail_str("hello", 3), "llo");
        assert_eq!(tail_str("hi", 10), "hi");
        // 'é' is two bytes; cutting inside it skips forward.
        assert_eq!(tail_str("aé", 1), "");
        assert_eq!(tail_str("aéb", 3), "éb");
    }
}
