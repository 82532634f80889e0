//! `component-probe`: a test component that does what its payload's `do` says, so the
//! sandbox's tests can drive a component through every limit and capability:
//!
//! - `echo`: writes the payload back;
//! - `env`: returns the environment as an object;
//! - `exit`: writes `message` to stderr and exits with `code` (`exit-with-code`);
//! - `spin`: loops forever (fuel, wall clock);
//! - `sleep`: sleeps `ms` milliseconds in the host (wall clock, not fuel);
//! - `grow`: allocates `mib` MiB (memory limit);
//! - `flood`: writes to stdout forever (output limit);
//! - `fetch`: sends each of `requests` (`{"url", "method"?, "body"?}`) in turn and returns,
//!   for each, `{"status", "bytes"}` or `{"error"}` (the `wasi:http` error as debug text).

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{json, Map, Value};
use wstd::http::{Body, Client, Method, Request};

#[wstd::main]
async fn main() {
    let mut text = String::new();
    let _ = std::io::stdin().read_to_string(&mut text);
    let payload: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let result = match payload["do"].as_str().unwrap_or("echo") {
        "env" => Value::Object(std::env::vars().map(|(k, v)| (k, Value::String(v))).collect()),
        "exit" => {
            eprintln!("{}", payload["message"].as_str().unwrap_or("exiting"));
            let code = payload["code"].as_u64().unwrap_or(1);
            wasip2::cli::exit::exit_with_code(u8::try_from(code).unwrap_or(255));
            Value::Null
        }
        "spin" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "sleep" => {
            let ms = payload["ms"].as_u64().unwrap_or(0);
            wstd::task::sleep(Duration::from_millis(ms).into()).await;
            json!({ "slept_ms": ms })
        }
        "grow" => {
            let mib = payload["mib"].as_u64().unwrap_or(1) as usize;
            let block = std::hint::black_box(vec![1u8; mib << 20]);
            json!({ "bytes": block.len() })
        }
        "flood" => {
            let line = [b'x'; 1024];
            let mut out = std::io::stdout();
            loop {
                if out.write_all(&line).is_err() {
                    break Value::Null;
                }
            }
        }
        "fetch" => {
            let mut results = Vec::new();
            for request in payload["requests"].as_array().cloned().unwrap_or_default() {
                results.push(fetch(&request).await);
            }
            Value::Array(results)
        }
        _ => payload,
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{result}");
    let _ = out.flush();
}

async fn fetch(request: &Value) -> Value {
    let url = request["url"].as_str().unwrap_or_default();
    let method = match request["method"].as_str() {
        Some("POST") => Method::POST,
        _ => Method::GET,
    };
    let body = match &request["body"] {
        Value::Null => Body::empty(),
        body => Body::from(body.to_string()),
    };
    let built = Request::builder().method(method).uri(url).body(body);
    let request = match built {
        Ok(request) => request,
        Err(e) => return json!({ "error": format!("bad request: {e}") }),
    };
    let response = match Client::new().send(request).await {
        Ok(response) => response,
        Err(e) => return json!({ "error": format!("{e:?}") }),
    };
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut answer = Map::new();
    answer.insert("status".into(), json!(status));
    match body.contents().await {
        Ok(bytes) => answer.insert("bytes".into(), json!(bytes.len())),
        Err(e) => answer.insert("error".into(), json!(format!("{e:?}"))),
    };
    Value::Object(answer)
}
