#!/usr/bin/env bash
# Self-certification over the wire (AEP-0003 §10): build aep-relay, start it with a small
# replay buffer on 127.0.0.1:0, and run `aep-relay check --evict` against it twice, with
# and without a bearer token. Fails unless both runs are all pass: no FAIL, and no SKIP
# except, without a token, the three control checks that need one (AEP-0004 §4.1).
#
# Usage: conformance/ci.sh            (from anywhere; it cd's to the project root)
# Env:   CARGO_TARGET_DIR             (honoured, as cargo does)
#        AEP_CI_BUFFER                (replay buffer for the runs; default 16)
#        AEP_CI_REPORTS               (directory for the two JSON reports; default a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."

buffer="${AEP_CI_BUFFER:-16}"
reports="${AEP_CI_REPORTS:-$(mktemp -d)}"
mkdir -p "$reports"

cargo build --locked --bin aep-relay
bin="${CARGO_TARGET_DIR:-target}/debug/aep-relay"

relay_pid=""
stop_relay() {
  if [[ -n "$relay_pid" ]]; then
    kill "$relay_pid" 2>/dev/null || true
    wait "$relay_pid" 2>/dev/null || true
    relay_pid=""
  fi
}
trap stop_relay EXIT

# start_relay LOG [ARGS...]: starts the relay in the background and sets $addr from its
# start-up line `aep-relay listening on ADDR (...)` (waits at most 10 s).
start_relay() {
  local log="$1"
  shift
  : >"$log" # exists before the poll reads it (the job opens it only after the fork)
  "$bin" --listen 127.0.0.1:0 --buffer "$buffer" "$@" 2>"$log" &
  relay_pid=$!
  addr=""
  for _ in $(seq 100); do
    addr="$(sed -n 's/^aep-relay listening on \([^ ]*\) (.*/\1/p' "$log" | head -n 1)"
    [[ -n "$addr" ]] && return 0
    if ! kill -0 "$relay_pid" 2>/dev/null; then
      echo "the relay exited at start-up:" >&2
      cat "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "no start-up line within 10 s:" >&2
  cat "$log" >&2
  return 1
}

# run_check NAME ALLOWED_SKIPS [CHECK ARGS...]: runs the checker against $addr; fails
# unless it exits 0 and skips nothing outside ALLOWED_SKIPS (an ERE alternation of check
# ids; `nothing` allows no skip).
run_check() {
  local name="$1" allowed="$2"
  shift 2
  local out="$reports/$name.txt"
  echo "== aep-relay check ($name) against http://$addr"
  local status=0
  "$bin" check "http://$addr" --evict --json "$reports/$name.json" "$@" | tee "$out" || status=$?
  if [[ "$status" -ne 0 ]]; then
    echo "conformance ($name): the checker exited $status" >&2
    return 1
  fi
  if ! tail -n 1 "$out" | grep -Eq '^[0-9]+ passed, 0 failed, [0-9]+ skipped$'; then
    echo "conformance ($name): unexpected summary line: $(tail -n 1 "$out")" >&2
    return 1
  fi
  local unexpected
  unexpected="$(grep '^SKIP ' "$out" | grep -Ev "^SKIP ($allowed) " || true)"
  if [[ -n "$unexpected" ]]; then
    echo "conformance ($name): checks that should have run were skipped:" >&2
    echo "$unexpected" >&2
    return 1
  fi
}

token="ci-$RANDOM-$RANDOM-$$"

start_relay "$reports/relay-open.log"
run_check open 'control-no-route|control-route|control-ambiguous'
stop_relay

start_relay "$reports/relay-token.log" --token "$token"
export AEP_TOKEN="$token"
run_check token 'nothing'
unset AEP_TOKEN
stop_relay

echo "conformance: both runs all pass (reports in $reports)"
