#!/usr/bin/env bash
# The main job: builds the example Wasm modules, then runs `sweep dev --demo`: a throwaway
# Postgres server from the installed binaries (or DATABASE_URL's), a runner with the admin API
# and the dashboard, the example modules registered for tenant `dev` and the demo's tasks
# enqueued. It prints the dashboard URL, the API URL and a token; Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-modules.sh >/dev/null
RUST_LOG="${RUST_LOG:-warn}" cargo run -q -p sweep -- dev --demo "$@"
