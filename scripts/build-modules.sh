#!/usr/bin/env bash
# Builds every guest module under modules/ for wasm32-wasip1 with the `wasm` profile, in one
# cargo invocation, and prints where each .wasm landed and how big it is; then the WASI 0.2
# components under components/ for wasm32-wasip2; then the handlers in other languages under
# guests/ (scripts/build-guests.sh): C and Zig modules into the wasip1 directory, Python and
# JavaScript components into the wasip2 one.
#
#   scripts/build-modules.sh                        # all modules, components and guests
#   scripts/build-modules.sh noop flaky c-wordcount # just these
#
# The module list is the directory list: modules/<name>/ holds a crate named <name> whose binary
# becomes $TARGET_DIR/wasm32-wasip1/wasm/<name>.wasm; components/<name>/ likewise becomes
# $TARGET_DIR/wasm32-wasip2/wasm/<name>.wasm; guests/<lang>-<name>/ becomes <lang>-<name>.wasm
# beside the modules (c-, zig-) or the components (python-, js-).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=wasm32-wasip1
PROFILE=wasm
TARGET_DIR="${CARGO_TARGET_DIR:-target}"

COMPONENT_TARGET=wasm32-wasip2

for target in "$TARGET" "$COMPONENT_TARGET"; do
  if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
  fi
done

guests=()
components=()
if [ "$#" -gt 0 ]; then
  modules=()
  for name in "$@"; do
    if [ -d "guests/$name" ]; then
      guests+=("$name")
    elif [ -d "components/$name" ]; then
      components+=("$name")
    else
      modules+=("$name")
    fi
  done
else
  modules=()
  for manifest in modules/*/Cargo.toml; do
    modules+=("$(basename "$(dirname "$manifest")")")
  done
  for manifest in components/*/Cargo.toml; do
    components+=("$(basename "$(dirname "$manifest")")")
  done
  for dir in guests/*-*/; do
    guests+=("$(basename "$dir")")
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

if [ "${#packages[@]}" -gt 0 ]; then
  cargo build --target "$TARGET" --profile "$PROFILE" "${packages[@]}"
fi

out="$TARGET_DIR/$TARGET/$PROFILE"
[ "${#modules[@]}" -eq 0 ] || echo "Wasm modules in $out:"
for name in "${modules[@]}"; do
  wasm="$out/$name.wasm"
  if [ ! -f "$wasm" ]; then
    echo "build-modules: expected $wasm after the build" >&2
    exit 1
  fi
  printf '  %-12s %7d KiB  %s\n' "$name" "$(( ($(wc -c <"$wasm") + 1023) / 1024 ))" "$wasm"
done

if [ "${#components[@]}" -gt 0 ]; then
  component_packages=()
  for name in "${components[@]}"; do
    if ! grep -qx "name = \"$name\"" "components/$name/Cargo.toml"; then
      echo "build-modules: components/$name/Cargo.toml must declare name = \"$name\"" >&2
      exit 1
    fi
    component_packages+=(-p "$name")
  done
  cargo build --target "$COMPONENT_TARGET" --profile "$PROFILE" "${component_packages[@]}"
  out="$TARGET_DIR/$COMPONENT_TARGET/$PROFILE"
  echo "Wasm components in $out:"
  for name in "${components[@]}"; do
    wasm="$out/$name.wasm"
    # A library component (a `cdylib`) comes out under the crate's name, `-` as `_`.
    lib="$out/${name//-/_}.wasm"
    if [ -f "$lib" ] && { [ ! -f "$wasm" ] || [ "$lib" -nt "$wasm" ]; }; then
      cp "$lib" "$wasm"
    fi
    if [ ! -f "$wasm" ]; then
      echo "build-modules: expected $wasm after the build" >&2
      exit 1
    fi
    printf '  %-14s %7d KiB  %s\n' "$name" "$(( ($(wc -c <"$wasm") + 1023) / 1024 ))" "$wasm"
  done
fi

if [ "${#guests[@]}" -gt 0 ]; then
  scripts/build-guests.sh "${guests[@]}"
fi
