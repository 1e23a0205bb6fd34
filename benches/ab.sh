#!/usr/bin/env bash
# A/B: two aep-relay binaries (the commit before a change and the one after, or the same
# binary with two sets of flags) under the same `aep-load` workloads, in interleaved
# rounds, compared by deliveries (Events, for ingest) per server CPU-second: on this
# shared machine that figure moves less than a wall-clock rate, but other jobs on the
# relay's core still move it (their cache use, the relay's wake-ups), by up to 2x at a
# load average of 7. Run A and B as the same binary to see the noise of the moment.
#
# Each run starts a fresh relay pinned to core $SERVER_CPU (`taskset -c`, on
# 127.0.0.1:$PORT, stopped by PID), and runs `aep-load --json --server-pid PID` pinned to
# core $LOAD_CPU. In each of REPEAT rounds every workload runs on A and on B back to back,
# A first in odd rounds and B first in even ones, so a burst of background load or a
# drift over the run hits both sides alike. The report gives, per workload, the median of
# A and of B over the valid rounds and the ratio B/A taken within each round (both runs
# from that round), then its median and spread (min-max): a ratio whose range crosses
# 1.00 is within the noise. A run where aep-load exits non-zero (an Event lost, a publish
# error, a subscriber the relay closed) or whose relay died is invalid: it is marked in
# the table and left out of medians and ratios.
#
# Usage:
#   benches/ab.sh A_REV B_REV            # two git revisions
#   A_BIN=PATH B_BIN=PATH benches/ab.sh  # two ready binaries (or the same one twice: the noise floor)
#   benches/ab.sh --report DIR           # render a finished run's table again
# A revision is built once (release, `-p aep-relay`) in a scratch `git worktree` at
# target/ab/build/COMMIT (the binary is target/ab/build/COMMIT/aep-relay, reused by later
# runs; the worktrees share the cargo target dir target/ab/build/target, so dependencies
# are compiled once). `git worktree remove --force target/ab/build/COMMIT` deletes one.
# aep-load is built from the current tree (LOAD_BIN=PATH to use another).
#
# Knobs (environment):
#   REPEAT 3 rounds
#   WORKLOADS "ws-100 ws-1000 ws-10000 sse-1000 ingest-ws-580 ingest-ws-4096
#              ingest-post-580 ingest-post-4096"; the forms are
#     ws-N, sse-N        fan-out to N WebSocket / SSE subscribers: DELIVERIES / N Events
#                        (at least 100) of SIZE bytes, BATCH per write, WINDOW in flight
#     ingest-ws-S        1 WebSocket subscriber, the WebSocket emitter publishing
#     ingest-post-S      1 SSE subscriber, NDJSON POSTs publishing: INGEST_EVENTS Events
#                        of S bytes, INGEST_BATCH per write, INGEST_WINDOW in flight
#   DELIVERIES 6000000, SIZE 580, BATCH 64, WINDOW 256
#   INGEST_EVENTS 400000, INGEST_BATCH 64, INGEST_WINDOW 1024
#   A_ARGS, B_ARGS: extra relay flags for each side (default none)
#   A_LABEL, B_LABEL: the table's column names (default the revision or the binary)
#   PORT 18797, SERVER_CPU 1, LOAD_CPU 0, RESULTS (default target/ab/DATE)
#   TIMEOUT 120: aep-load's --timeout (s) per run; GRACE 5: seconds aep-load may go on
#   after the relay died before it is stopped
# The defaults take ~7 min for 3 rounds on this 2-core machine (48 runs; most of a
# 10 000-subscriber run is connecting), builds apart: a revision's first build compiles
# the dependencies too, later ones the relay alone (~8 min with fat LTO on a busy machine).
# Every run's JSON line (NAME.SIDE.ROUND.json), aep-load's stderr, the relay's log,
# settings.env and report.md stay in $RESULTS; the markdown table goes to stdout too.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

die() {
    echo "ab.sh: $*" >&2
    exit 2
}

# report DIR: the markdown table of a run, from its settings.env, workloads.tsv and runs.
report() {
    python3 - "$1" "$ROOT/benches" <<'PY'
import json, os, re, statistics, sys
from collections import defaultdict

d = sys.argv[1]
st = {}
with open(os.path.join(d, "settings.env")) as f:
    for line in f:
        m = re.match(r"(\w+)=(.*)", line.strip())
        if m:
            st[m.group(1)] = m.group(2).strip('"')
workloads = []
with open(os.path.join(d, "workloads.tsv")) as f:
    for line in f:
        name, metric, args = line.rstrip("\n").split("\t")
        workloads.append((name, metric, args))
rounds = int(st["REPEAT"])
BUSY = defaultdict(list)  # (workload, side): server core busy of each valid run


def run(name, metric, side, rnd):
    """(figure or None, why invalid or None); None, None when the run is missing."""
    base = os.path.join(d, f"{name}.{side}.{rnd}")
    if not os.path.exists(base + ".json"):
        return None, None
    meta = {}
    if os.path.exists(base + ".meta"):
        with open(base + ".meta") as fh:
            for kv in fh.read().split():
                k, _, v = kv.partition("=")
                meta[k] = v
    with open(base + ".json") as fh:
        text = fh.read().strip()
    try:
        data = json.loads(text.splitlines()[-1]) if text else None
    except ValueError:
        data = None
    if meta.get("alive", "1") != "1":
        return None, "the relay died"
    if data is None:
        err = ""
        if os.path.exists(base + ".err"):
            with open(base + ".err") as fh:
                err = fh.read().strip().splitlines()
            err = f" ({err[0][:100]})" if err else ""
        return None, f"aep-load exit {meta.get('rc', '?')}, no result{err}"
    if data.get("loss", 1) != 0:
        return None, f"lost {data.get('loss')}"
    if data.get("dropped_subscribers", 1) != 0:
        return None, f"{data.get('dropped_subscribers')} subscribers dropped"
    if data.get("publish_errors", 1) != 0:
        return None, f"{data.get('publish_errors')} publish errors"
    if meta.get("rc", "0") != "0":
        return None, f"aep-load exit {meta.get('rc')}"
    v = data.get(metric)
    if not isinstance(v, (int, float)) or v != v or v <= 0:
        return None, "no server CPU time"
    busy = data.get("server_busy")
    BUSY[(name, side)].append(busy if isinstance(busy, (int, float)) and busy == busy else None)
    return float(v), None


sys.path.insert(0, sys.argv[2])
from compare_report import si  # noqa: E402  (the same number format as compare.sh's tables)


def med(values):
    return statistics.median(values) if values else None


a_label, b_label = st["A_LABEL"], st["B_LABEL"]
out = []
same = st.get("A_SHA256") == st.get("B_SHA256") and st.get("A_ARGS") == st.get("B_ARGS")
elapsed = int(st.get("ELAPSED_S", "0"))
out.append(
    f"`benches/ab.sh`, {st['DATE']}, {rounds} rounds: A = {a_label}, B = {b_label}"
    + (" (the same binary and flags: the noise floor)" if same else "")
    + f". Relay on core {st['SERVER_CPU']}, aep-load (at {st['LOAD_COMMIT']}) on core "
    + f"{st['LOAD_CPU']}; {st['CORES']} cores, load average {st['LOAD_START']} at the start, "
    + f"{st.get('LOAD_END', '?')} at the end; {elapsed // 60} min {elapsed % 60} s in all."
)
out.append("")
out.append(
    "Deliveries (Events, for ingest) per server CPU-second: the median of each side over "
    "its valid runs; B/A is taken within each round, then its median (min-max). Server "
    "core busy is the relay's CPU seconds over the run's seconds, the median per side "
    "(well under 1.00: other processes had its core)."
)
out.append("")
out.append(
    f"| workload (aep-load arguments) | A: {a_label} | B: {b_label} | B/A | B/A per round "
    "| server core busy, A / B | invalid runs |"
)
out.append("|---|---|---|---|---|---|---|")
notes = []
for name, metric, args in workloads:
    vals = {"A": [], "B": []}
    ratios, per_round, invalid, total = [], [], 0, 0
    for rnd in range(1, rounds + 1):
        got = {}
        for side in ("A", "B"):
            v, why = run(name, metric, side, rnd)
            if v is None and why is None:
                continue
            total += 1
            if why:
                invalid += 1
                notes.append(f"{name} {side} round {rnd}: {why}")
            else:
                vals[side].append(v)
                got[side] = v
        if "A" in got and "B" in got:
            r = got["B"] / got["A"]
            ratios.append(r)
            per_round.append(f"{r:.2f}")
        else:
            per_round.append("-")
    a, b = med(vals["A"]), med(vals["B"])

    def busy(side):
        v = med([x for x in BUSY[(name, side)] if x is not None])
        return "-" if v is None else f"{v:.2f}"

    if ratios:
        r = f"**{med(ratios):.2f}x**"
        if len(ratios) > 1:
            r += f" ({min(ratios):.2f}-{max(ratios):.2f})"
    else:
        r = "-"
    out.append(
        f"| `{args}` | {si(a) if a else '-'} | {si(b) if b else '-'} | {r} | "
        f"{', '.join(per_round)} | {busy('A')} / {busy('B')} | {invalid}/{total} |"
    )
if notes:
    out.append("")
    out.append("Invalid runs: " + "; ".join(notes) + ".")
print("\n".join(out))
PY
}

if [[ "${1:-}" == --report ]]; then
    [[ -n "${2:-}" && -f "$2/settings.env" ]] || die "--report DIR: DIR must hold a run (settings.env)"
    report "$2"
    exit 0
fi

REPEAT=${REPEAT:-3}
WORKLOADS=${WORKLOADS:-"ws-100 ws-1000 ws-10000 sse-1000 ingest-ws-580 ingest-ws-4096 ingest-post-580 ingest-post-4096"}
DELIVERIES=${DELIVERIES:-6000000}
SIZE=${SIZE:-580}
BATCH=${BATCH:-64}
WINDOW=${WINDOW:-256}
INGEST_EVENTS=${INGEST_EVENTS:-400000}
INGEST_BATCH=${INGEST_BATCH:-64}
INGEST_WINDOW=${INGEST_WINDOW:-1024}
A_ARGS=${A_ARGS:-}
B_ARGS=${B_ARGS:-}
PORT=${PORT:-18797}
TIMEOUT=${TIMEOUT:-120}
GRACE=${GRACE:-5}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
RESULTS=${RESULTS:-$CARGO_TARGET_DIR/ab/$(date -u +%Y%m%dT%H%M%SZ)}
BUILD=$CARGO_TARGET_DIR/ab/build

[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "REPEAT must be a positive number, not '$REPEAT'"

# --- the workloads: NAME, the metric, aep-load's arguments ----------------------------
declare -A LOAD_ARGS METRIC
NAMES=()
max_subs=1
# shellcheck source=benches/workloads.sh
. "$ROOT/benches/workloads.sh"
for w in $WORKLOADS; do
    workload "$w"
    LOAD_ARGS[$w]=$W_ARGS
    METRIC[$w]=$W_METRIC
    if ((W_SUBS > max_subs)); then max_subs=$W_SUBS; fi
    NAMES+=("$w")
done
((${#NAMES[@]})) || die "WORKLOADS is empty"

# --- the machine ------------------------------------------------------------------------
for tool in taskset python3 git; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done
# Every subscriber is a socket of aep-load and of the relay; both inherit this limit.
if (($(ulimit -n) < max_subs + 64)); then
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    if (($(ulimit -n) < max_subs + 64)); then
        die "the open-files limit $(ulimit -n) (hard $(ulimit -Hn)) is too low for $max_subs subscribers"
    fi
fi
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }
if port_busy; then
    die "port $PORT is in use (another relay or benchmark?); stop it or choose PORT="
fi

# --- the binaries ---------------------------------------------------------------------
# build_rev REV: builds REV's relay once; sets BUILT to the binary, LABEL to its name.
build_rev() {
    local rev=$1 full short dir
    full=$(git rev-parse --verify --quiet "$rev^{commit}") || die "not a git revision: $rev"
    short=$(git rev-parse --short "$full")
    LABEL="$rev ($short)"
    if [[ $full == "$rev"* ]]; then LABEL=$short; fi
    COMMIT=$(git rev-parse --short=12 "$full")
    dir=$BUILD/$COMMIT
    BUILT=$dir/aep-relay
    if [[ -x $BUILT ]]; then
        echo "== $rev ($COMMIT): reusing $BUILT" >&2
        return
    fi
    if [[ ! -e $dir/.git ]]; then
        mkdir -p "$BUILD"
        # --force: the path may still be registered from a worktree deleted by hand.
        git worktree add --force --detach "$dir" "$COMMIT" >&2
    fi
    echo "== $rev ($COMMIT): cargo build --release -p aep-relay in $dir" >&2
    # The fixtures only decide which tests are ignored; pointing the build at the current
    # tree's keeps its warning out (the worktree has no ../shared beside it).
    (cd "$dir" && AEP_SHARED_DIR=${AEP_SHARED_DIR:-$ROOT/../shared} \
        CARGO_TARGET_DIR=$BUILD/target cargo build --release -p aep-relay >&2)
    cp "$BUILD/target/release/aep-relay" "$BUILT.tmp"
    mv "$BUILT.tmp" "$BUILT"
}

if (($# == 2)); then
    [[ -z "${A_BIN:-}${B_BIN:-}" ]] || die "give two revisions or A_BIN and B_BIN, not both"
    build_rev "$1"
    A_BIN=$BUILT
    A_LABEL=${A_LABEL:-$LABEL}
    build_rev "$2"
    B_BIN=$BUILT
    B_LABEL=${B_LABEL:-$LABEL}
elif (($# == 0)) && [[ -n "${A_BIN:-}" && -n "${B_BIN:-}" ]]; then
    A_LABEL=${A_LABEL:-$A_BIN}
    B_LABEL=${B_LABEL:-$B_BIN}
else
    die "usage: benches/ab.sh A_REV B_REV | A_BIN=PATH B_BIN=PATH benches/ab.sh | benches/ab.sh --report DIR"
fi
if [[ -n $A_ARGS ]]; then A_LABEL="$A_LABEL $A_ARGS"; fi
if [[ -n $B_ARGS ]]; then B_LABEL="$B_LABEL $B_ARGS"; fi
for bin in "$A_BIN" "$B_BIN"; do
    [[ -x $bin ]] || die "$bin is not an executable"
done
A_BIN=$(realpath "$A_BIN")
B_BIN=$(realpath "$B_BIN")
if [[ -z "${LOAD_BIN:-}" ]]; then
    cargo build --release -p aep-load >&2
    LOAD_BIN=$CARGO_TARGET_DIR/release/aep-load
fi
[[ -x $LOAD_BIN ]] || die "$LOAD_BIN is not an executable"

# --- the runs -------------------------------------------------------------------------
mkdir -p "$RESULTS"
SERVER_PID=""
LOAD_PID=""
stop_server() {
    if [[ -n "$LOAD_PID" ]]; then
        kill "$LOAD_PID" 2>/dev/null || true
        wait "$LOAD_PID" 2>/dev/null || true
        LOAD_PID=""
    fi
    if [[ -n "$SERVER_PID" ]]; then
        kill "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$SERVER_PID" 2>/dev/null; then kill -KILL "$SERVER_PID"; fi
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# start_server BIN ARGS LOG: a fresh relay on SERVER_CPU; sets SERVER_PID.
start_server() {
    local bin=$1 args=$2 log=$3
    if port_busy; then
        die "port $PORT is in use by another process; stop it or choose PORT="
    fi
    # shellcheck disable=SC2086 # ARGS are words
    AEP_LOG=warn taskset -c "$SERVER_CPU" "$bin" --listen "127.0.0.1:$PORT" $args >"$log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 200); do
        if port_busy; then return 0; fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            SERVER_PID=""
            echo "ab.sh: the relay $bin exited at start; $log:" >&2
            tail -5 "$log" >&2
            exit 1
        fi
        sleep 0.05
    done
    die "the relay $bin did not listen on 127.0.0.1:$PORT within 10 s"
}

# one NAME SIDE ROUND: one aep-load run against a fresh relay of SIDE (A or B).
one() {
    local name=$1 side=$2 rnd=$3 bin args
    if [[ $side == A ]]; then bin=$A_BIN args=$A_ARGS; else bin=$B_BIN args=$B_ARGS; fi
    local out=$RESULTS/$name.$side.$rnd
    start_server "$bin" "$args" "$out.log"
    # In the background (it ignores SIGINT there; stop_server ends it), so that a relay
    # that dies mid-run ends the run within GRACE seconds rather than at aep-load's
    # --timeout (its publisher may not notice a dead peer).
    # shellcheck disable=SC2086 # LOAD_ARGS are words
    taskset -c "$LOAD_CPU" "$LOAD_BIN" --addr "127.0.0.1:$PORT" --server-pid "$SERVER_PID" \
        --json --timeout "$TIMEOUT" ${LOAD_ARGS[$name]} >"$out.json" 2>"$out.err" &
    LOAD_PID=$!
    local alive=1 dead_for=0 rc=0
    while kill -0 "$LOAD_PID" 2>/dev/null; do
        if ((alive)) && ! kill -0 "$SERVER_PID" 2>/dev/null; then alive=0; fi
        if ((!alive)); then
            dead_for=$((dead_for + 1))
            if ((dead_for > GRACE * 5)); then kill "$LOAD_PID" 2>/dev/null || true; fi
        fi
        sleep 0.2
    done
    wait "$LOAD_PID" || rc=$?
    LOAD_PID=""
    kill -0 "$SERVER_PID" 2>/dev/null || alive=0
    stop_server
    echo "rc=$rc alive=$alive" >"$out.meta"
    local figure
    figure=$(python3 - "$out.json" "${METRIC[$name]}" <<'PY'
import json, sys
try:
    with open(sys.argv[1]) as f:
        d = json.loads(f.read().strip().splitlines()[-1])
    print("{:.0f} per server CPU-s ({} CPU s, {} s), loss {}, dropped {}".format(
        d[sys.argv[2]], d["server_cpu_s"], d["seconds"], d["loss"], d["dropped_subscribers"]))
except Exception:
    print("no JSON line")
PY
)
    echo "  $name $side #$rnd: rc=$rc alive=$alive $figure $(tr '\n' ' ' <"$out.err")" >&2
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(date +%s)
for w in "${NAMES[@]}"; do
    printf '%s\t%s\t%s\n' "$w" "${METRIC[$w]}" "${LOAD_ARGS[$w]}"
done >"$RESULTS/workloads.tsv"
cat >"$RESULTS/settings.env" <<EOF
A_LABEL="$A_LABEL"
B_LABEL="$B_LABEL"
A_BIN="$A_BIN"
B_BIN="$B_BIN"
A_ARGS="$A_ARGS"
B_ARGS="$B_ARGS"
A_SHA256=$(sha256sum "$A_BIN" | cut -d' ' -f1)
B_SHA256=$(sha256sum "$B_BIN" | cut -d' ' -f1)
LOAD_BIN="$LOAD_BIN"
LOAD_COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo +dirty)"
REPEAT=$REPEAT
WORKLOADS="$WORKLOADS"
DELIVERIES=$DELIVERIES
SIZE=$SIZE
BATCH=$BATCH
WINDOW=$WINDOW
INGEST_EVENTS=$INGEST_EVENTS
INGEST_BATCH=$INGEST_BATCH
INGEST_WINDOW=$INGEST_WINDOW
PORT=$PORT
SERVER_CPU=$SERVER_CPU
LOAD_CPU=$LOAD_CPU
DATE="$(date -u +%Y-%m-%dT%H:%MZ)"
CORES=$(nproc)
LOAD_START="$LOAD_START"
EOF

echo "== A: $A_LABEL; B: $B_LABEL; $REPEAT rounds of ${#NAMES[@]} workloads; runs in $RESULTS" >&2
for rnd in $(seq "$REPEAT"); do
    order=(A B)
    if ((rnd % 2 == 0)); then order=(B A); fi
    echo "== round $rnd of $REPEAT: ${order[*]}" >&2
    for w in "${NAMES[@]}"; do
        for side in "${order[@]}"; do
            one "$w" "$side" "$rnd"
        done
    done
done

{
    echo "LOAD_END=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
    echo "ELAPSED_S=$(($(date +%s) - T0))"
} >>"$RESULTS/settings.env"
report "$RESULTS" | tee "$RESULTS/report.md"
echo "runs and report: $RESULTS" >&2
