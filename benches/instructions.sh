#!/usr/bin/env bash
# Instructions per delivery (per Event, for ingest) of two aep-relay binaries under the
# same `aep-load` workloads: the relay's user-space instructions, counted by valgrind
# (`--tool=callgrind`), over everything it did in the run (start-up, connecting, the
# load, shutdown), divided by the deliveries. Unlike CPU time on this shared machine,
# the count does not move with other jobs: the same binary gives the same figure within
# 0.1% run after run, so a change of 1% shows. It leaves out the kernel's share (compare
# syscalls with `perf stat -e 'syscalls:sys_enter_*'`) and the cost of cache misses
# (`valgrind --tool=cachegrind --cache-sim=yes` counts D1 and LL misses the same way).
# benches/ab.sh measures the time; this says where a ratio there comes from.
#
# Usage:
#   A_BIN=PATH B_BIN=PATH benches/instructions.sh
# Knobs (environment):
#   WORKLOADS "ingest-ws-580 ingest-post-580 ingest-ws-4096 ingest-post-4096 sse-1000
#     ws-1000"; the forms are benches/ab.sh's (benches/workloads.sh)
#   DELIVERIES 3000000, INGEST_EVENTS 200000, and ab.sh's SIZE, BATCH, WINDOW,
#     INGEST_BATCH, INGEST_WINDOW: valgrind runs the relay ~50x slower, so the counts are
#     smaller than ab.sh's
#   PORT 18798, SERVER_CPU 1, LOAD_CPU 0, RESULTS (default target/instructions/DATE)
# Needs valgrind (`apt-get install valgrind`). The relay runs under valgrind pinned to
# core $SERVER_CPU; aep-load (built from the current tree, or LOAD_BIN) on $LOAD_CPU.
# The table (markdown) goes to stdout and $RESULTS/report.md; each run's callgrind
# profile stays in $RESULTS (`callgrind_annotate FILE` shows where the instructions go).
set -euo pipefail
shopt -s inherit_errexit

cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

die() {
    echo "instructions.sh: $*" >&2
    exit 2
}

[ -n "${A_BIN:-}" ] && [ -n "${B_BIN:-}" ] || die "set A_BIN and B_BIN (two relay binaries)"
for bin in "$A_BIN" "$B_BIN"; do
    [ -x "$bin" ] || die "not an executable: $bin"
done
command -v valgrind >/dev/null || die "valgrind is not installed (apt-get install valgrind)"
command -v taskset >/dev/null || die "taskset is not installed (util-linux)"

WORKLOADS=${WORKLOADS:-"ingest-ws-580 ingest-post-580 ingest-ws-4096 ingest-post-4096 sse-1000 ws-1000"}
DELIVERIES=${DELIVERIES:-3000000}
SIZE=${SIZE:-580}
BATCH=${BATCH:-64}
WINDOW=${WINDOW:-256}
INGEST_EVENTS=${INGEST_EVENTS:-200000}
INGEST_BATCH=${INGEST_BATCH:-64}
INGEST_WINDOW=${INGEST_WINDOW:-1024}
PORT=${PORT:-18798}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
RESULTS=${RESULTS:-target/instructions/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$RESULTS"

if [ -z "${LOAD_BIN:-}" ]; then
    cargo build --release -p aep-load >&2
    LOAD_BIN=$CARGO_TARGET_DIR/release/aep-load
fi

# shellcheck source=benches/workloads.sh
. benches/workloads.sh

# one NAME SIDE BIN: prints the instructions of one run.
one() {
    local name=$1 side=$2 bin=$3 out="$RESULTS/$1.$2"
    workload "$name"
    local load=$W_ARGS
    if curl -s --max-time 2 -o /dev/null "http://127.0.0.1:$PORT/healthz"; then
        die "something already answers on 127.0.0.1:$PORT (PORT=… to use another)"
    fi
    AEP_LOG=warn taskset -c "$SERVER_CPU" valgrind --tool=callgrind \
        --callgrind-out-file="$out.callgrind" "$bin" --listen "127.0.0.1:$PORT" \
        >"$out.log" 2>&1 &
    local vg=$!
    # `one` runs in a subshell ($(...)): this stops the relay however it exits.
    trap 'kill -INT '"$vg"' 2>/dev/null || true' EXIT
    for _ in $(seq 600); do
        curl -s --max-time 2 -o /dev/null "http://127.0.0.1:$PORT/healthz" && break
        sleep 0.1
    done
    kill -0 "$vg" 2>/dev/null || die "the relay under valgrind did not start (see $out.log)"
    # shellcheck disable=SC2086 # the arguments are words
    if ! taskset -c "$LOAD_CPU" "$LOAD_BIN" --addr "127.0.0.1:$PORT" $load --timeout 600 \
        >"$out.load" 2>&1; then
        kill -INT "$vg" 2>/dev/null || true
        wait "$vg" 2>/dev/null || true
        die "aep-load failed for $name on $side (see $out.load)"
    fi
    kill -INT "$vg"
    wait "$vg" || echo "instructions.sh: the relay exited with status $? for $name on $side" >&2
    local n
    n=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out.log" | tail -1)
    [ -n "$n" ] || die "no instruction total in $out.log ($name on $side)"
    echo "$n"
}


printf '%s\t%s\t%s\t%s\n' workload deliveries A B >"$RESULTS/counts.tsv"
for name in $WORKLOADS; do
    workload "$name"
    deliveries=$W_DELIVERIES
    a=$(one "$name" A "$A_BIN")
    b=$(one "$name" B "$B_BIN")
    printf '%s\t%s\t%s\t%s\n' "$name" "$deliveries" "$a" "$b" >>"$RESULTS/counts.tsv"
    echo "  $name: A $a, B $b instructions for $deliveries deliveries" >&2
done

python3 - "$RESULTS" "$A_BIN" "$B_BIN" <<'PY' | tee "$RESULTS/report.md"
import sys
d, a_bin, b_bin = sys.argv[1:4]
rows = [l.rstrip("\n").split("\t") for l in open(f"{d}/counts.tsv")][1:]
print(f"`benches/instructions.sh`: A = {a_bin}, B = {b_bin}; the relay's instructions "
      "(callgrind) per delivery (per Event, for ingest), whole run included.\n")
print("| workload | deliveries | A | B | A/B (B's speed relative to A) |")
print("|---|---|---|---|---|")
for name, n, a, b in rows:
    n, a, b = int(n), int(a), int(b)
    print(f"| {name} | {n:,} | {a / n:,.0f} | {b / n:,.0f} | **{a / b:.3f}x** |")
PY
