//! `send-email`: a Sweep handler built as a WASI 0.2 component (`wasm32-wasip2`) that sends one
//! email through a mail provider's HTTP API, with `wasi:http` through `wstd`.
//!
//! Contract (docs/guests.md, "Components and outbound HTTP"):
//! - payload (stdin): a JSON object, posted as the request body as it is, except for the
//!   optional `mail_api_url` field, which says where to post it and is taken out first;
//! - the API's URL: the payload's `mail_api_url`, else the `MAIL_API_URL` environment
//!   variable (a secret the module names at upload, or the deployment's);
//! - credential: the `MAIL_API_KEY` environment variable (a secret the module names at
//!   upload), sent as `Authorization: Bearer <key>`;
//! - result (stdout): `{"message_id": <the response's "id">, "status": <HTTP status>}`;
//! - failures: a bad payload, no key, no URL, or a 4xx other than 408/429 are permanent (exit
//!   100: a retry would send the same thing); a refused or failed request, a 408/429/5xx, or a
//!   response without an `id` are retryable (exit 1). The reason is the last line of stderr.
//!
//! The host decides where requests may go (the tenant's egress list); a request it refuses
//! fails here as `HttpRequestDenied`, before any connection.

use std::io::{Read, Write};

use serde_json::{json, Map, Value};
use wstd::http::{Body, Client, Method, Request};

/// Exit code of a failure that must not be retried (Sweep's contract).
const PERMANENT: u8 = 100;
/// Exit code of a failure worth retrying.
const RETRYABLE: u8 = 1;

/// A failure and whether retrying can help.
struct Failure {
    code: u8,
    message: String,
}

fn permanent(message: impl Into<String>) -> Failure {
    Failure { code: PERMANENT, message: message.into() }
}

fn retryable(message: impl Into<String>) -> Failure {
    Failure { code: RETRYABLE, message: message.into() }
}

#[wstd::main]
async fn main() {
    match send().await {
        Ok(result) => {
            let mut out = std::io::stdout();
            // Nothing useful to do if stdout is gone: the host reports it.
            let _ = writeln!(out, "{result}");
            let _ = out.flush();
        }
        Err(failure) => {
            eprintln!("{}", failure.message.replace('\n', " "));
            // `std::process::exit` on wasm32-wasip2 only tells success from failure (code 1);
            // `exit-with-code` carries the code itself.
            wasip2::cli::exit::exit_with_code(failure.code);
        }
    }
}

async fn send() -> Result<Value, Failure> {
    let mut payload = String::new();
    std::io::stdin()
        .read_to_string(&mut payload)
        .map_err(|e| retryable(format!("reading the payload: {e}")))?;
    let mut mail: Map<String, Value> = serde_json::from_str(&payload)
        .map_err(|e| permanent(format!("the payload is not a JSON object: {e}")))?;

    let url = match mail.remove("mail_api_url") {
        Some(Value::String(url)) => url,
        Some(_) => return Err(permanent("mail_api_url must be a string")),
        None => std::env::var("MAIL_API_URL").map_err(|_| {
            permanent("no mail API: set mail_api_url in the payload or MAIL_API_URL")
        })?,
    };
    let key = std::env::var("MAIL_API_KEY")
        .map_err(|_| permanent("MAIL_API_KEY is not set: name it as a secret of the module"))?;

    let body = Body::from_json(&Value::Object(mail))
        .map_err(|e| permanent(format!("encoding the request: {e}")))?;
    let request = Request::builder()
        .method(Method::POST)
        .uri(url.as_str())
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(body)
        .map_err(|e| permanent(format!("bad request to {url}: {e}")))?;

    let response = Client::new()
        .send(request)
        .await
        .map_err(|e| retryable(format!("POST {url} failed: {e:?}")))?;
    let status = response.status();
    let mut body = response.into_body();
    let text = body
        .str_contents()
        .await
        .map_err(|e| retryable(format!("reading the response of {url}: {e:?}")))?
        .to_owned();
    if !status.is_success() {
        let message = format!("{url} answered {status}: {}", cut(&text, 300));
        let transient = status.is_server_error() || matches!(status.as_u16(), 408 | 429);
        return Err(if transient { retryable(message) } else { permanent(message) });
    }
    let answer: Value = serde_json::from_str(&text)
        .map_err(|e| retryable(format!("{url} answered {status} with no JSON: {e}")))?;
    match answer.get("id") {
        Some(id) if !id.is_null() => Ok(json!({ "message_id": id, "status": status.as_u16() })),
        _ => Err(retryable(format!("{url} answered {status} without an id: {}", cut(&text, 300)))),
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
