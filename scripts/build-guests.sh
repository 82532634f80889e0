#!/usr/bin/env bash
# Builds the handlers written in other languages (guests/<lang>-<name>/): C and Zig for WASI
# preview 1 into the same directory as the Rust modules, $TARGET_DIR/wasm32-wasip1/wasm/, and
# Python and JavaScript as WASI 0.2 components into the same directory as the Rust components,
# $TARGET_DIR/wasm32-wasip2/wasm/. scripts/build-modules.sh calls it; it can also run alone.
#
#   scripts/build-guests.sh                 # every guest
#   scripts/build-guests.sh c-wordcount     # just these
#
# Toolchains (docs/guests.md; scripts/prepare.sh installs them all):
#   c-*       clang with the wasm32-wasi target and wasi-libc (Debian: clang lld wasi-libc
#             libclang-rt-14-dev-wasm32); override the compiler with WASI_CC.
#   zig-*     Zig 0.14 (pip install ziglang==0.14.1, run as `python3 -m ziglang`); override with ZIG.
#   python-*  componentize-py 0.25.1 (PyPI); override with COMPONENTIZE_PY.
#   js-*      componentize-js 0.23.0 (npm, under target/tools/node) on Node.js 20+; override with
#             COMPONENTIZE_JS, the package's directory.
#
# Python and JavaScript guests are built against guests/wit (the `wasi:cli` command world plus
# `wasi:http/outgoing-handler`), with their language's helper module from guests/lib/<lang>/
# on the import path. Each takes 10-25 s to build, so a component is rebuilt only when its
# inputs changed: the guest's files, the helper, the WIT and the tool's version, hashed into a
# stamp beside the work files ($TARGET_DIR/guests/<name>.stamp).
#
# A missing toolchain is reported by name with its install command. Under CI (CI set and not
# "false") that is an error; elsewhere the guest is skipped with a warning so the Rust modules
# still build, and the tests that run the guest fail with the path they could not read.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
out="$TARGET_DIR/wasm32-wasip1/wasm"
components="$TARGET_DIR/wasm32-wasip2/wasm"
work="$TARGET_DIR/guests"
mkdir -p "$out" "$components" "$work"
out="$(cd "$out" && pwd)"
components="$(cd "$components" && pwd)"
work="$(cd "$work" && pwd)"

# The prepare script's Python environment (Zig from PyPI), if it made one, leads PATH.
# shellcheck source=prepare.sh
. scripts/prepare.sh
WASI_CC="${WASI_CC:-clang}"
read -r -a ZIG <<<"${ZIG:-python3 -m ziglang}"
ZIG_SERIES="0.14."
read -r -a COMPONENTIZE_PY <<<"${COMPONENTIZE_PY:-componentize-py}"
COMPONENTIZE_PY_VERSION="0.25.1"
COMPONENTIZE_JS="${COMPONENTIZE_JS:-$node_tools/node_modules/@bytecodealliance/componentize-js}"
COMPONENTIZE_JS_VERSION="0.23.0"
WIT=guests/wit
WORLD=handler

strict=false
if [ -n "${CI:-}" ] && [ "${CI:-}" != "false" ]; then strict=true; fi

missing=0
toolchain_missing() { # guest, what is missing, how to install it
  missing=$((missing + 1))
  if $strict; then
    echo "build-guests: cannot build $1: $2; install with: $3" >&2
  else
    echo "build-guests: WARNING: skipping $1: $2; install with: $3" >&2
    echo "build-guests: WARNING: the tests that run $1 will fail until it is built" >&2
  fi
}

# Probes compile a program that uses libc, so a clang without wasi-libc or the wasm32
# builtins counts as missing rather than failing later inside a guest's build.
c_toolchain() {
  command -v "$WASI_CC" >/dev/null 2>&1 || return 1
  printf '#include <stdio.h>\nint main(void) { puts("ok"); return 0; }\n' >"$work/probe.c"
  "$WASI_CC" --target=wasm32-wasi -O2 -o "$work/probe.wasm" "$work/probe.c" >"$work/probe.log" 2>&1
}

zig_toolchain() {
  local version
  version="$("${ZIG[@]}" version 2>/dev/null)" || return 1
  [[ "$version" == "$ZIG_SERIES"* ]] || { echo "found zig $version, need ${ZIG_SERIES}x" >"$work/zig-probe.log"; return 1; }
}

build_c() { # name, dir
  if ! c_toolchain; then
    toolchain_missing "$1" "no $WASI_CC able to build for wasm32-wasi with wasi-libc ($(tail -1 "$work/probe.log" 2>/dev/null || echo "$WASI_CC not found"))" \
      "apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32"
    return 0
  fi
  # -Wl,--strip-all drops names and debug info: 170 KiB -> 40 KiB.
  "$WASI_CC" --target=wasm32-wasi -std=c11 -O2 -Wall -Wextra -Werror -Wl,--strip-all \
    -o "$out/$1.wasm" "$2"/*.c
}

build_zig() { # name, dir
  if ! zig_toolchain; then
    toolchain_missing "$1" "no Zig ${ZIG_SERIES}x as '${ZIG[*]}' ($(cat "$work/zig-probe.log" 2>/dev/null || echo "not found"))" \
      "scripts/prepare.sh zig_guests"
    return 0
  fi
  local sources=("$2"/*.zig)
  if [ "${#sources[@]}" -ne 1 ]; then
    echo "build-guests: $2 must hold exactly one .zig file (its root source)" >&2
    exit 1
  fi
  # Zig leaves an object file next to the binary, so it emits into the work directory. Its
  # default stack is 16 MiB, all of it initial linear memory, which alone would fill the
  # runner's smaller memory limits; 1 MiB is what Rust's wasm32-wasip1 target reserves.
  "${ZIG[@]}" build-exe -target wasm32-wasi -O ReleaseSmall --stack 1048576 \
    --cache-dir "$work/zig-cache" --global-cache-dir "$work/zig-global-cache" \
    -femit-bin="$work/$1.wasm" "${sources[0]}"
  cp "$work/$1.wasm" "$out/$1.wasm"
}

python_toolchain() {
  local version
  version="$("${COMPONENTIZE_PY[@]}" --version 2>/dev/null)" || { echo "not found" >"$work/py-probe.log"; return 1; }
  [ "$version" = "componentize-py $COMPONENTIZE_PY_VERSION" ] \
    || { echo "found $version, need $COMPONENTIZE_PY_VERSION" >"$work/py-probe.log"; return 1; }
}

js_toolchain() {
  local version
  version="$(node -p "require('$COMPONENTIZE_JS/package.json').version" 2>/dev/null)" \
    || { echo "not found, or no node" >"$work/js-probe.log"; return 1; }
  [ "$version" = "$COMPONENTIZE_JS_VERSION" ] \
    || { echo "found $version, need $COMPONENTIZE_JS_VERSION" >"$work/js-probe.log"; return 1; }
}

# What a component is built from, hashed: when it matches the stamp of the last build and that
# build's output is in place, the build is skipped.
inputs_hash() { # tool and version, paths...
  {
    echo "$1"
    shift
    find "$@" "$WIT" -type f -not -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -d' ' -f1
}

# Whether component $1 was built from inputs hashing to $2 (the pinned tool version is one of
# them, so a kept output is what the toolchain would build: it needs no toolchain).
up_to_date() { # name, hash
  [ -f "$components/$1.wasm" ] && [ "$(cat "$work/$1.stamp" 2>/dev/null)" = "$2" ]
}

build_python() { # name, dir
  [ -f "$2/app.py" ] || { echo "build-guests: $2 must hold app.py (the module componentize-py builds)" >&2; exit 1; }
  local hash
  hash="$(inputs_hash "componentize-py $COMPONENTIZE_PY_VERSION" "$2" guests/lib/python)"
  up_to_date "$1" "$hash" && return 0
  rm -f "$components/$1.wasm" "$work/$1.stamp"
  if ! python_toolchain; then
    toolchain_missing "$1" "no componentize-py $COMPONENTIZE_PY_VERSION as '${COMPONENTIZE_PY[*]}' ($(cat "$work/py-probe.log"))" \
      "scripts/prepare.sh python_guests"
    return 0
  fi
  # The module's top level runs here, at build time, and the interpreter is snapshotted.
  "${COMPONENTIZE_PY[@]}" -q -d "$WIT" -w "$WORLD" componentize \
    -p "$2" -p guests/lib/python app -o "$work/$1.wasm"
  mv "$work/$1.wasm" "$components/$1.wasm"
  echo "$hash" >"$work/$1.stamp"
}

build_js() { # name, dir
  [ -f "$2/handler.js" ] || { echo "build-guests: $2 must hold handler.js (the module componentize-js builds)" >&2; exit 1; }
  local hash
  hash="$(inputs_hash "componentize-js $COMPONENTIZE_JS_VERSION" "$2" guests/lib/js \
    scripts/js-toolchain/componentize.mjs)"
  up_to_date "$1" "$hash" && return 0
  rm -f "$components/$1.wasm" "$work/$1.stamp"
  if ! js_toolchain; then
    toolchain_missing "$1" "no componentize-js $COMPONENTIZE_JS_VERSION in $COMPONENTIZE_JS ($(cat "$work/js-probe.log"))" \
      "scripts/prepare.sh js_guests"
    return 0
  fi
  # componentize-js's CLI, with Wizer's compile cache in the work directory (see the script).
  XDG_CACHE_HOME="$work/cache" node scripts/js-toolchain/componentize.mjs "$COMPONENTIZE_JS" \
    "$WIT" "$WORLD" "$2/handler.js" "$work/$1.wasm"
  mv "$work/$1.wasm" "$components/$1.wasm"
  echo "$hash" >"$work/$1.stamp"
}

if [ "$#" -gt 0 ]; then
  guests=("$@")
else
  guests=()
  # <lang>-<name> only: guests/wit and guests/lib are what the guests are built with.
  for dir in guests/*-*/; do
    guests+=("$(basename "$dir")")
  done
fi

built=()
for name in "${guests[@]}"; do
  dir="guests/$name"
  if [ ! -d "$dir" ]; then
    echo "build-guests: no guest '$name' (expected $dir/)" >&2
    exit 1
  fi
  case "$name" in
    c-*) rm -f "$out/$name.wasm"; build_c "$name" "$dir"; wasm="$out/$name.wasm" ;;
    zig-*) rm -f "$out/$name.wasm"; build_zig "$name" "$dir"; wasm="$out/$name.wasm" ;;
    python-*) build_python "$name" "$dir"; wasm="$components/$name.wasm" ;;
    js-*) build_js "$name" "$dir"; wasm="$components/$name.wasm" ;;
    *)
      echo "build-guests: $dir: the name must start with its language (c-, zig-, python-, js-)" >&2
      exit 1
      ;;
  esac
  if [ -f "$wasm" ]; then built+=("$wasm"); fi
done

echo "Guests (modules in $out, components in $components):"
for wasm in "${built[@]}"; do
  printf '  %-14s %7d KiB  %s\n' "$(basename "$wasm" .wasm)" "$(( ($(wc -c <"$wasm") + 1023) / 1024 ))" "$wasm"
done
if [ "$missing" -gt 0 ] && $strict; then
  echo "build-guests: $missing guest(s) not built: toolchain missing (CI is set)" >&2
  exit 1
fi
