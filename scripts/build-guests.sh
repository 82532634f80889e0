#!/usr/bin/env bash
# Builds the handlers written in other languages (guests/<lang>-<name>/) for WASI preview 1 into
# the same directory as the Rust modules: $TARGET_DIR/wasm32-wasip1/wasm/<lang>-<name>.wasm.
# scripts/build-modules.sh calls it; it can also run alone.
#
#   scripts/build-guests.sh                 # every guest
#   scripts/build-guests.sh c-wordcount     # just these
#
# Toolchains (docs/guests.md; scripts/prepare.sh installs both):
#   c-*    clang with the wasm32-wasi target and wasi-libc (Debian: clang lld wasi-libc
#          libclang-rt-14-dev-wasm32); override the compiler with WASI_CC.
#   zig-*  Zig 0.14 (pip install ziglang==0.14.1, run as `python3 -m ziglang`); override with ZIG.
#
# A missing toolchain is reported by name with its install command. Under CI (CI set and not
# "false") that is an error; elsewhere the guest is skipped with a warning so the Rust modules
# still build, and the tests that run the guest fail with the path they could not read.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
out="$TARGET_DIR/wasm32-wasip1/wasm"
work="$TARGET_DIR/guests"
mkdir -p "$out" "$work"
out="$(cd "$out" && pwd)"
work="$(cd "$work" && pwd)"

# The prepare script's Python environment (Zig from PyPI), if it made one, leads PATH.
# shellcheck source=prepare.sh
. scripts/prepare.sh
WASI_CC="${WASI_CC:-clang}"
read -r -a ZIG <<<"${ZIG:-python3 -m ziglang}"
ZIG_SERIES="0.14."

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

if [ "$#" -gt 0 ]; then
  guests=("$@")
else
  guests=()
  for dir in guests/*/; do
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
  rm -f "$out/$name.wasm"
  case "$name" in
    c-*) build_c "$name" "$dir" ;;
    zig-*) build_zig "$name" "$dir" ;;
    *)
      echo "build-guests: $dir: the name must start with its language (c-, zig-)" >&2
      exit 1
      ;;
  esac
  if [ -f "$out/$name.wasm" ]; then built+=("$name"); fi
done

echo "Guest modules in $out:"
for name in "${built[@]}"; do
  printf '  %-12s %7d KiB  %s\n' "$name" "$(( ($(wc -c <"$out/$name.wasm") + 1023) / 1024 ))" "$out/$name.wasm"
done
if [ "$missing" -gt 0 ] && $strict; then
  echo "build-guests: $missing guest(s) not built: toolchain missing (CI is set)" >&2
  exit 1
fi
