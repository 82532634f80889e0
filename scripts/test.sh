#!/usr/bin/env bash
# Runs every test: builds the Wasm modules the tests execute, then the whole workspace's tests
# against the Postgres at DATABASE_URL (each test creates and drops its own database).
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
scripts/build-modules.sh
cargo test --workspace "$@"
