#!/usr/bin/env bash
# Cluster mode measured: relays joined by one nats-server (JetStream), next to a single
# relay, under the same `aep-load` workloads, in one run. Rounds interleave the
# configurations; the report gives the median and the spread (min-max) over the rounds.
#
#   ingest    one relay, 1 SSE subscriber, POST batches of $BATCH as fast as the window
#             allows: Events/s through the stream and the p50/p99 of a POST's answer
#             (written to status line), against the same relay without --cluster; then
#             again with a window of 4096 Events in flight (latency not the bound).
#   e2e       POST at R1, SSE subscribers at R2, at $RATE Events/s: delivery latency
#             p50/p99 (the load tool's clock stamps each Event), against POST and SSE at
#             one single relay.
#   fanout    one relay, $SUBS SSE subscribers: deliveries/s and deliveries per relay
#             CPU-second (the bridge thread included), clustered and single.
#   three     three relays, $SUBS SSE subscribers at each, Events POSTed at R1: total
#             deliveries/s over the three, against one single relay with 3 x $SUBS.
#   ingest-b1 as ingest, one Event per POST (HTTP's per-request cost dominates).
#   fanout1000  as fanout with 1,000 subscribers.
#   engine    the engine's own ceiling: raw JetStream publishes of the same
#             Event from async-nats (`examples/jetstream_publish.rs`, window 256), one
#             Event per message and 64 per message, against a fresh nats-server.
#
# Placement: nats-server and the relays on core $SERVER_CPU, the load on $LOAD_CPU; the
# `three` scenario pins nothing (two cores, four servers and three loads: the figure is
# what this machine gives, not a scaling law; its loss column counts the info Events the
# relays dropped for consumers that fell behind, AEP-0003 §8.4).
#
# Usage: benches/cluster.sh   (env: ROUNDS 3, EVENTS 20000, BATCH 64, SUBS 100, RATE 1000,
#        SIZE 580, SERVER_CPU 1, LOAD_CPU 0, RESULTS target/cluster/DATE)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
EVENTS=${EVENTS:-20000}
BATCH=${BATCH:-64}
SUBS=${SUBS:-100}
RATE=${RATE:-1000}
SIZE=${SIZE:-580}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
RESULTS=${RESULTS:-target/cluster/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$RESULTS"
NATS=$(command -v nats-server || echo /usr/sbin/nats-server)
[[ -x $NATS ]] || { echo "nats-server is needed (apt install nats-server)" >&2; exit 1; }
cargo build --release --locked -q --bin aep-relay -p aep-relay
cargo build --release --locked -q -p aep-load
cargo build --release --locked -q --example jetstream_publish
RELAY=target/release/aep-relay
LOAD=target/release/aep-load
# Every server started, by pid (a file: relays start in command substitutions, whose
# variables do not reach this shell), killed on any exit.
PIDFILE="$RESULTS/pids"
: >"$PIDFILE"
cleanup() { while read -r p; do kill "$p" 2>/dev/null || true; done <"$PIDFILE"; wait 2>/dev/null || true; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_nats() {
  local dir; dir=$(mktemp -d)
  NATS_PORT=$(free_port)
  taskset -c "$SERVER_CPU" "$NATS" -a 127.0.0.1 -p "$NATS_PORT" -m -1 -js -sd "$dir" >"$RESULTS/nats.log" 2>&1 &
  NATS_PID=$!; echo "$NATS_PID" >>"$PIDFILE"
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$NATS_PORT") 2>/dev/null && return; sleep 0.05; done
  echo "nats-server did not start" >&2; exit 1
}

# start_relay CPU PORT [cluster args...]: waits for /readyz.
start_relay() {
  local cpu=$1 port=$2; shift 2
  taskset -c "$cpu" "$RELAY" --listen 127.0.0.1:"$port" "$@" >>"$RESULTS/relay-$port.log" 2>&1 &
  local pid=$!; echo "$pid" >>"$PIDFILE"
  for _ in $(seq 200); do
    if [[ $(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$port/readyz") == 200 ]]; then
      echo "$pid"; return
    fi
    sleep 0.05
  done
  echo "relay on $port not ready" >&2; exit 1
}

stop() { for p in "$@"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }

load() { taskset -c "$LOAD_CPU" "$LOAD" --json --size "$SIZE" --timeout 120 "$@"; }

wait_subs() { # wait_subs PORT N
  for _ in $(seq 400); do
    [[ $(curl -s "127.0.0.1:$1/healthz" | jq -r '.subscribers // 0') -ge $2 ]] && return
    sleep 0.05
  done
  echo "subscribers did not connect on $1" >&2; exit 1
}

out="$RESULTS/runs.jsonl"
# CPU ticks (1/100 s, user + system) a process has used so far; 0 for no process.
ticks() { if [[ -n ${1:-} ]]; then awk '{print $14+$15}' "/proc/$1/stat"; else echo 0; fi; }
# The same for the relay's bridge thread (named aep-cluster); 0 without one.
bridge_ticks() {
  local t
  for t in /proc/"$1"/task/*; do
    [[ $(cat "$t/comm" 2>/dev/null) == aep-cluster ]] && { awk '{print $14+$15}' "$t/stat"; return; }
  done
  echo 0
}
# ingest_cpu RELAY_PID ENGINE_PID EVENTS LOAD_ARGS...: one load run, with the relay's and
# the engine's CPU per Event added (relay_us_per_event, engine_us_per_event): where the
# shared core's time goes.
ingest_cpu() {
  local r=$1 e=$2 n=$3; shift 3
  local r0 e0 b0 r1 e1 b1 j
  r0=$(ticks "$r"); e0=$(ticks "$e"); b0=$(bridge_ticks "$r")
  j=$(load "$@" --events "$n" --server-pid "$r")
  r1=$(ticks "$r"); e1=$(ticks "$e"); b1=$(bridge_ticks "$r")
  jq -c --argjson rc $((r1 - r0)) --argjson ec $((e1 - e0)) --argjson bc $((b1 - b0)) --argjson n "$n" \
    '. + {relay_us_per_event: ($rc * 10000 / $n), bridge_us_per_event: ($bc * 10000 / $n), engine_us_per_event: ($ec * 10000 / $n)}' <<<"$j"
}
: >"$out"
record() { sed 's/NaN/null/g' | jq -c --arg s "$1" --arg c "$2" --argjson r "$3" '. + {scenario:$s, config:$c, round:$r}' >>"$out"; }

for round in $(seq "$ROUNDS"); do
  for config in single cluster; do
    if [[ $config == cluster ]]; then start_nats; fi
    cl() { [[ $config == cluster ]] && echo "--cluster nats://127.0.0.1:$NATS_PORT --relay-id $1 --cluster-stream B$round$2 --cluster-prefix b$round$2"; }
    # ingest
    p=$(free_port); r=$(start_relay "$SERVER_CPU" "$p" $(cl r1 i))
    engine=""; [[ $config == cluster ]] && engine=$NATS_PID
    ingest_cpu "$r" "$engine" "$EVENTS" --target sse --addr 127.0.0.1:"$p" --subscribers 1 --batch "$BATCH" | record ingest $config "$round"
    # the same with 16 times the window: what the relay takes when latency is not the bound
    ingest_cpu "$r" "$engine" "$EVENTS" --target sse --addr 127.0.0.1:"$p" --subscribers 1 --batch "$BATCH" --window 4096 | record ingest-w4096 $config "$round"
    ingest_cpu "$r" "$engine" $((EVENTS / 4)) --target sse --addr 127.0.0.1:"$p" --subscribers 1 --batch 1 | record ingest-b1 $config "$round"
    stop "$r"
    # fanout
    p=$(free_port); r=$(start_relay "$SERVER_CPU" "$p" $(cl r1 f))
    load --target sse --addr 127.0.0.1:"$p" --subscribers "$SUBS" --events "$EVENTS" --batch "$BATCH" --server-pid "$r" | record fanout $config "$round"
    stop "$r"
    p=$(free_port); r=$(start_relay "$SERVER_CPU" "$p" $(cl r1 g))
    load --target sse --addr 127.0.0.1:"$p" --subscribers 1000 --events $((EVENTS / 4)) --batch "$BATCH" --server-pid "$r" | record fanout1000 $config "$round"
    stop "$r"
    # e2e: POST at R1, subscribers at R2 (the same relay when single)
    p1=$(free_port); r1=$(start_relay "$SERVER_CPU" "$p1" $(cl r1 e))
    if [[ $config == cluster ]]; then p2=$(free_port); r2=$(start_relay "$SERVER_CPU" "$p2" $(cl r2 e)); else p2=$p1; r2=$r1; fi
    load --target sse --addr 127.0.0.1:"$p2" --publish-addr 127.0.0.1:"$p1" --subscribers 10 --events $((RATE * 3)) --rate "$RATE" --batch 1 | record e2e $config "$round"
    stop "$r1" "$r2"
    # three relays (3 x SUBS subscribers) against one: no pinning, every process on
    # both cores (four servers and their loads do not fit two cores one each)
    both=0,1
    if [[ $config == cluster ]]; then
      p1=$(free_port); p2=$(free_port); p3=$(free_port)
      r1=$(start_relay $both "$p1" $(cl r1 t)); r2=$(start_relay $both "$p2" $(cl r2 t)); r3=$(start_relay $both "$p3" $(cl r3 t))
      taskset -c $both "$LOAD" --json --size "$SIZE" --timeout 120 --target sse --addr 127.0.0.1:"$p2" --subscribers "$SUBS" --events "$EVENTS" --subscribe-only >"$RESULTS/t2.json" &
      l2=$!
      taskset -c $both "$LOAD" --json --size "$SIZE" --timeout 120 --target sse --addr 127.0.0.1:"$p3" --subscribers "$SUBS" --events "$EVENTS" --subscribe-only >"$RESULTS/t3.json" &
      l3=$!
      wait_subs "$p2" "$SUBS"; wait_subs "$p3" "$SUBS"
      taskset -c $both "$LOAD" --json --size "$SIZE" --timeout 120 --target sse --addr 127.0.0.1:"$p1" --subscribers "$SUBS" --events "$EVENTS" --batch "$BATCH" >"$RESULTS/t1.json"
      wait "$l2" "$l3"
      sed 's/NaN/null/g' "$RESULTS"/t{1,2,3}.json | jq -s -c '{deliveries: (map(.deliveries)|add), seconds: (map(.seconds)|max), loss: (map(.loss)|add)} | . + {deliveries_per_s: (.deliveries / .seconds)}' \
        | record three $config "$round"
      stop "$r1" "$r2" "$r3"
      stop "$NATS_PID"
      # the engine alone, fresh
      start_nats
      for per in 1 "$BATCH"; do
        taskset -c "$LOAD_CPU" target/release/examples/jetstream_publish "nats://127.0.0.1:$NATS_PORT" "$EVENTS" "$per" 256 "$SIZE" \
          | record "engine-$per" engine "$round"
      done
      stop "$NATS_PID"
    else
      p=$(free_port); r=$(start_relay $both "$p")
      taskset -c $both "$LOAD" --json --size "$SIZE" --timeout 120 --target sse --addr 127.0.0.1:"$p" --subscribers $((SUBS * 3)) --events "$EVENTS" --batch "$BATCH" | record three $config "$round"
      stop "$r"
    fi
  done
done

python3 - "$out" <<'EOF' | tee "$RESULTS/report.md"
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def cell(s, c, k, scale=1.0, fmt="{:.0f}"):
    v = sorted(r[k] * scale for r in runs if r["scenario"] == s and r["config"] == c and r.get(k) is not None)
    if not v:
        return "-"
    return (fmt + " ({}-{})").format(statistics.median(v), fmt.format(v[0]), fmt.format(v[-1]))
def ratio(s, k):
    by = {}
    for r in runs:
        if r["scenario"] == s:
            by.setdefault(r["round"], {})[r["config"]] = r[k]
    v = sorted(x["cluster"] / x["single"] for x in by.values() if "cluster" in x and "single" in x and x["single"])
    return "{:.2f}x ({:.2f}-{:.2f})".format(statistics.median(v), v[0], v[-1]) if v else "-"
print("| scenario | measure | single relay | cluster | cluster / single |")
print("|---|---|---|---|---|")
for s, k, name, scale, fmt in [
    ("ingest", "events_per_s", "Events/s", 1, "{:.0f}"),
    ("ingest", "post_p50_us", "POST answered p50, ms", 1e-3, "{:.2f}"),
    ("ingest", "post_p99_us", "POST answered p99, ms", 1e-3, "{:.2f}"),
    ("ingest", "relay_us_per_event", "relay CPU per Event, us", 1, "{:.2f}"),
    ("ingest", "bridge_us_per_event", "of which its bridge thread (async-nats), us", 1, "{:.2f}"),
    ("ingest", "engine_us_per_event", "nats-server CPU per Event, us (same core)", 1, "{:.2f}"),
    ("ingest-w4096", "events_per_s", "Events/s, window 4096", 1, "{:.0f}"),
    ("ingest-w4096", "post_p99_us", "POST answered p99, ms, window 4096", 1e-3, "{:.2f}"),
    ("ingest-b1", "events_per_s", "Events/s, one Event per POST", 1, "{:.0f}"),
    ("fanout", "deliveries_per_s", "deliveries/s", 1, "{:.0f}"),
    ("fanout", "deliveries_per_server_cpu_s", "deliveries per relay CPU-s", 1, "{:.0f}"),
    ("fanout1000", "deliveries_per_s", "deliveries/s, 1,000 subscribers", 1, "{:.0f}"),
    ("fanout1000", "deliveries_per_server_cpu_s", "deliveries per relay CPU-s, 1,000 subscribers", 1, "{:.0f}"),
    ("e2e", "p50_us", "delivery latency p50, ms", 1e-3, "{:.2f}"),
    ("e2e", "p99_us", "delivery latency p99, ms", 1e-3, "{:.2f}"),
    ("three", "deliveries_per_s", "total deliveries/s", 1, "{:.0f}"),
]:
    print(f"| {s} | {name} | {cell(s,'single',k,scale,fmt)} | {cell(s,'cluster',k,scale,fmt)} | {ratio(s,k)} |")
# The most a cluster relay could take with the engine on its core, against a single relay
# that saturates its own, per round: the single relay's CPU per Event, plus what moving
# each Event to the engine and back costs the bridge thread, plus the engine's own.
bound = []
for rnd in sorted({r["round"] for r in runs}):
    one = [r for r in runs if r["scenario"] == "ingest" and r["round"] == rnd]
    s1 = next((r["relay_us_per_event"] for r in one if r["config"] == "single"), None)
    c = next((r for r in one if r["config"] == "cluster"), None)
    if s1 and c and c.get("engine_us_per_event") is not None:
        bound.append(s1 / (s1 + c.get("bridge_us_per_event", 0) + c["engine_us_per_event"]))
if bound:
    bound.sort()
    print("| ingest | bound on one shared core: single relay CPU / (single relay CPU + bridge CPU + engine CPU) per Event | - | - | {:.2f}x ({:.2f}-{:.2f}) |".format(statistics.median(bound), bound[0], bound[-1]))
for per in sorted({r["per_message"] for r in runs if r["config"] == "engine"}):
    s = f"engine-{per}"
    print(f"| engine | raw JetStream publish, {per} Event(s) per message: Events/s | - | {cell(s, 'engine', 'events_per_s')} | - |")
    print(f"| engine | raw JetStream publish, {per} Event(s) per message: messages/s | - | {cell(s, 'engine', 'messages_per_s')} | - |")
losses = [f'{r["scenario"]}/{r["config"]}/round {r["round"]}: {r["loss"]}' for r in runs if r.get("loss")]
print(f"\n{len(runs)} runs; Events not delivered (backpressure drops): {', '.join(losses) or 'none'}")
EOF
