#!/usr/bin/env bash
# Runs every test: prepares the machine (scripts/prepare.sh: Wasm target, guest toolchains,
# PgBouncer, Chromium, Postgres up, the test database), builds the Wasm modules the tests
# execute, then runs the whole workspace's tests against the Postgres at DATABASE_URL (each
# test creates and drops its own database). Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
# shellcheck source=prepare.sh
. scripts/prepare.sh
prepare
scripts/build-modules.sh
cargo test --workspace "$@"
