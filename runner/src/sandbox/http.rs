//! Outbound HTTP for components: the one way a guest reaches another machine, and everything
//! that limits and accounts for it.
//!
//! Owns: [`Egress`] (the `wasi:http` hooks of one run: its policy, limits and counters) and
//! how one request is sent: admit, resolve, vet, connect, TLS, HTTP/1.1, bounded body.
//!
//! Invariants:
//! - before anything else a request counts against `max_requests`, refused ones included,
//!   and its host and port must pass [`EgressPolicy::allows_host`]; a request that fails
//!   either is the `wasi:http` error `HTTP-request-denied`, and no name is looked up and no
//!   connection opened for it;
//! - the host is resolved here, then every address is checked with
//!   [`EgressPolicy::allows_address`], and only a vetted address is connected to (the address
//!   checked is the address dialled, so no DNS answer can turn a listed name into a private
//!   address); a name that resolves only to refused addresses is `destination-IP-prohibited`;
//! - every refusal also leaves a `sweep: ...` line on the guest's stderr saying why, so the
//!   task's error history names the host and the rule;
//! - redirects reach the guest as the response they are: nothing here follows them;
//! - one request (look-up, connect, TLS, response head, body) ends at `request_timeout`, or
//!   earlier at the guest's own connect and first-byte timeouts; the response bodies of a run
//!   together stop at `max_response_bytes`. Waiting is host time: it counts against the task's
//!   wall clock (which stops the run wherever it waits) and costs no fuel;
//! - a connection's I/O task belongs to the response the guest holds, and wasmtime's spawn
//!   aborts it on drop: when a run ends, its store goes and every socket with it;
//! - [`Egress::usage`] counts requests admitted (`http_requests`), refused (`http_refused`),
//!   request body bytes sent and response body bytes received.
//!
//! HTTPS uses rustls with the Mozilla roots (`webpki-roots`), as wasmtime-wasi-http's own
//! sender does; only HTTP/1.1 is spoken.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Scheme;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::capabilities::{Capabilities, EgressPolicy, HttpLimits, Usage};
use super::pipes::BoundedOutput;

/// The `wasi:http` hooks of one run: where its requests may go, under which limits, and
/// what they used.
pub(crate) struct Egress {
    policy: Arc<EgressPolicy>,
    limits: HttpLimits,
    counters: Arc<Counters>,
    stderr: BoundedOutput,
}

/// What a run's requests used; shared with the tasks that send them and their bodies.
#[derive(Debug, Default)]
struct Counters {
    /// Requests the guest asked for, refused ones included (the limit applies to these).
    asked: AtomicU32,
    admitted: AtomicU32,
    refused: AtomicU32,
    sent: AtomicU64,
    received: AtomicU64,
}

/// Where an admitted request goes.
struct Target {
    host: String,
    port: u16,
    https: bool,
}

impl Egress {
    pub(crate) fn new(capabilities: &Capabilities, stderr: &BoundedOutput) -> Egress {
        Egress {
            policy: Arc::clone(&capabilities.egress),
            limits: capabilities.http,
            counters: Arc::default(),
            stderr: stderr.clone(),
        }
    }

    /// Requests the guest asked for so far, refused ones included.
    pub(crate) fn asked(&self) -> u32 {
        self.counters.asked.load(Ordering::Relaxed)
    }

    /// Adds what the run's requests used so far to `usage`.
    pub(crate) fn add_usage(&self, usage: &mut Usage) {
        let c = &self.counters;
        usage.http_requests = c.admitted.load(Ordering::Relaxed);
        usage.http_refused = c.refused.load(Ordering::Relaxed);
        usage.bytes_sent = c.sent.load(Ordering::Relaxed);
        usage.bytes_received = c.received.load(Ordering::Relaxed);
    }

    /// The checks that need no network: the request limit, then the allow list.
    fn admit(&self, uri: &http::Uri) -> Result<Target, Error> {
        let asked = self.counters.asked.fetch_add(1, Ordering::Relaxed);
        if asked >= self.limits.max_requests {
            let why =
                format!("the task's limit of {} requests is reached", self.limits.max_requests);
            return Err(refuse(&self.counters, &self.stderr, &why, Error::HttpRequestDenied));
        }
        let https = uri.scheme() == Some(&Scheme::HTTPS);
        let Some(host) = uri.host() else {
            let why = format!("{uri} names no host");
            return Err(refuse(&self.counters, &self.stderr, &why, Error::HttpRequestUriInvalid));
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        if !self.policy.allows_host(host, port) {
            let why = format!("{host}:{port} is not on the tenant's egress list");
            return Err(refuse(&self.counters, &self.stderr, &why, Error::HttpRequestDenied));
        }
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        Ok(Target { host, port, https })
    }
}

/// Counts a refusal and tells the guest's stderr why.
fn refuse(counters: &Counters, stderr: &BoundedOutput, why: &str, error: Error) -> Error {
    counters.refused.fetch_add(1, Ordering::Relaxed);
    // Stderr keeps its tail and never refuses a write.
    let _ = stderr.append(format!("sweep: outbound request refused: {why}\n").as_bytes());
    error
}

/// Most bytes of a refused request's body read (and dropped) before the refusal is answered:
/// more than any request a handler sends in earnest, and a bound on the host's work for a
/// guest that streams a body into a refusal.
const REFUSED_BODY_READ: usize = 1 << 20;

type SendResult =
    Result<(http::Response<WasiBody>, Box<dyn Future<Output = Result<(), Error>> + Send>), Error>;

impl WasiHttpHooks for Egress {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _request_done: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        let admitted = self.admit(request.uri());
        let policy = Arc::clone(&self.policy);
        let counters = Arc::clone(&self.counters);
        let stderr = self.stderr.clone();
        let limits = self.limits;
        Box::new(async move {
            let deadline = Instant::now() + limits.request_timeout;
            let target = match admitted {
                Ok(target) => target,
                Err(refused) => {
                    // The request's body is read to its end (and dropped; nothing is sent)
                    // before the refusal, until the request deadline at most, as a server that
                    // refuses would. Dropped at once, it closed the stream the guest was still
                    // writing, and StarlingMonkey (componentize-js) then sometimes aborted its
                    // event loop ("event loop error, but no exception is pending") instead of
                    // rejecting `fetch`, depending on which task ran first (seen under load).
                    // A guest that keeps writing is cut off at REFUSED_BODY_READ bytes.
                    let mut body = request.into_body();
                    let drained = async {
                        let mut read = 0;
                        while let Some(Ok(frame)) = body.frame().await {
                            read += frame.data_ref().map_or(0, |data| data.len());
                            if read > REFUSED_BODY_READ {
                                break;
                            }
                        }
                    };
                    let _ = tokio::time::timeout_at(deadline, drained).await;
                    return Err(refused);
                }
            };
            send(Sent { target, policy, counters, stderr, limits, deadline, options }, request)
                .await
        })
    }
}

/// One admitted request on its way.
struct Sent {
    target: Target,
    policy: Arc<EgressPolicy>,
    counters: Arc<Counters>,
    stderr: BoundedOutput,
    limits: HttpLimits,
    deadline: Instant,
    options: Option<RequestOptions>,
}

/// A duplex byte stream: TCP, or TLS over TCP.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

async fn send(s: Sent, request: http::Request<WasiBody>) -> SendResult {
    let connect_by = earliest(s.deadline, s.options.and_then(|o| o.connect_timeout));
    let stream = tokio::time::timeout_at(connect_by, connect(&s))
        .await
        .map_err(|_| Error::ConnectionTimeout)??;
    let (mut sender, connection) =
        tokio::time::timeout_at(connect_by, hyper::client::conn::http1::handshake(stream))
            .await
            .map_err(|_| Error::ConnectionTimeout)??;
    // The connection's I/O; aborted when its handle (held by the response) is dropped.
    let io = wasmtime_wasi::runtime::spawn(connection);

    let (mut parts, body) = request.into_parts();
    // Origin form on the wire: the scheme and authority went into the connection.
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = http::Uri::try_from(path).map_err(|_| Error::HttpRequestUriInvalid)?;
    let body = CountSent { inner: body, counters: Arc::clone(&s.counters) };
    let request = http::Request::from_parts(parts, body);

    let first_byte_by = earliest(s.deadline, s.options.and_then(|o| o.first_byte_timeout));
    let response = tokio::time::timeout_at(first_byte_by, sender.send_request(request))
        .await
        .map_err(|_| Error::HttpResponseTimeout)??;
    let response = response.map(|incoming| {
        Limited {
            incoming,
            counters: Arc::clone(&s.counters),
            max_bytes: s.limits.max_response_bytes,
            deadline: Box::pin(tokio::time::sleep_until(s.deadline)),
            failed: false,
        }
        .boxed_unsync()
    });
    let io = async move { io.await.map_err(Error::from) };
    Ok((response, Box::new(io) as Box<dyn Future<Output = _> + Send>))
}

/// `deadline`, or `timeout` from now when that comes first.
fn earliest(deadline: Instant, timeout: Option<Duration>) -> Instant {
    timeout.and_then(|t| Instant::now().checked_add(t)).map_or(deadline, |t| t.min(deadline))
}

/// Resolves the target, vets every address, connects to the first vetted one that answers,
/// and wraps it in TLS for `https`.
async fn connect(s: &Sent) -> Result<TokioIo<Box<dyn Stream>>, Error> {
    let Target { host, port, https } = &s.target;
    let addresses: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, *port)],
        Err(_) => tokio::net::lookup_host((host.as_str(), *port))
            .await
            .map_err(|e| Error::DnsError { rcode: Some(e.to_string()), info_code: None })?
            .collect(),
    };
    let vetted: Vec<SocketAddr> =
        addresses.iter().copied().filter(|a| s.policy.allows_address(*a)).collect();
    if vetted.is_empty() {
        let shown: Vec<String> = addresses.iter().map(|a| a.ip().to_string()).collect();
        let why = format!(
            "{host} resolves to {} only, which are not public addresses; an egress entry naming the IP literal allows one",
            shown.join(", ")
        );
        return Err(refuse(&s.counters, &s.stderr, &why, Error::DestinationIpProhibited));
    }
    s.counters.admitted.fetch_add(1, Ordering::Relaxed);

    let mut last = None;
    let mut tcp = None;
    for address in vetted {
        match TcpStream::connect(address).await {
            Ok(stream) => {
                tcp = Some(stream);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(tcp) = tcp else {
        return Err(last.map_or(Error::ConnectionRefused, Error::Connect));
    };
    // Small requests and responses: do not wait to fill a segment.
    let _ = tcp.set_nodelay(true);
    if !https {
        return Ok(TokioIo::new(Box::new(tcp)));
    }
    let name = match host.parse::<IpAddr>() {
        Ok(ip) => rustls::pki_types::ServerName::IpAddress(ip.into()),
        Err(_) => rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|_| Error::HttpRequestUriInvalid)?,
    };
    let tls = tokio_rustls::TlsConnector::from(tls_config()?)
        .connect(name, tcp)
        .await
        .map_err(Error::Tls)?;
    Ok(TokioIo::new(Box::new(tls)))
}

/// The process's TLS client settings: rustls with ring and the Mozilla roots.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, Error> {
    static CONFIG: OnceLock<Option<Arc<rustls::ClientConfig>>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        // ring, as wasmtime-wasi-http's own sender has it. rustls deprecates it for lacking
        // post-quantum key exchange; aws-lc-rs has that but builds a C library with cmake.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
        match rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
        {
            Ok(builder) => {
                Some(Arc::new(builder.with_root_certificates(roots).with_no_client_auth()))
            }
            Err(e) => {
                tracing::error!(error = %e, "no TLS client configuration: https requests fail");
                None
            }
        }
    });
    config.clone().ok_or(Error::TlsProtocolError)
}

/// A request body that counts the bytes it hands to the connection.
struct CountSent {
    inner: WasiBody,
    counters: Arc<Counters>,
}

impl Body for CountSent {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &frame {
            if let Some(data) = frame.data_ref() {
                self.counters.sent.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body held to the run's byte budget and the request's deadline.
struct Limited {
    incoming: hyper::body::Incoming,
    counters: Arc<Counters>,
    max_bytes: u64,
    deadline: Pin<Box<Sleep>>,
    /// Over the budget or past the deadline: every later poll fails the same way.
    failed: bool,
}

impl Body for Limited {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(Some(Err(Error::HttpResponseIncomplete)));
        }
        match Pin::new(&mut this.incoming).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    let total = this.counters.received.fetch_add(n, Ordering::Relaxed) + n;
                    if total > this.max_bytes {
                        this.failed = true;
                        return Poll::Ready(Some(Err(Error::HttpResponseBodySize(Some(
                            this.max_bytes,
                        )))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Error::from(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.failed = true;
                    Poll::Ready(Some(Err(Error::HttpResponseTimeout)))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}
