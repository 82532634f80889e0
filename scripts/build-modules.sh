#!/usr/bin/env bash
# Builds every guest module under modules/ for wasm32-wasip1 with the `wasm` profile, in one
# cargo invocation, and prints where each .wasm landed and how big it is.
#
#   scripts/build-modules.sh            # all modules
#   scripts/build-modules.sh noop flaky # just these
#
# The module list is the directory list: modules/<name>/ holds a crate named <name> whose binary
# becomes $TARGET_DIR/wasm32-wasip1/wasm/<name>.wasm.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=wasm32-wasip1
PROFILE=wasm
TARGET_DIR="${CARGO_TARGET_DIR:-target}"

if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$TARGET"; then
  rustup target add "$TARGET"
fi

if [ "$#" -gt 0 ]; then
  modules=("$@")
else
  modules=()
  for manifest in modules/*/Cargo.toml; do
    modules+=("$(basename "$(dirname "$manifest")")")
  done
fi

packages=()
for name in "${modules[@]}"; do
  manifest="modules/$name/Cargo.toml"
  if [ ! -f "$manifest" ]; then
    echo "build-modules: no module '$name' (expected $manifest)" >&2
    exit 1
  fi
  # The artifact is named after the crate, so the crate must be named after its directory.
  if ! grep -qx "name = \"$name\"" "$manifest"; then
    echo "build-modules: $manifest must declare name = \"$name\"" >&2
    exit 1
  fi
  packages+=(-p "$name")
done

cargo build --target "$TARGET" --profile "$PROFILE" "${packages[@]}"

out="$TARGET_DIR/$TARGET/$PROFILE"
echo "Wasm modules in $out:"
for name in "${modules[@]}"; do
  wasm="$out/$name.wasm"
  if [ ! -f "$wasm" ]; then
    echo "build-modules: expected $wasm after the build" >&2
    exit 1
  fi
  printf '  %-12s %7d KiB  %s\n' "$name" "$(( ($(wc -c <"$wasm") + 1023) / 1024 ))" "$wasm"
done
