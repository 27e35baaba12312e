#!/usr/bin/env bash
# The work a `tools/call` costs on each route of the gateway benchmark
# (crates/quiver-worker/benches/mcp_gateway.rs), counted in instructions by
# valgrind's callgrind rather than timed: on a shared host wall-clock figures
# swing more between runs than a change of a few microseconds moves them,
# while a count does not depend on what else the host is doing
# (BENCHMARKS.md, "Work per call, counted").
#
# Each route runs twice in the benchmark's own process, with
# QUIVER_COUNT_FEW and QUIVER_COUNT_MANY sequential calls; the difference of
# the two totals over the difference of the calls is the work of one call,
# startup and warm-up cancelled out. That is the whole process's work:
# client, worker and server alike, as in the benchmark. Each route is also
# printed against the direct route of its own kind of client: the direct
# route's work over the route's is what the route's throughput over direct
# would be if, with every party sharing the cores, nothing but work counted.
#
# Callgrind counts a `rep movsb` copy per byte moved, so copying weighs
# more here than in time: a guide to where work is, not a clock.
#
# Usage: [QUIVER_COUNT_BENCH=path/to/mcp_gateway-binary] scripts/count-work.sh [route-part ...]
# (default: the routes below)
set -euo pipefail
cd "$(dirname "$0")/.."

command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/bench}"
few="${QUIVER_COUNT_FEW:-500}"
many="${QUIVER_COUNT_MANY:-2500}"

# QUIVER_COUNT_BENCH: a benchmark binary built before (to count an older
# build against this one); else the current code's, built here.
bench="${QUIVER_COUNT_BENCH:-}"
if [ -z "$bench" ]; then
  bench=$(cargo bench -p quiver-worker --bench mcp_gateway --no-run --locked --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "mcp_gateway" and m.get("executable"):
        print(m["executable"])')
fi

if [ "$#" -gt 0 ]; then
  routes=("$@")
else
  routes=("raw client → server" "floor: raw client" "reference: raw JSON"
    "2026-07-28 raw client" "2025-11-25 raw client"
    "rmcp client → server" "2026-07-28 rmcp client" "2025-11-25 rmcp client")
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Total instructions of one run of `route` with `calls` sequential calls.
count() {
  local route=$1 calls=$2 file="$out/cg"
  (cd crates/quiver-worker &&
    QUIVER_BENCH_ROUTES="$route" QUIVER_BENCH_ROUNDS=1 QUIVER_BENCH_CALLS="$calls" \
      QUIVER_BENCH_WARMUP=50 QUIVER_BENCH_CONCURRENCY=4 QUIVER_BENCH_CONCURRENT_CALLS=40 \
      valgrind --tool=callgrind --callgrind-out-file="$file" "$bench" --bench >"$out/log" 2>&1) ||
    { cat "$out/log" >&2; exit 1; }
  sed -n 's/^==[0-9]*== Collected : \([0-9]*\)$/\1/p' "$out/log"
}

printf "| route | instructions per call | throughput / direct, by work |\n|---|---:|---:|\n"
declare -A per_call
for route in "${routes[@]}"; do
  small=$(count "$route" "$few")
  large=$(count "$route" "$many")
  per_call[$route]=$(((large - small) / (many - few)))
  case "$route" in
    *rmcp*) direct="rmcp client → server" ;;
    *) direct="raw client → server" ;;
  esac
  ratio="—"
  if [ -n "${per_call[$direct]:-}" ] && [ "$route" != "$direct" ]; then
    ratio=$(python3 -c "print(f'{${per_call[$direct]} / ${per_call[$route]}:.2f}×')")
  fi
  printf '| %s | %d | %s |\n' "$route" "${per_call[$route]}" "$ratio"
done
