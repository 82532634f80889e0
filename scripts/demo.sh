#!/usr/bin/env bash
# The main job, end to end: builds the example Wasm modules, then runs `sweep demo`, which starts
# a throwaway Postgres server from the installed binaries (or, with SWEEP_DEMO_DATABASE_URL, uses
# that server's `sweep_demo` database, dropped and recreated on every run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-modules.sh >/dev/null
RUST_LOG="${RUST_LOG:-warn}" cargo run -q -p sweep -- demo "$@"
