#!/usr/bin/env bash
# Drains N no-op jobs with Graphile Worker (benches/compare/graphile/: the pinned version, the
# bench) on the server at DATABASE_URL and prints its jobs/s: the peer Sweep's end-to-end
# throughput is compared with, in the same minutes. npm installs it once, under target/.
#
#   benches/compare/graphile.sh [N]          (default 100000)
#
# env: DATABASE_URL (its server is used), LOCAL=0 for Graphile Worker's default (unbatched)
#      mode, C for its concurrency (24)
# prints: graphile-worker localQueue: 100000 jobs in 3.41s = 29300 jobs/s
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-100000}
server="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
server="${server%/*}"
db=sweep_graphile_bench
dir="${CARGO_TARGET_DIR:-target}/graphile"
command -v node >/dev/null || { echo "graphile.sh: node not found (Debian: nodejs npm)" >&2; exit 2; }
mkdir -p "$dir"
cp benches/compare/graphile/package.json benches/compare/graphile/bench.mjs "$dir/"
if ! cmp -s "$dir/package.json" "$dir/node_modules/.installed-from" 2>/dev/null; then
  (cd "$dir" && npm install -s --no-audit --no-fund >/dev/null)
  cp "$dir/package.json" "$dir/node_modules/.installed-from"
fi
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
psql -qX "$server/postgres" -c "drop database if exists $db" -c "create database $db" >/dev/null
(cd "$dir" && GW_URL="$server/$db" N="$n" timeout 300 node bench.mjs 2>&1 | grep 'jobs/s')
psql -qX "$server/postgres" -c "drop database if exists $db with (force)" >/dev/null
