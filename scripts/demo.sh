#!/usr/bin/env bash
# The main job, end to end: builds the example Wasm modules, then runs `sweep demo` against the
# Postgres server of SWEEP_DEMO_DATABASE_URL (default: a fresh `sweep_demo` database on
# 127.0.0.1:5432, dropped and recreated on every run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-modules.sh >/dev/null
RUST_LOG="${RUST_LOG:-warn}" cargo run -q -p sweep -- demo "$@"
