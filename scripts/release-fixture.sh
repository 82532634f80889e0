#!/usr/bin/env bash
# Writes runner/tests/fixtures/last-release/: a database as this checkout's `sweep` leaves it,
# for runner/tests/upgrade.rs, which restores it, upgrades it with the `sweep migrate` of a
# later checkout and runs its waiting tasks under its old tokens.
#
# Run it at a release's commit, with the server at DATABASE_URL (default: the local one):
#
#   git worktree add /tmp/sweep-release vX.Y.Z-commit && cd /tmp/sweep-release
#   scripts/release-fixture.sh
#   cp -r runner/tests/fixtures/last-release <the checkout>/runner/tests/fixtures/
#
# With the binary it just built, in a throwaway database: `sweep migrate`, a tenant `acme`
# (`sweep tenant create`) with a read-only token (`sweep tenant token`), the module `echo`
# (below; it writes its payload back as its result) uploaded and three tasks enqueued through
# `sweep admin` with the CLI, one with a dedup key; then a plain-SQL dump of the
# database (pg_dump --column-inserts, so the test can run it as statements; named .dump, not
# .sql: it is data, and its copies of the functions are the release's, not source) and the
# tokens.
set -euo pipefail
cd "$(dirname "$0")/.."

out=runner/tests/fixtures/last-release
server="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
database="sweep_release_fixture_$$"
url="${server%/*}/$database"
port=$((20000 + $$ % 20000))
work="$(mktemp -d)"
admin_pid=
cleanup() {
  [ -n "$admin_pid" ] && kill "$admin_pid" 2>/dev/null && wait "$admin_pid" 2>/dev/null
  psql -qAtX "${server%/*}/postgres" -c "drop database if exists $database" >/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

cargo build -q -p sweep --bin sweep
sweep="${CARGO_TARGET_DIR:-target}/debug/sweep"
version="$("$sweep" --version | awk '{print $2}')"
json_field() { python3 -c "import json, sys; print(json.load(sys.stdin)['$1'])"; }

"$sweep" migrate --database-url "$url" >/dev/null
token="$("$sweep" tenant create acme --json --database-url "$url" | json_field token)"
read_only="$("$sweep" tenant token acme --read-only --json --database-url "$url" | json_field token)"

# The module, assembled from:
#   (module
#     (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
#     (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
#     (memory (export "memory") 1)
#     (func (export "_start")
#       (i32.store (i32.const 0) (i32.const 16))
#       (i32.store (i32.const 4) (i32.const 65000))
#       (drop (call $read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
#       (i32.store (i32.const 4) (i32.load (i32.const 8)))
#       (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 12)))))
printf '%b' '\x00\x61\x73\x6d\x01\x00\x00\x00\x01\x0c\x02\x60\x04\x7f\x7f\x7f\x7f\x01\x7f\x60\x00\x00\x02\x44\x02\x16\x77\x61\x73\x69\x5f\x73\x6e\x61\x70\x73\x68\x6f\x74\x5f\x70\x72\x65\x76\x69\x65\x77\x31\x07\x66\x64\x5f\x72\x65\x61\x64\x00\x00\x16\x77\x61\x73\x69\x5f\x73\x6e\x61\x70\x73\x68\x6f\x74\x5f\x70\x72\x65\x76\x69\x65\x77\x31\x08\x66\x64\x5f\x77\x72\x69\x74\x65\x00\x00\x03\x02\x01\x01\x05\x03\x01\x00\x01\x07\x13\x02\x06\x6d\x65\x6d\x6f\x72\x79\x02\x00\x06\x5f\x73\x74\x61\x72\x74\x00\x02\x0a\x34\x01\x32\x00\x41\x00\x41\x10\x36\x02\x00\x41\x04\x41\xe8\xfb\x03\x36\x02\x00\x41\x00\x41\x00\x41\x01\x41\x08\x10\x00\x1a\x41\x04\x41\x08\x28\x02\x00\x36\x02\x00\x41\x01\x41\x00\x41\x01\x41\x0c\x10\x01\x1a\x0b' \
  >"$work/echo.wasm"

"$sweep" admin --database-url "$url" --admin-addr "127.0.0.1:$port" >"$work/admin.log" 2>&1 &
admin_pid=$!
export SWEEP_URL="http://127.0.0.1:$port" SWEEP_TOKEN="$token"
for _ in $(seq 1 100); do
  "$sweep" module list >/dev/null 2>&1 && break
  kill -0 "$admin_pid" 2>/dev/null || { cat "$work/admin.log"; exit 1; }
  sleep 0.1
done
"$sweep" module upload echo "$work/echo.wasm" >/dev/null
"$sweep" enqueue echo '{"n": 1, "text": "first"}' >/dev/null
"$sweep" enqueue echo '{"n": 2, "text": "second"}' --priority 5 >/dev/null
"$sweep" enqueue echo '{"n": 3, "text": "once"}' --dedup-key once >/dev/null
kill "$admin_pid" && wait "$admin_pid" 2>/dev/null || true
admin_pid=

mkdir -p "$out"
{
  echo "-- A database written by sweep $version at commit $(git rev-parse --short HEAD), by"
  echo "-- scripts/release-fixture.sh: restored and upgraded by runner/tests/upgrade.rs."
  # (Recent pg_dump releases frame the dump in psql's \restrict; the test runs plain SQL.)
  pg_dump --no-owner --column-inserts "$url" | grep -v '^\\\(un\)\{0,1\}restrict '
} >"$out/database.dump"
python3 - "$out/tokens.json" "$version" "$token" "$read_only" <<'EOF'
import json, sys
path, version, token, read_only = sys.argv[1:]
with open(path, "w") as f:
    json.dump({"sweep": version, "tenant": "acme", "token": token, "read_only_token": read_only},
              f, indent=2)
    f.write("\n")
EOF
echo "wrote $out (sweep $version)"
