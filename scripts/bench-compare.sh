#!/usr/bin/env bash
# Sweep against its references on this machine, back to back in the same minutes, with the
# ratios the throughput targets are stated in (README, "Performance"):
#   1. the raw SQL ceiling: benches/compare/sql-limit.sh 50 (pgbench, claim + complete, batch 50)
#   2. Graphile Worker 0.18, batched: benches/compare/graphile.sh N (Node; npm installs it once)
#   3. sweep-bench throughput at default settings: the Rust SDK no-op guest, the same no-op as a
#      WASI 0.2 component, then the empty guest
#   4. the criterion claim + complete bench at batch 50, 4 claimers (skipped with SKIP_CRITERION=1)
#   5. sql-limit again, so the drift of the machine over the run is visible
# Prints each target's ratio against the mean of the two sql-limit runs, and writes the run
# (command, commit, machine, table, every line the benches printed) to
# benches/results/YYYY-MM-DD-HHMM-<machine>.md.
#
#   scripts/bench-compare.sh            # 100,000 tasks per run
#   TASKS=50000 RUNS=3 scripts/bench-compare.sh
#
# env: TASKS (100000), RUNS of each Sweep guest (2), DATABASE_URL (the server every run uses;
#      default the local one), SKIP_CRITERION, RESULTS (the folder, benches/results).
# Needs: pgbench (Postgres), node and npm (Graphile Worker), the wasm32-wasip1 target.
set -euo pipefail
cd "$(dirname "$0")/.."
tasks=${TASKS:-100000}
runs=${RUNS:-2}
results=${RESULTS:-benches/results}
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
target=${CARGO_TARGET_DIR:-target}

echo "== building (release): sweep-bench, the Wasm modules" >&2
scripts/build-modules.sh noop component-noop >/dev/null
cargo build -q --release -p sweep-dev --bin sweep-bench
bench="$target/release/sweep-bench"
modules="$target/wasm32-wasip1/wasm"

log=$(mktemp); trap 'rm -f "$log"' EXIT
sql_limit() { benches/compare/sql-limit.sh 50 | tee -a "$log" | sed -n 's/.*jobs_per_s=\([0-9.]*\).*/\1/p'; }
sweep() {
  "$bench" --guest "$1" --modules-dir "$modules" --components-dir "$target/wasm32-wasip2/wasm" throughput --tasks "$tasks" 2>&1 | tee -a "$log" \
    | sed -n 's/^drained .*: \([0-9.]*\) tasks\/s.*/\1/p'
}
mean() { awk '{ s += $1; n++ } END { if (n) printf "%.0f", s / n }'; }

cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
cores="$(nproc)"
machine="$(printf '%s' "$cpu" | tr '[:upper:]' '[:lower:]' | sed 's/([^)]*)//g; s/ cpu / /; s/@.*//; s/processor//' \
  | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')-${cores}c"
started="$(date -u +%Y-%m-%d-%H%M)"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"

date -u +"== %Y-%m-%d %H:%M UTC on $cores cores ($cpu), $(uname -r)" | tee -a "$log"
echo "== sql-limit (before)"; before=$(sql_limit); echo "$before jobs/s"
echo "== graphile-worker"; gw=$(benches/compare/graphile.sh "$tasks" | tee -a "$log" | sed -n 's/.*= \([0-9.]*\) jobs\/s.*/\1/p'); echo "$gw jobs/s"
rust=(); component=(); bare=()
for _ in $(seq "$runs"); do
  echo "== sweep, Rust SDK guest, defaults"; r=$(sweep rust); echo "$r tasks/s"; rust+=("$r")
  echo "== sweep, Rust component guest, defaults"; c=$(sweep component); echo "$c tasks/s"; component+=("$c")
  echo "== sweep, empty guest, defaults"; b=$(sweep bare); echo "$b tasks/s"; bare+=("$b")
done
claim=""
if [ -z "${SKIP_CRITERION:-}" ]; then
  echo "== criterion claim/4_claimers/50"
  claim=$(cargo bench -q -p sweep-benches --bench claim -- claim/4_claimers/50 --measurement-time 5 --warm-up-time 1 2>&1 \
    | tee -a "$log" | sed -n 's/.*thrpt: *\[[0-9.]* [KM]*elem\/s \([0-9.]*\) \([KM]*\)elem\/s.*/\1 \2/p' | tail -1 \
    | awk '{ m = ($2 == "K") ? 1000 : (($2 == "M") ? 1000000 : 1); printf "%.0f", $1 * m }')
  echo "${claim:-?} tasks/s (median)"
fi
echo "== sql-limit (after)"; after=$(sql_limit); echo "$after jobs/s"

ceiling=$(printf '%s\n%s\n' "$before" "$after" | mean)
rust_mean=$(printf '%s\n' "${rust[@]}" | mean)
component_mean=$(printf '%s\n' "${component[@]}" | mean)
bare_mean=$(printf '%s\n' "${bare[@]}" | mean)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "?" }'; }
table() {
  echo "| measured | tasks/s | against | ratio | target |"
  echo "|---|---|---|---|---|"
  echo "| raw SQL ceiling (sql-limit.sh 50), before / after | $before / $after | | | |"
  echo "| Graphile Worker 0.18, batched | $gw | | | |"
  echo "| Sweep, Rust SDK no-op, defaults (runs: ${rust[*]}) | $rust_mean | Graphile Worker | $(ratio "$rust_mean" "$gw") | ≥ 1.2x |"
  echo "| Sweep, Rust component no-op, defaults (runs: ${component[*]}) | $component_mean | Graphile Worker | $(ratio "$component_mean" "$gw") | ≥ 1.0x |"
  echo "| Sweep, empty guest, defaults (runs: ${bare[*]}) | $bare_mean | sql-limit | $(ratio "$bare_mean" "$ceiling") | ≥ 1.0x |"
  if [ -n "$claim" ]; then
    echo "| criterion claim + complete, 4 x 50 | $claim | sql-limit | $(ratio "$claim" "$ceiling") | ≥ 1.0x |"
  fi
}
echo
table
echo
grep -h "CPU per task" "$log" | sed 's/^/  /' || true

mkdir -p "$results"
file="$results/$started-$machine.md"
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!benches/results' || echo ' (with uncommitted changes)')"
{
  echo "# bench-compare, $started UTC, $machine"
  echo
  echo "- command: \`TASKS=$tasks RUNS=$runs${SKIP_CRITERION:+ SKIP_CRITERION=1} scripts/bench-compare.sh\`"
  echo "- commit: $commit"
  echo "- machine: $cpu, $cores cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), Linux $(uname -r)"
  echo "- Postgres: $(psql -qAtX "$DATABASE_URL" -c 'show server_version' 2>/dev/null || echo '?')"
  echo "- load average (1, 5, 15 min): $load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after"
  echo
  table
  echo
  echo '```'
  cat "$log"
  echo '```'
} >"$file"
echo "wrote $file"
