#!/usr/bin/env bash
# JSONL ingest end to end (target: `aep-relay --stdin` of a 1M-line JSONL file
# >= 1M Events/s admitted): the release binary reads a file of LINES valid Events of SIZE
# bytes on standard input (`--stdin --exit-on-stdin-eof`: it stops once every line is
# ingested), pinned to one core (`taskset -c $CPU`, all its threads), REPEAT rounds per
# session count, rounds of the session counts interleaved.
#
# The file: Event i belongs to session i % S (round-robin over S sessions, S in
# $SESSIONS), with a distinct id and `seq` rising per session; every line is the
# `tool.completed` Event of benches/support (`support::event`), padded to exactly SIZE
# bytes. It is generated once per S into $DIR (python3) and checked once with
# `aep-relay validate` (every line must be valid, or the run stops).
#
# Per round: the wall time from exec to exit (process start-up included; an empty input
# is timed once to show what that is), the relay's CPU time (user + sys, all threads),
# and Events/s = LINES / wall and LINES / CPU-second. A round whose relay exits non-zero
# or logs any WARN/ERROR line (an invalid or refused line) stops the script. Then the
# median of Events/s over the rounds, per S.
#
# The relay runs with `--max-sessions` S (no session is evicted) and `--buffer $BUFFER`
# (1 000 by default, as the figure in docs/history.md: with 100 sessions of 10 000 Events
# the buffers fill and later Events evict the oldest; 1 000 sessions x 1 000 fill exactly).
#
# Usage: benches/stdin.sh
#   LINES 1000000, SIZE 580, SESSIONS "100 1000", REPEAT 3, CPU 1, BUFFER 1000,
#   DIR target/stdin-bench (the generated files, kept for the next run),
#   RELAY target/release/aep-relay (build it first: cargo build --release -p aep-relay)
set -euo pipefail

cd "$(dirname "$0")/.."
LINES=${LINES:-1000000}
SIZE=${SIZE:-580}
SESSIONS=${SESSIONS:-"100 1000"}
REPEAT=${REPEAT:-3}
CPU=${CPU:-1}
BUFFER=${BUFFER:-1000}
DIR=${DIR:-target/stdin-bench}
RELAY=${RELAY:-target/release/aep-relay}

[[ -x $RELAY ]] || { echo "stdin.sh: no $RELAY; cargo build --release -p aep-relay" >&2; exit 2; }
mkdir -p "$DIR"

# gen S: writes $DIR/events-$LINES-$SIZE-$S.jsonl unless it is there already.
gen() {
    local s=$1 f="$DIR/events-$LINES-$SIZE-$1.jsonl"
    if [[ ! -s $f ]]; then
        python3 - "$LINES" "$SIZE" "$s" > "$f.tmp" <<'EOF'
import sys
lines, size, sessions = map(int, sys.argv[1:4])
out = sys.stdout
for n in range(lines):
    sess = f"s_{n % sessions:04}"
    seq = n // sessions + 1
    head = ('{"aep":"0.1","id":"01JXBENCH%016d","type":"tool.completed","subject":"Bash",'
            '"time":"2026-07-03T10:15:04.221Z","source":"aep://host-a/agent/claude-code/session/%s",'
            '"agent":"claude-code","session":"%s","run":"r_0042","seq":%d,"epoch":0,'
            '"severity":"info","capture":"metadata","loadts":%d,"data":{"tool":{"name":"Bash",'
            '"call_id":"t_91"},"status":"success","duration_ms":1240,"output":"') % (n, sess, sess, seq, n)
    tail = '"}}'
    out.write(head + "x" * max(0, size - len(head) - len(tail)) + tail + "\n")
EOF
        "$RELAY" validate "$f.tmp" > "$DIR/validate-$s.out" 2> "$DIR/validate-$s.err" || {
            echo "stdin.sh: generated lines are invalid:" >&2
            head -5 "$DIR/validate-$s.out" >&2
            exit 1
        }
        mv "$f.tmp" "$f"
    fi
    echo "$f"
}

# run S FILE: one round; prints "wall cpu".
run() {
    local s=$1 f=$2 log="$DIR/relay-$1.log" t="$DIR/time-$1"
    local TIMEFORMAT='%R %U %S'
    { time taskset -c "$CPU" "$RELAY" --listen 127.0.0.1:0 --stdin --exit-on-stdin-eof \
        --buffer "$BUFFER" --max-sessions "$s" < "$f" > /dev/null 2> "$log"; } 2> "$t" || {
        echo "stdin.sh: the relay failed (S=$s); $log:" >&2
        tail -5 "$log" >&2
        exit 1
    }
    if grep -qE ' (WARN|ERROR)[] ]' "$log"; then
        echo "stdin.sh: the relay reported problems (S=$s); $log:" >&2
        grep -E ' (WARN|ERROR)[] ]' "$log" | head -5 >&2
        exit 1
    fi
    awk '{ printf "%s %.3f\n", $1, $2 + $3 }' "$t"
}

declare -A FILE RATES
for s in $SESSIONS; do
    FILE[$s]=$(gen "$s")
done
empty=$(run 1 /dev/null)
echo "aep-relay --stdin: $LINES lines of $SIZE B, --buffer $BUFFER, pinned to core $CPU, $REPEAT rounds"
echo "start-up and exit on empty input: ${empty% *} s wall, ${empty#* } s CPU"
printf '%-9s %-6s %-9s %-9s %-12s %-12s\n' sessions round wall_s cpu_s Events/s Events/cpu_s
for r in $(seq 1 "$REPEAT"); do
    for s in $SESSIONS; do
        read -r wall cpu <<< "$(run "$s" "${FILE[$s]}")"
        rate=$(awk -v n="$LINES" -v t="$wall" 'BEGIN { printf "%.0f", n / t }')
        per_cpu=$(awk -v n="$LINES" -v t="$cpu" 'BEGIN { printf "%.0f", n / t }')
        RATES[$s]+="$rate "
        printf '%-9s %-6s %-9s %-9s %-12s %-12s\n' "$s" "$r" "$wall" "$cpu" "$rate" "$per_cpu"
    done
done
for s in $SESSIONS; do
    median=$(tr ' ' '\n' <<< "${RATES[$s]:-}" | { grep . || true; } | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
    echo "median, $s sessions: $median Events/s admitted (target: >= 1000000)"
done
