#!/usr/bin/env bash
# Makes this machine ready to build and test Sweep: what the tests need beyond Rust and
# Postgres, installed once, checked in about a second afterwards. `scripts/test.sh` and
# `.ci/run` both source it, so a user and CI prepare the same way; run it alone to prepare
# without testing.
#
#   scripts/prepare.sh               # everything below
#   scripts/prepare.sh c_guests pgbouncer   # just these steps
#
# Steps (one function `step_<name>` each; add a toolchain as a function and list it in STEPS):
#   wasm_targets  the Rust targets the modules build for (rustup)
#   c_guests      clang, lld and wasi-libc for the C guests (apt)
#   zig_guests    Zig 0.14 for the Zig guests (PyPI: ziglang)
#   python_guests componentize-py 0.25.1 for the Python guests (PyPI)
#   js_guests     componentize-js 0.23.0 for the JavaScript guests (npm, from the lock file in
#                 scripts/js-toolchain/, into target/tools/node; needs Node.js 20+ and npm)
#   pgbouncer     PgBouncer, which runner/tests/pgbouncer.rs starts (apt)
#   browser       Chromium and chromedriver for runner/tests/ui_browser.rs (apt)
#   schemathesis  the API fuzzer scripts/fuzz-api.sh runs (PyPI)
#   python_client openapi-python-client, which runner/tests/admin_python_client.rs generates a
#                 client with from the served document (PyPI)
#   postgres      a server answering at DATABASE_URL (started through pg_ctlcluster if it is
#                 the local Debian one and down; installed when there is none)
#   test_database the database DATABASE_URL names
#
# apt packages are installed as root, or through sudo; Python packages into python3 when pip
# may install there, else into a virtual environment under target/tools/python, whose bin/
# then leads PATH: for every script that sources this file (build-guests.sh and fuzz-api.sh
# do, for `python3 -m ziglang` and `python3 -m schemathesis`). npm packages into
# target/tools/node, with npm's cache beside it in target/tools/npm-cache: nothing lands
# outside the checkout. Everything is pinned.
#
# env: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test), SWEEP_PREPARE=0 skips
#      everything (a machine prepared some other way).

STEPS=(wasm_targets c_guests zig_guests python_guests js_guests pgbouncer browser schemathesis python_client postgres
       test_database)

prepare_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prepare_url() { echo "${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"; }

say() { echo "prepare: $*" >&2; }

# --- helpers -------------------------------------------------------------------------------

apt_installed() {
  local package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || return 1
  done
}

apt_updated=false
apt_install() { # packages...
  apt_installed "$@" && return 0
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { say "needs root to install: apt-get install $*"; return 1; }
    sudo=(sudo)
  fi
  command -v apt-get >/dev/null || { say "not a Debian system: install $* yourself"; return 1; }
  local log
  log="$(mktemp)"
  if ! $apt_updated; then
    "${sudo[@]}" apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; return 1; }
    apt_updated=true
  fi
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "$@" >>"$log" 2>&1 \
    || { cat "$log" >&2; rm -f "$log"; return 1; }
  rm -f "$log"
}

python_venv="$prepare_root/${CARGO_TARGET_DIR:-target}/tools/python"
# A virtual environment made earlier leads PATH, so its packages are found.
[ -x "$python_venv/bin/python3" ] && export PATH="$python_venv/bin:$PATH"

python_has() { # distribution, version
  [ "$(python3 -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null)" = "$2" ]
}

pip_install() { # distribution, version
  python_has "$1" "$2" && return 0
  say "pip install $1==$2"
  local log
  log="$(mktemp)"
  if python3 -m pip install -q --disable-pip-version-check "$1==$2" >"$log" 2>&1; then
    rm -f "$log"
    return 0
  fi
  if ! grep -q externally-managed-environment "$log"; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  # A distribution's python3 (PEP 668): a virtual environment of the project's own.
  rm -f "$log"
  if [ ! -x "$python_venv/bin/python3" ]; then
    python3 -m venv "$python_venv" 2>/dev/null || { apt_install python3-venv && python3 -m venv "$python_venv"; } || return 1
    export PATH="$python_venv/bin:$PATH"
  fi
  python3 -m pip install -q --disable-pip-version-check "$1==$2"
}

# The JavaScript toolchain: `npm ci` of scripts/js-toolchain/ (its lock file pins every
# package) into this directory; build-guests.sh runs node_tools/node_modules/.bin/*.
node_tools="$prepare_root/${CARGO_TARGET_DIR:-target}/tools/node"
NODE_MAJOR_MIN=20

node_ready() { # the installed tree is the committed lock file's
  [ -x "$node_tools/node_modules/.bin/componentize-js" ] \
    && cmp -s "$prepare_root/scripts/js-toolchain/package-lock.json" "$node_tools/package-lock.json"
}

npm_ci() {
  node_ready && return 0
  local major
  major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null)" || major=0
  if [ "$major" -lt "$NODE_MAJOR_MIN" ] || ! command -v npm >/dev/null; then
    say "Node.js $NODE_MAJOR_MIN or later with npm is needed (found: $(node --version 2>/dev/null || echo none))"
    return 1
  fi
  say "npm ci (scripts/js-toolchain) into $node_tools"
  mkdir -p "$node_tools"
  cp "$prepare_root/scripts/js-toolchain/package.json" "$prepare_root/scripts/js-toolchain/package-lock.json" "$node_tools/"
  local log
  log="$(mktemp)"
  if ! npm ci --prefix "$node_tools" --cache "$node_tools/../npm-cache" --no-audit --no-fund \
    --loglevel=error >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log" "$node_tools/package-lock.json"
    return 1
  fi
  rm -f "$log"
}

# --- steps ---------------------------------------------------------------------------------

step_wasm_targets() {
  local target
  for target in wasm32-wasip1 wasm32-wasip2; do
    rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target"
  done
}

step_c_guests() { apt_install clang lld wasi-libc libclang-rt-14-dev-wasm32; }

step_zig_guests() { pip_install ziglang 0.14.1; }

step_python_guests() { pip_install componentize-py 0.25.1; }

step_js_guests() { npm_ci; }

step_pgbouncer() { apt_install pgbouncer; }

step_browser() {
  command -v chromedriver >/dev/null && command -v chromium >/dev/null && return 0
  apt_install chromium chromium-driver
}

step_schemathesis() { pip_install schemathesis 4.32.5; }

# Pinned: what the generator skips or warns about changes between releases.
step_python_client() { pip_install openapi-python-client 0.29.1; }

step_postgres() {
  local url
  url="$(prepare_url)"
  pg_isready -q -d "$url" 2>/dev/null && return 0
  if ! command -v pg_ctlcluster >/dev/null && ! command -v pg_isready >/dev/null; then
    apt_install postgresql || return 1
  fi
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    local version sudo=()
    version="$(ls /etc/postgresql | sort -V | tail -1)"
    [ "$(id -u)" != 0 ] && sudo=(sudo)
    say "starting Postgres $version (pg_ctlcluster)"
    "${sudo[@]}" pg_ctlcluster --skip-systemctl-redirect "$version" main start || return 1
    local _
    for _ in $(seq 1 60); do
      pg_isready -q -d "$url" && return 0
      sleep 0.5
    done
  fi
  say "no Postgres answers at $url: start one, or set DATABASE_URL"
  return 1
}

step_test_database() {
  local url name server
  url="$(prepare_url)"
  name="${url##*/}"
  name="${name%%\?*}"
  server="${url%/*}/postgres"
  [ "$(psql -qAtX "$server" -c "select 1 from pg_database where datname = '$name'")" = 1 ] \
    || psql -qAtX "$server" -c "create database \"$name\"" >/dev/null
}

# --- run -----------------------------------------------------------------------------------

prepare() { # steps... (default: all)
  [ "${SWEEP_PREPARE:-1}" = 0 ] && return 0
  local step failed=()
  for step in "${@:-${STEPS[@]}}"; do
    "step_$step" || failed+=("$step")
  done
  if [ "${#failed[@]}" -gt 0 ]; then
    say "not ready: ${failed[*]}"
    return 1
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  prepare "$@"
fi
