#!/usr/bin/env bash
# The relay on a constrained host: the release binary in a memory cgroup, under loads
# that would exhaust it without the memory budget (--max-memory, docs/operating.md
# "Sizing for a small host") and backpressure (--max-output, docs/consuming.md
# "Backpressure"). Per run it reports the peak resident memory (the relay's VmHWM and
# the group's own peak: v1 memory.max_usage_in_bytes, v2 memory.peak) against the
# budget, the Events/s admitted, evictions by reason and drops (by severity where
# /metrics has aep_dropped_events_total{severity}, else the totals it has), OOM kills in
# the group and whether the relay survived (it must: never OOM-killed).
#
# Runs (RUNS, in this order by default):
#   flood-40m      64 MiB group, --max-memory 40MiB: 300 sessions x 2 000 Events of
#                  1 KB in POSTs of 500 (the flood of tests/cli/memory_cgroup.rs)
#   flood-default  the same with the default flags (budget: half the group's limit)
#   stalled        the same group, STALLED_WS WebSocket and STALLED_SSE SSE consumers
#                  that subscribe and never read while STALLED_SESSIONS x 2 000 Events
#                  (a notice every 500th) are posted, default --max-output (8 MiB): how
#                  many the budget dropped, how many backpressure did
#   stalled-64m    the same with --max-output 64MiB, over the budget: backpressure
#                  cannot act first, the budget must (the stalled consumers share one
#                  stream, whose frames the budget counts once, so with the default
#                  8 MiB backpressure ends them before the budget is spent)
#   deltas-1m      --max-output 1MiB, one SSE consumer reading DELTA_RATE bytes/s
#                  (resuming by Last-Event-ID if the relay ends its stream) while
#                  20 000 debug Events of 900 B, a notice every 500th, are posted in
#                  POSTs of DELTA_BATCH: notices delivered (target 40 of 40) and
#                  disconnects (target 0)
#
# The group: as root with cgroup v1 a group under /sys/fs/cgroup/memory/ (the limit in
# memory.limit_in_bytes, swappiness 0); with v2 a sibling of this shell's group when its
# parent hands the memory controller down (memory.max). The relay joins the group before
# it execs (its pid written to cgroup.procs), pinned with `taskset -c $SERVER_CPU`; the
# load (benches/constrained_load.py, python3 stdlib only) runs with `taskset -c
# $LOAD_CPU`, outside the group. Where no group can be made the runs go on without one
# and the report says so (the default budget is then half the physical memory).
#
# Usage:
#   benches/constrained.sh                   # every run, ~30 s on this 2-core machine
#   RUNS="deltas-1m" benches/constrained.sh  # one of them
#   benches/constrained.sh --report DIR      # render a finished run's tables again
# Knobs (environment): RUNS, LIMIT (67108864 bytes), PORT 18811, SERVER_CPU 1,
#   LOAD_CPU 0, STALLED_WS 20, STALLED_SSE 20, STALLED_SESSIONS 100, DELTA_RATE 1600000, DELTA_BATCH 50, RELAY_BIN (default
#   target/release/aep-relay, built with `cargo build --release -p aep-relay` when
#   missing), RESULTS (default target/constrained/DATE).
# Each run's JSON (NAME.json), the relay's log (NAME.log), NAME.meta (pid, peaks, OOM
# kills, alive) and report.md stay in $RESULTS; the report goes to stdout too.
set -euo pipefail

cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

RUNS="${RUNS:-flood-40m flood-default stalled stalled-64m deltas-1m}"
LIMIT="${LIMIT:-67108864}"
PORT="${PORT:-18811}"
SERVER_CPU="${SERVER_CPU:-1}"
LOAD_CPU="${LOAD_CPU:-0}"
STALLED_WS="${STALLED_WS:-20}"
STALLED_SSE="${STALLED_SSE:-20}"
STALLED_SESSIONS="${STALLED_SESSIONS:-100}"
DELTA_RATE="${DELTA_RATE:-1600000}"
DELTA_BATCH="${DELTA_BATCH:-50}"
RELAY_BIN="${RELAY_BIN:-$CARGO_TARGET_DIR/release/aep-relay}"
LOAD=benches/constrained_load.py

die() {
    echo "constrained.sh: $*" >&2
    exit 2
}

# report DIR: the markdown tables of a finished run.
report() {
    python3 - "$1" <<'PY'
import json, os, sys

d = sys.argv[1]
order = open(os.path.join(d, "runs")).read().split()
settings = open(os.path.join(d, "settings.env")).read()
MiB = 1 << 20


def mib(v):
    return "–" if v in (None, "", 0) else f"{float(v) / MiB:.1f}"


def meta(name):
    out = {}
    p = os.path.join(d, name + ".meta")
    if os.path.exists(p):
        for kv in open(p).read().split():
            k, _, v = kv.partition("=")
            out[k] = v
    return out


def load(name):
    p = os.path.join(d, name + ".json")
    try:
        return json.loads(open(p).read().strip().splitlines()[-1])
    except Exception:
        return {}


def metric(m, prefix):
    """{label value: n} of the samples named `prefix`, or None where there are none."""
    got = {k: v for k, v in m.items() if k == prefix or k.startswith(prefix + "{")}
    if not got:
        return None
    return {(k.split('"')[1] if '"' in k else ""): int(v) for k, v in got.items()}


def fmt(d_):
    if d_ is None:
        return "n/a"
    return " / ".join(f"{k} {v}" if k else str(v) for k, v in d_.items())


rows, stalled, deltas = [], [], []
for name in order:
    mt, j = meta(name), load(name)
    m = j.get("metrics_end") or j.get("metrics") or {}
    budget = m.get("aep_memory_budget_bytes")
    admitted = j.get("admitted")
    admitted = None if admitted is None else int(admitted)
    secs = j.get("seconds") or 0
    rate = f"{admitted / secs:,.0f}" if admitted and secs else "–"
    pub = j.get("publisher", {})
    refused = sum(pub.get("not_202", {}).values()) if pub else "–"
    ev = metric(m, "aep_evictions_total")
    sev = metric(m, "aep_dropped_events_total")
    if sev is None:
        bp = metric(m, "aep_backpressure_dropped_total")
        sev = None if bp is None else {"all severities": bp.get("", 0)}
    survived = mt.get("alive") == "1" and mt.get("oom", "0") in ("0", "") and bool(j.get("health"))
    rows.append(
        f"| {name} | {mt.get('flags', '').replace('~', ' ') or '(defaults)'} | {mt.get('cgroup', 'none')} | "
        f"{mib(budget)} | {mib(mt.get('hwm'))} | {mib(mt.get('cgpeak'))} | {mib(j.get('peak_counted'))} | "
        f"{admitted if admitted is not None else '–'} in {secs:.1f} s | {rate} | {refused} | "
        f"{fmt(ev)} | {fmt(sev)} | {mt.get('oom', '–') or '–'} | {'yes' if survived else '**NO**'} |"
    )
    if "consumers" in j:
        c = j["consumers"]
        mm = j.get("metrics") or {}
        stalled.append(
            f"| {name} | {c['ws']} + {c['sse']} | {int(mm.get('aep_memory_dropped_consumers_total', 0))} | "
            f"{int(mm.get('aep_backpressure_disconnects_total', 0))} | {c['ended_budget']} | "
            f"{c['ended_other']} | {c['open']} | {mib(mt.get('hwm'))} | {mib(mt.get('cgpeak'))} |"
        )
    if "consumer" in j:
        c = j["consumer"]
        deltas.append(
            f"| {name} | {c['notices']} of {c['notices_posted']} | {c['disconnects']} | "
            f"{c['events']} of {pub.get('events_posted', '–')} | {c['event_bytes']} | "
            f"{c['bytes'] / max(c.get('seconds', 0) or 1, 1e-9) / 1e6:.2f} MB/s over {c.get('seconds', '–')} s | "
            f"{mib(mt.get('hwm'))} |"
        )
    for e in j.get("errors", []):
        rows.append(f"|  | error: {e[:150].replace('|', '/')} |")

print("### Constrained host\n")
print("| run | relay flags | cgroup | budget MiB | VmHWM MiB | cgroup peak MiB | counted peak MiB | "
      "Events admitted | Events/s | POSTs not 202 | evictions | drops by severity | OOM kills | survived |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
if stalled:
    print("\n| run | consumers WS + SSE | dropped by the budget | backpressure disconnects | "
          "ended, budget marker seen | ended, other | still open | VmHWM MiB | cgroup peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(stalled))
if deltas:
    print("\n| run | notices delivered | disconnects | Events delivered | bytes/Event | consumer read | VmHWM MiB |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(deltas))
print()
print("Counted peak: the largest total of aep_memory_used_bytes sampled every 0.25 s. "
      "Drops by severity are backpressure's (/metrics); 'all severities' where this relay "
      "counts them in one total.")
for line in settings.splitlines():
    if line.startswith(("COMMIT=", "CGROUP=")):
        print(f"{line}  ")
PY
}

if [ "${1:-}" = "--report" ]; then
    [ -d "${2:-}" ] || die "usage: $0 --report DIR"
    report "$2"
    exit 0
fi

command -v python3 >/dev/null || die "python3 is needed (apt-get install python3)"
command -v taskset >/dev/null || die "taskset is needed (util-linux)"
if [ ! -x "$RELAY_BIN" ]; then
    cargo build --release -p aep-relay
fi
[ -x "$RELAY_BIN" ] || die "no relay binary at $RELAY_BIN"

RESULTS="${RESULTS:-$CARGO_TARGET_DIR/constrained/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$RESULTS"

# Where a group can be made: CG_KIND v1 or v2 and CG_PARENT, or CG_KIND none and CG_WHY.
CG_KIND=none
CG_WHY=
CG_PARENT=
if [ "$(id -u)" != 0 ]; then
    CG_WHY="not root"
elif grep -qE '^[^ ]+ /sys/fs/cgroup/memory cgroup [^ ]*memory' /proc/mounts; then
    CG_KIND=v1
    CG_PARENT=/sys/fs/cgroup/memory
else
    own=$(sed -n 's/^0:://p' /proc/self/cgroup)
    v2root=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
    if [ -z "$v2root" ] || [ -z "$own" ]; then
        CG_WHY="no cgroup v1 memory hierarchy and no cgroup v2 mounted"
    else
        CG_PARENT="$v2root$(dirname "$own")"
        if grep -qw memory "$CG_PARENT/cgroup.subtree_control" 2>/dev/null; then
            CG_KIND=v2
        else
            CG_WHY="$CG_PARENT does not hand the memory controller to its children"
        fi
    fi
fi

{
    echo "COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo +dirty)"
    if [ "$CG_KIND" = none ]; then
        echo "CGROUP=\"none: $CG_WHY\""
    else
        echo "CGROUP=\"$CG_KIND, limit $LIMIT bytes\""
    fi
    for v in RUNS LIMIT PORT SERVER_CPU LOAD_CPU STALLED_WS STALLED_SSE STALLED_SESSIONS \
        DELTA_RATE DELTA_BATCH RELAY_BIN; do
        echo "$v=\"${!v}\""
    done
} >"$RESULTS/settings.env"
: >"$RESULTS/runs"
if [ "$CG_KIND" = none ]; then
    echo "constrained.sh: no memory cgroup ($CG_WHY): the relay runs without one" >&2
fi

RELAY_PID=
CG_DIR=

stop_relay() {
    if [ -n "$RELAY_PID" ]; then
        kill -TERM "$RELAY_PID" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$RELAY_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$RELAY_PID" 2>/dev/null || true
        wait "$RELAY_PID" 2>/dev/null || true
        RELAY_PID=
    fi
    if [ -n "$CG_DIR" ]; then
        # The group can go once its last process has been reaped.
        for _ in $(seq 50); do
            rmdir "$CG_DIR" 2>/dev/null && break
            sleep 0.1
        done
        [ -d "$CG_DIR" ] && echo "constrained.sh: could not remove $CG_DIR" >&2
        CG_DIR=
    fi
}
trap stop_relay EXIT
trap 'exit 130' INT TERM

# cg_read FILE [KEY]: a group file's number (the KEY line's for keyed files), or empty.
cg_read() {
    local f="$CG_DIR/$1"
    [ -n "$CG_DIR" ] && [ -r "$f" ] || return 0
    if [ $# -gt 1 ]; then
        awk -v k="$2" '$1 == k { print $2 }' "$f"
    else
        cat "$f"
    fi
}

# run NAME "RELAY FLAGS" LOAD ARGS...: one relay in a fresh group, one load, the figures.
run() {
    local name=$1 flags=$2
    shift 2
    local log="$RESULTS/$name.log" procs=/dev/null
    echo "$name" >>"$RESULTS/runs"
    if [ "$CG_KIND" != none ]; then
        CG_DIR="$CG_PARENT/aep-constrained-$$-$name"
        mkdir "$CG_DIR"
        if [ "$CG_KIND" = v1 ]; then
            echo "$LIMIT" >"$CG_DIR/memory.limit_in_bytes"
            echo 0 >"$CG_DIR/memory.swappiness" 2>/dev/null || true
        else
            echo "$LIMIT" >"$CG_DIR/memory.max"
            echo 0 >"$CG_DIR/memory.swap.max" 2>/dev/null || true
        fi
        procs="$CG_DIR/cgroup.procs"
    fi
    # The shell joins the group, then execs the relay: its pid is the relay's.
    # shellcheck disable=SC2016,SC2086
    taskset -c "$SERVER_CPU" sh -c 'p=$1; shift; echo $$ >"$p" && exec "$@"' sh "$procs" \
        "$RELAY_BIN" --listen "127.0.0.1:$PORT" $flags </dev/null >/dev/null 2>"$log" &
    RELAY_PID=$!
    for _ in $(seq 100); do
        grep -q '^aep-relay listening on' "$log" && break
        kill -0 "$RELAY_PID" 2>/dev/null || break
        sleep 0.1
    done
    grep -q '^aep-relay listening on' "$log" || { cat "$log" >&2; die "$name: the relay did not start"; }
    echo "== $name: $(grep -o 'memory budget [^)]*)' "$log") ${CG_DIR:+in $CG_DIR}" >&2
    taskset -c "$LOAD_CPU" python3 "$LOAD" "$@" --addr "127.0.0.1:$PORT" >"$RESULTS/$name.json" \
        2>"$RESULTS/$name.err" || {
        rc=$?
        [ "$rc" = 130 ] && exit 130 # interrupted: no report of a half run
        echo "$name: the load exited $rc" >&2
    }
    local alive=0 hwm=
    if [ "$(awk '/^State:/ { print $2 }' "/proc/$RELAY_PID/status" 2>/dev/null)" != Z ] &&
        kill -0 "$RELAY_PID" 2>/dev/null; then
        alive=1
        hwm=$(($(awk '/^VmHWM:/ { print $2 }' "/proc/$RELAY_PID/status") * 1024))
    fi
    local cgpeak oom
    if [ "$CG_KIND" = v1 ]; then
        cgpeak=$(cg_read memory.max_usage_in_bytes)
        oom=$(cg_read memory.oom_control oom_kill)
    else
        cgpeak=$(cg_read memory.peak)
        oom=$(cg_read memory.events oom_kill)
    fi
    echo "pid=$RELAY_PID alive=$alive hwm=$hwm cgpeak=$cgpeak oom=$oom cgroup=${CG_KIND}" \
        "flags=${flags// /\~}" >"$RESULTS/$name.meta"
    stop_relay
}

for r in $RUNS; do
    case $r in
    flood-40m) run "$r" "--max-memory 40MiB" flood ;;
    flood-default) run "$r" "" flood ;;
    stalled) run "$r" "" stalled --ws "$STALLED_WS" --sse "$STALLED_SSE" \
        --sessions "$STALLED_SESSIONS" --notice-every 500 ;;
    stalled-64m) run "$r" "--max-output 67108864" stalled --ws "$STALLED_WS" \
        --sse "$STALLED_SSE" --sessions "$STALLED_SESSIONS" --notice-every 500 ;;
    deltas-1m) run "$r" "--max-output 1048576" deltas --events 20000 --size 900 \
        --notice-every 500 --batch "$DELTA_BATCH" --rate "$DELTA_RATE" ;;
    *) die "unknown run $r (flood-40m flood-default stalled stalled-64m deltas-1m)" ;;
    esac
done

report "$RESULTS" | tee "$RESULTS/report.md"
