//! A local HTTP server that stands in for a mail provider's API in tests: it records every
//! request, counts the connections it accepted and closed, and answers as told (a message id,
//! a large body, or nothing at all).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// How the server answers each request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// `200` with `{"id": "msg-<n>"}`, `n` counting requests from 1.
    MessageId,
    /// `status` with this JSON body.
    Json(u16, String),
    /// `200` with a body of `n` bytes.
    Bytes(usize),
    /// Reads the request and never answers (the connection stays open until the client goes).
    Silent,
}

/// One request as the server read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// `POST`, `GET`, ...
    pub method: String,
    /// The request target (`/send`).
    pub path: String,
    /// Header names (lowercase) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Received {
    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Default)]
struct Seen {
    accepted: usize,
    closed: usize,
    requests: Vec<Received>,
}

/// The running server; stops when dropped.
#[derive(Debug)]
pub struct MailApi {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    changed: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MailApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MailApi {
    /// Starts a server on a free loopback port that answers every request with `reply`.
    pub async fn start(reply: Reply) -> std::io::Result<MailApi> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let changed = Arc::new(Notify::new());
        let (s, c) = (Arc::clone(&seen), Arc::clone(&changed));
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                lock(&s).accepted += 1;
                c.notify_waiters();
                tokio::spawn(serve(stream, reply.clone(), Arc::clone(&s), Arc::clone(&c)));
            }
        });
        Ok(MailApi { addr, seen, changed, task })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>/send`.
    pub fn url(&self) -> String {
        format!("http://{}/send", self.addr)
    }

    /// The egress entry that allows it: `127.0.0.1:<port>`.
    pub fn allow_entry(&self) -> String {
        self.addr.to_string()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        lock(&self.seen).accepted
    }

    /// The requests read so far.
    pub fn requests(&self) -> Vec<Received> {
        lock(&self.seen).requests.clone()
    }

    /// Waits until `n` connections have been closed by the client (or ended by the server).
    pub async fn closed(&self, n: usize) {
        loop {
            let notified = self.changed.notified();
            if lock(&self.seen).closed >= n {
                return;
            }
            notified.await;
        }
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn serve(mut stream: TcpStream, reply: Reply, seen: Arc<Mutex<Seen>>, changed: Arc<Notify>) {
    if let Some(request) = read_request(&mut stream).await {
        let n = {
            let mut seen = lock(&seen);
            seen.requests.push(request);
            seen.requests.len()
        };
        changed.notify_waiters();
        let (status, body) = match reply {
            Reply::MessageId => (200, format!(r#"{{"id":"msg-{n}"}}"#).into_bytes()),
            Reply::Json(status, body) => (status, body.into_bytes()),
            Reply::Bytes(len) => (200, vec![b'x'; len]),
            Reply::Silent => (0, Vec::new()),
        };
        if status != 0 {
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&body).await;
            let _ = stream.flush().await;
        }
    }
    // Until the client goes (a silent server holds the connection that long).
    let mut sink = [0u8; 1024];
    while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    lock(&seen).closed += 1;
    changed.notify_waiters();
}

/// One request: its head, then a `content-length` body. `None` if the client went first.
async fn read_request(stream: &mut TcpStream) -> Option<Received> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_owned(), first.next()?.to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let chunked =
        headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let mut rest = buf[head_end + 4..].to_vec();
    let body = if chunked {
        // Chunks until the empty one (no trailers).
        loop {
            if let Some(body) = dechunk(&rest) {
                break body;
            }
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            rest.extend_from_slice(&chunk[..n]);
        }
    } else {
        while rest.len() < length {
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            rest.extend_from_slice(&chunk[..n]);
        }
        rest
    };
    Some(Received { method, path, headers, body })
}

/// The body of a complete chunked encoding in `bytes`, or `None` while it is incomplete.
fn dechunk(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + bytes.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&bytes[at..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        let data = line_end + 2;
        if size == 0 {
            return bytes.get(data..data + 2).map(|_| body);
        }
        body.extend_from_slice(bytes.get(data..data + size)?);
        at = data + size + 2;
    }
}
