//! Handlers written in other languages (`guests/`, built by `scripts/build-guests.sh`) run
//! through the real sandbox under the same contract and limits as the Rust modules: a result
//! that depends on the payload, stderr kept, exit 100 on bad input, and fuel, memory and
//! output limits that stop them with the same outcome kinds. Where a Rust module has the same
//! contract (`checksum`) the two must agree byte for byte. A guest that was not built fails
//! these tests (the module path is in the panic message): they never skip.

mod common;

use std::time::Duration;

use serde_json::{json, Value};
use sweep::sandbox::{
    Capabilities, CompiledModule, Execution, Limits, Outcome, Sandbox, TaskInput,
};

const C_WORDCOUNT: &str = "c-wordcount";
const ZIG_CHECKSUM: &str = "zig-checksum";

use sweep_dev::testing::{both_allocators as both, shared_sandbox as sandbox};

fn limits() -> Limits {
    Limits {
        fuel: 500_000_000,
        timeout: Duration::from_secs(10),
        memory_bytes: 16 << 20,
        output_bytes: 64 << 10,
    }
}

fn compile(sb: &Sandbox, name: &str) -> CompiledModule {
    sb.compile(&common::module_bytes(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Runs `module` on raw payload bytes (which need not be valid JSON) as attempt 2 of 5.
async fn run_raw(
    sb: &Sandbox,
    module: &CompiledModule,
    payload: &[u8],
    limits: Limits,
) -> Execution {
    let input = TaskInput {
        task_id: "task-7".into(),
        task_type: "guest".into(),
        attempt: 2,
        max_attempts: 5,
        payload: payload.to_vec(),
        capabilities: Capabilities::none(),
        reuse: None,
    };
    sb.run(module, &input, &limits).await
}

async fn run(sb: &Sandbox, module: &CompiledModule, payload: &Value) -> Execution {
    run_raw(sb, module, &serde_json::to_vec(payload).expect("json"), limits()).await
}

/// Words as c-wordcount splits them: on C's `isspace` set, which unlike Rust's
/// `split_ascii_whitespace` includes the vertical tab.
fn words(text: &str) -> usize {
    text.split([' ', '\t', '\n', '\u{b}', '\u{c}', '\r']).filter(|w| !w.is_empty()).count()
}

/// What c-wordcount must answer, computed independently of the guest (see its header).
fn wc(text: &str) -> Value {
    json!({
        "words": words(text),
        "lines": text.lines().count(),
        "chars": text.chars().count(),
        "bytes": text.len(),
    })
}

fn permanent_message(exec: &Execution) -> String {
    match &exec.outcome {
        Outcome::HandlerError { permanent: true, exit_code: 100, message } => message.clone(),
        other => panic!("expected a permanent handler error (exit 100), got {other:?}"),
    }
}

#[test]
fn guests_pass_upload_validation_as_wasi_commands() {
    for name in [C_WORDCOUNT, ZIG_CHECKSUM] {
        let bytes = common::module_bytes(name);
        let info = sandbox(true).validate_module(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            info.wasi_imports.iter().any(|i| i == "fd_read"),
            "{name}: {:?}",
            info.wasi_imports
        );
        assert!(
            info.wasi_imports.iter().any(|i| i == "fd_write"),
            "{name}: {:?}",
            info.wasi_imports
        );
    }
}

#[tokio::test]
async fn c_wordcount_counts_the_payload_text_and_logs_to_stderr() {
    let texts = [
        "a b a",
        "",
        "one\n",
        "  leading and trailing  \t",
        "tabs\tand\nnew\r\nlines\n\nx",
        "vertical\u{b}tab and form\u{c}feed split words",
        "Grüße, GRÜSSE und 東京 🦀",
        "quote \" backslash \\ slash / nul-free control \u{1} \u{7f}",
        "no-final-newline\nsecond",
    ];
    for sb in both() {
        let module = compile(sb, C_WORDCOUNT);
        for text in texts {
            let exec = run(sb, &module, &json!({ "text": text })).await;
            assert_eq!(exec.outcome, Outcome::Success(wc(text)), "{text:?}: {}", exec.stderr);
            let log = format!(
                "c-wordcount: task task-7 attempt 2/5: {} words in {} lines",
                words(text),
                text.lines().count()
            );
            assert_eq!(exec.stderr.trim(), log, "{text:?}: stderr is the guest's log");
            assert!(exec.usage.fuel_used > 0 && exec.usage.fuel_used < limits().fuel);
        }
    }
}

#[tokio::test]
async fn c_wordcount_decodes_every_json_escape() {
    let sb = sandbox(true);
    let module = compile(sb, C_WORDCOUNT);
    // serde_json writes most characters raw; these escapes come only from hand-written JSON.
    let raw = br#"{ "text" : "a\u0020b\tc\nd\/e\u00e9\ud83e\udd80\"\\\b\f\r" }"#;
    let exec = run_raw(sb, &module, raw, limits()).await;
    let text = "a b\tc\nd/e\u{e9}\u{1f980}\"\\\u{8}\u{c}\r";
    assert_eq!(exec.outcome, Outcome::Success(wc(text)), "{}", exec.stderr);
}

#[tokio::test]
async fn c_wordcount_agrees_with_the_rust_wordcount_on_lines_and_chars() {
    let sb = sandbox(true);
    let (c, rust) = (compile(sb, C_WORDCOUNT), compile(sb, "wordcount"));
    for text in ["", "x", "one\ntwo\r\n\nfour", "é\n東京\n", "trailing\n\n"] {
        let payload = json!({ "text": text });
        let (Outcome::Success(c_out), Outcome::Success(rust_out)) =
            (run(sb, &c, &payload).await.outcome, run(sb, &rust, &payload).await.outcome)
        else {
            panic!("{text:?}: both should succeed");
        };
        assert_eq!((&c_out["lines"], &c_out["chars"]), (&rust_out["lines"], &rust_out["chars"]));
    }
}

#[tokio::test]
async fn c_wordcount_rejects_bad_payloads_permanently_with_a_reason() {
    let cases: [(&[u8], &str); 13] = [
        (b"", "empty input"),
        (b"[]", "expected an object"),
        (b"null", "expected an object"),
        (br#"{"text": 5}"#, "`text` must be a string"),
        (br#"{"txt": "x"}"#, "unknown field `txt`"),
        (br#"{"a\nb\u0000": "x"}"#, "unknown field `a?b?`"),
        (br#"{}"#, "missing field `text`"),
        (br#"{"text": "a", "text": "b"}"#, "duplicate field `text`"),
        (br#"{"text": "a",}"#, "expected a string at byte offset 13"),
        (br#"{"text": "a"} {}"#, "trailing characters"),
        (br#"{"text": "\ud800"}"#, "lone high surrogate"),
        (b"{\"text\": \"\xff\"}", "invalid UTF-8"),
        (br#"{"text": "unterminated"#, "unterminated string"),
    ];
    for sb in both() {
        let module = compile(sb, C_WORDCOUNT);
        for (payload, reason) in cases {
            let exec = run_raw(sb, &module, payload, limits()).await;
            let message = permanent_message(&exec);
            let shown = String::from_utf8_lossy(payload);
            assert!(
                message.starts_with("c-wordcount: invalid task payload: "),
                "{shown}: {message}"
            );
            assert!(message.contains(reason), "{shown}: {message:?} lacks {reason:?}");
        }
    }
}

fn checksum_payloads() -> Vec<Value> {
    let long = "0123456789abcdef".repeat(4096);
    let mut payloads = vec![
        json!({"data": "abc"}),
        json!({"data": ""}),
        json!({"data": "héllo 東京 🦀\n", "algorithm": "sha224"}),
        json!({"data": "abc", "algorithm": " SHA-384 "}),
        json!({"data": long, "algorithm": "Sha512"}),
    ];
    payloads.push(json!({"algorithm": "sha-256", "data": "field order does not matter"}));
    payloads
}

#[tokio::test]
async fn zig_checksum_agrees_with_the_rust_checksum() {
    for sb in both() {
        let (zig, rust) = (compile(sb, ZIG_CHECKSUM), compile(sb, "checksum"));
        for payload in checksum_payloads() {
            let (z, r) = (run(sb, &zig, &payload).await, run(sb, &rust, &payload).await);
            assert!(z.outcome.is_success(), "{payload}: {:?} {}", z.outcome, z.stderr);
            assert_eq!(z.outcome, r.outcome, "{payload}");
        }
        // FIPS 180-2 "abc", so agreement is not agreement on a wrong answer.
        let exec = run(sb, &zig, &json!({"data": "abc"})).await;
        let want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(exec.outcome, Outcome::Success(json!({"algorithm": "sha256", "hex": want})));
        assert_eq!(exec.stderr.trim(), "zig-checksum: task task-7 attempt 2/5: sha256 of 3 bytes");
    }
}

#[tokio::test]
async fn zig_checksum_unknown_algorithm_is_permanent_with_the_rust_message() {
    let sb = sandbox(true);
    let (zig, rust) = (compile(sb, ZIG_CHECKSUM), compile(sb, "checksum"));
    for algorithm in ["md5", "sha-1", "sha256\"\n"] {
        let payload = json!({"data": "abc", "algorithm": algorithm});
        let z = permanent_message(&run(sb, &zig, &payload).await);
        let r = permanent_message(&run(sb, &rust, &payload).await);
        assert_eq!(z, format!("zig-checksum: {r}"), "{payload}");
    }
}

#[tokio::test]
async fn zig_checksum_rejects_bad_payloads_permanently_with_a_reason() {
    let cases: [(&[u8], &str); 7] = [
        (b"", "UnexpectedEndOfInput"),
        (b"[1]", "UnexpectedToken"),
        (br#"{"algorithm": "sha256"}"#, "MissingField"),
        (br#"{"data": 5}"#, "UnexpectedToken"),
        (br#"{"data": "x", "extra": 1}"#, "UnknownField"),
        (br#"{"data": "x", "data": "y"}"#, "DuplicateField"),
        (br#"{"data": "x"} trailing"#, "SyntaxError"),
    ];
    for sb in both() {
        let module = compile(sb, ZIG_CHECKSUM);
        for (payload, reason) in cases {
            let exec = run_raw(sb, &module, payload, limits()).await;
            let message = permanent_message(&exec);
            let shown = String::from_utf8_lossy(payload);
            assert!(
                message.starts_with("zig-checksum: invalid task payload: "),
                "{shown}: {message}"
            );
            assert!(message.contains(reason), "{shown}: {message:?} lacks {reason:?}");
        }
    }
}

/// The limits are the host's, whatever language the guest is in.
#[tokio::test]
async fn guests_are_stopped_by_fuel_memory_and_output_limits() {
    let big_text = json!({ "text": "word ".repeat(600_000) });
    let big_data = json!({ "data": "x".repeat(3 << 20) });
    for sb in both() {
        for (name, small, big) in [
            (C_WORDCOUNT, json!({"text": "a b"}), big_text.clone()),
            (ZIG_CHECKSUM, json!({"data": "abc"}), big_data.clone()),
        ] {
            let module = compile(sb, name);
            let bytes = |v: &Value| serde_json::to_vec(v).expect("json");

            let fuel = Limits { fuel: 10_000, ..limits() };
            let exec = run_raw(sb, &module, &bytes(&small), fuel).await;
            assert_eq!(exec.outcome, Outcome::OutOfFuel, "{name}");

            // The payload is read whole into linear memory: 3 MiB cannot fit in 2 MiB.
            let memory = Limits { memory_bytes: 2 << 20, fuel: 100_000_000_000, ..limits() };
            let exec = run_raw(sb, &module, &bytes(&big), memory).await;
            assert_eq!(exec.outcome, Outcome::MemoryLimit, "{name}: {}", exec.stderr);

            let output = Limits { output_bytes: 16, ..limits() };
            let exec = run_raw(sb, &module, &bytes(&small), output).await;
            assert_eq!(exec.outcome, Outcome::OutputTooLarge, "{name}");

            // The same big payload fits once the limit allows it.
            let roomy = Limits { memory_bytes: 32 << 20, fuel: 100_000_000_000, ..limits() };
            let exec = run_raw(sb, &module, &bytes(&big), roomy).await;
            assert!(exec.outcome.is_success(), "{name}: {:?} {}", exec.outcome, exec.stderr);
        }
    }
}
