#!/usr/bin/env bash
# Fuzzes the admin API from its own OpenAPI document with Schemathesis 4.32.5 (pinned in
# .ci/run): a database of its own on the Postgres at DATABASE_URL (dropped afterwards), a
# `sweep run` serving the API on a free local port, tenants and tokens, real modules and tasks
# in every state, then `st run` against /v1/openapi.json once per kind of token (read-only,
# tenant, operator). Every answer must be documented (status, content type, headers, schema),
# schema-invalid input refused, schema-valid input never called malformed, and none may be a
# 5xx. Exits non-zero on any failure; prints the cases schemathesis ran, the requests the
# server answered by status, and every failure with a curl line that reproduces it.
#
#   scripts/fuzz-api.sh                 short form (CI)
#   SWEEP_FUZZ=long scripts/fuzz-api.sh about twice as many cases
#   scripts/fuzz-api.sh --seed 7        extra options go to every `st run`
#
# Uses $SWEEP_BIN, else the debug `sweep` the test run built in $CARGO_TARGET_DIR (else
# target/), building it only when missing; the modules from scripts/build-modules.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

base_url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
target="${CARGO_TARGET_DIR:-$PWD/target}"
sweep="${SWEEP_BIN:-$target/debug/sweep}"
modules="$target/wasm32-wasip1/wasm"
case "${SWEEP_FUZZ:-short}" in
  short) examples=25 ;;
  long) examples=100 ;;
  *) echo "SWEEP_FUZZ must be short or long, not ${SWEEP_FUZZ}" >&2; exit 2 ;;
esac

# `python3 -m` rather than `st`: a fresh pip install need not have put `st` on PATH. (The
# prepare script's Python environment, if it made one, leads PATH.)
# shellcheck source=prepare.sh
. scripts/prepare.sh
st() { python3 -m schemathesis.cli "$@"; }
st --version >/dev/null 2>&1 \
  || { echo "schemathesis is not installed: scripts/prepare.sh schemathesis" >&2; exit 2; }
if [ ! -x "$sweep" ]; then
  cargo build -q --workspace --bin sweep
fi
for m in wordcount permanent; do
  [ -f "$modules/$m.wasm" ] || scripts/build-modules.sh "$m" >/dev/null
done

work="$(mktemp -d)"
db_name="sweep_fuzz_$$"
db_url="${base_url%/*}/$db_name"
admin_url="${base_url%/*}/postgres"
runner_pid=""
cleanup() {
  status=$?
  if [ -n "$runner_pid" ]; then
    kill -TERM "$runner_pid" 2>/dev/null || true
    wait "$runner_pid" 2>/dev/null || true
  fi
  psql -qX "$admin_url" -c "drop database if exists $db_name with (force)" >/dev/null 2>&1 || true
  if [ "$status" -ne 0 ] && [ -f "$work/runner.log" ]; then
    echo "--- runner log (last 40 lines) ---" >&2
    tail -n 40 "$work/runner.log" >&2
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
json_field() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }

export DATABASE_URL="$db_url"
SWEEP_OPERATOR_TOKEN="fuzz-operator-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
export SWEEP_OPERATOR_TOKEN
# Secrets are sealed under this key (the API answers 503 to a secret's PUT without one).
SWEEP_SECRETS_KEY="$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
export SWEEP_SECRETS_KEY
"$sweep" migrate >/dev/null
tenant_token="$("$sweep" tenant create acme --json | json_field '["token"]')"
"$sweep" tenant create other --json >/dev/null
read_only_token="$("$sweep" tenant token acme --read-only --json | json_field '["token"]')"

port="$(free_port)"
api="http://127.0.0.1:$port"
NO_COLOR=1 RUST_LOG="warn,sweep::admin::filters=debug" "$sweep" run --admin-addr "127.0.0.1:$port" \
  --concurrency 2 >"$work/runner.log" 2>&1 &
runner_pid=$!
for _ in $(seq 1 600); do
  curl -fs "$api/healthz" >/dev/null 2>&1 && break
  kill -0 "$runner_pid" 2>/dev/null || { echo "sweep run exited" >&2; exit 1; }
  sleep 0.1
done
curl -fs "$api/healthz" >/dev/null

# Modules and tasks, so that the ids and names the fuzzer draws from exist: a task that
# succeeded, one that died, one that waits; for tenant acme and for the operator's default.
call() { # METHOD PATH TOKEN [curl args...]
  local method=$1 path=$2 token=$3
  shift 3
  curl -fsS -X "$method" -H "Authorization: Bearer $token" "$@" "$api$path"
}
enqueue() { # TOKEN JSON -> id
  call POST /v1/tasks "$1" -H 'content-type: application/json' -d "$2" | json_field '["id"]'
}
ids=()
for token in "$tenant_token" "$SWEEP_OPERATOR_TOKEN"; do
  for upload in wordcount:wordcount fails:permanent; do
    call PUT "/v1/modules/${upload%%:*}" "$token" -H 'content-type: application/wasm' \
      --data-binary "@$modules/${upload#*:}.wasm" >/dev/null
  done
  call PUT /v1/secrets/MAIL_API_KEY "$token" -H 'content-type: application/json' \
    -d '{"value": "fuzz-secret-value"}' >/dev/null
  ids+=("$(enqueue "$token" '{"task_type": "wordcount", "payload": {"text": "a b a"}}')")
  ids+=("$(enqueue "$token" '{"task_type": "fails", "max_attempts": 1}')")
  ids+=("$(enqueue "$token" '{"task_type": "wordcount", "delay_ms": 36000000, "dedup_key": "later"}')")
done
for id in "${ids[@]}"; do
  for _ in $(seq 1 300); do
    state="$(call GET "/v1/tasks/$id" "$SWEEP_OPERATOR_TOKEN" | json_field '["state"]')"
    case "$state" in succeeded | dead | pending) break ;; esac
    sleep 0.1
  done
done

csv() { local IFS=,; echo "$*"; }
cat >"$work/schemathesis.toml" <<EOF
# Written by scripts/fuzz-api.sh for one run.
hooks = "$PWD/scripts/fuzz-api-hooks.py"
# Nothing kept between runs (no .schemathesis/ in the checkout): a run is its seed.
cache = { enabled = false }
generation = { database = "none" }

[dictionaries.task_ids]
values = [$(csv "${ids[@]}"), 999999]
[dictionaries.task_types]
values = ["wordcount", "fails", "nope"]
[dictionaries.tenants]
values = ["acme", "other", "default", "nobody"]

[parameters]
"path.id" = { dictionary = "task_ids", probability = 0.5 }
"path.task_type" = { dictionary = "task_types", probability = 0.5 }
"path.name" = { dictionary = "tenants", probability = 0.5 }
"query.tenant" = { dictionary = "tenants", probability = 0.5 }
"query.task_type" = { dictionary = "task_types", probability = 0.5 }
"body.task_type" = { dictionary = "task_types", probability = 0.5 }

# Repeated query parameters are refused (400); let the coverage phase send them.
[phases.coverage]
generate-duplicate-query-parameters = true

# A schema-valid request may still be refused for what it means (a task type without a
# module, bytes that are not wasm, a date out of range: 422; a body over a tenant's cap: 413;
# a tenant token naming another tenant: 403), never called malformed (400).
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "413", "422", "5xx"]
EOF

checks="not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance"
checks="$checks,positive_data_acceptance,negative_data_rejection,missing_required_header"
checks="$checks,unsupported_method,allow_header_conformance,ignored_auth,use_after_free"
checks="$checks,ensure_resource_availability"
failed=0
setup_lines="$(wc -l <"$work/runner.log")"
# One worker: with two, hypothesis's lambda descriptions (ast.parse in threads) crash on
# CPython 3.11 ("AST constructor recursion depth mismatch").
for who in read_only tenant operator; do
  case "$who" in
    read_only) token="$read_only_token" ;;
    tenant) token="$tenant_token" ;;
    operator) token="$SWEEP_OPERATOR_TOKEN" ;;
  esac
  echo "== schemathesis as the $who token"
  SECONDS=0
  # From $work: schemathesis and hypothesis keep state in the working directory.
  if ! (cd "$work" && st --config-file "$work/schemathesis.toml" run "$api/v1/openapi.json" \
    --checks "$checks" --mode all --max-examples "$examples" --workers 1 --seed 1 \
    -H "Authorization: Bearer $token" --no-color "$@" \
    --report json --report-json-path "$work/$who.json") >"$work/$who.out" 2>&1; then
    failed=1
    cat "$work/$who.out"
  else
    tail -n 12 "$work/$who.out"
  fi
  [ -f "$work/$who.json" ] || { echo "   schemathesis wrote no report" >&2; failed=1; continue; }
  python3 - "$work/$who.json" "$SECONDS" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
cases = report["test_cases"]
print(f"   {cases['generated']} cases, {cases['unique_failures']} unique failures, "
      f"{len(report['errors'])} errors, {sys.argv[2]} s")
PY
done

# What the server itself logged while the fuzzer ran (the setup's requests left out).
tail -n "+$((setup_lines + 1))" "$work/runner.log" >"$work/fuzzed.log"
requests="$(grep -c 'admin API request' "$work/fuzzed.log" || true)"
server_errors="$(grep -c 'admin API request failed' "$work/fuzzed.log" || true)"
echo "== the server answered $requests fuzzed requests, $server_errors with a 5xx"
echo "   by status: $(grep -o 'admin API request.* status=[0-9]*' "$work/fuzzed.log" \
  | sed 's/.*status=//' | sort | uniq -c | awk '{printf "%s%s: %s", sep, $2, $1; sep=", "}')"
if [ "$server_errors" -ne 0 ]; then
  grep 'admin API request failed' "$work/fuzzed.log" | head -n 20
  failed=1
fi
exit "$failed"
