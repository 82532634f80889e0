#!/usr/bin/env bash
# Says whether the wasmtime crates Sweep uses could move to a newer patch release together.
#
# The engine's crates (wasmtime, wasmtime-wasi, wasmtime-wasi-http, wasmtime-wasi-io, wiggle,
# cranelift-codegen) are released in lockstep: 48.0.N with cranelift 0.135.N, and
# `wiggle = "=48.0.N"` pins the set, so a partial move is impossible. For each crate, the
# newest release of the major.minor that Cargo.lock has is read from the registry index cargo
# uses (`cargo info`, outside the workspace so the lockfile does not answer); the newest patch
# all of them are published at is the one the lock can move to. A newer one than the lock's is
# a warning, never a failure (an upstream release must not block a landing), and so is a
# registry that cannot be reached.
#
#   scripts/engine-patch.sh        # prints what it found; exit 0 always
set -uo pipefail
cd "$(dirname "$0")/.."

CRATES=(wasmtime wasmtime-wasi wasmtime-wasi-http wasmtime-wasi-io wiggle cranelift-codegen)

locked_version() {
  awk -v name="$1" '$0 == "name = \"" name "\"" { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock
}

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

common=""
current=""
for crate in "${CRATES[@]}"; do
  locked="$(locked_version "$crate")"
  if [ -z "$locked" ]; then
    echo "engine-patch: $crate is not in Cargo.lock; skipped"
    continue
  fi
  series="${locked%.*}"   # 48.0 or 0.135
  patch="${locked##*.}"
  newest="$(cd "$scratch" && cargo info "$crate@$series" 2>/dev/null | sed -n 's/^version: \([0-9.]*\).*/\1/p' | head -n1)"
  if [ -z "$newest" ]; then
    echo "engine-patch: warning: could not read $crate from the registry index; nothing checked"
    exit 0
  fi
  newest_patch="${newest##*.}"
  echo "engine-patch: $crate $locked in Cargo.lock, newest $series.x published: $newest"
  if [ -z "$current" ] || [ "$patch" -lt "$current" ]; then current="$patch"; fi
  if [ -z "$common" ] || [ "$newest_patch" -lt "$common" ]; then common="$newest_patch"; fi
done

if [ -n "$common" ] && [ -n "$current" ] && [ "$common" -gt "$current" ]; then
  echo "engine-patch: WARNING: every engine crate is published at patch .$common; Cargo.lock has .$current."
  echo "engine-patch: move them together: set wiggle = \"=<major>.0.$common\" in Cargo.toml, then"
  echo "engine-patch:   cargo update -p wasmtime -p wasmtime-wasi -p wasmtime-wasi-http -p wiggle"
else
  echo "engine-patch: the engine crates are at the newest patch they are all published at (.${current:-?})"
fi
exit 0
