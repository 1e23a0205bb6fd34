#!/usr/bin/env bash
# The README's first command, exactly as written: `cargo run --release` must run the relay
# (the package has two binaries; `default-run` picks aep-relay). Starts
# `cargo run --release -- --listen 127.0.0.1:0`, waits for its start-up line (at most
# SMOKE_START_SECS, default 900, for a cold release build (async-nats and tokio included)
# and the start), checks `GET /healthz` on the printed address with curl, runs
# `cargo run --release -- check` against it (the `cargo run --release -- …` form of the
# README's subcommands), then stops it with SIGTERM and requires exit status 0 (a graceful
# shutdown).
set -euo pipefail
cd "$(dirname "$0")/.."

start_secs="${SMOKE_START_SECS:-900}"
scratch="$(mktemp -d)"
log="$scratch/relay.stderr"
pid=""
cleanup() {
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT

fail() {
  echo "smoke: $*" >&2
  echo "smoke: the relay's stderr:" >&2
  cat "$log" >&2 || true
  exit 1
}

# As the README writes it (no --locked: `cargo test --locked` has checked Cargo.lock).
# On Unix `cargo run` execs the binary, so $pid is the relay itself once it has started.
# The log exists first: the background job opens its redirection after the fork, and the
# poll below must not read a file that is not there yet (set -e would end the script).
: >"$log"
cargo run --release -- --listen 127.0.0.1:0 </dev/null >"$scratch/relay.stdout" 2>"$log" &
pid=$!

addr=""
deadline=$((SECONDS + start_secs))
while [[ -z "$addr" ]]; do
  addr="$(sed -n 's/^aep-relay listening on \([^ ]*\) (.*/\1/p' "$log" | head -n 1)"
  [[ -n "$addr" ]] && break
  kill -0 "$pid" 2>/dev/null || fail "cargo run --release exited before the start-up line"
  ((SECONDS < deadline)) || fail "no start-up line within ${start_secs} s"
  sleep 0.2
done
echo "smoke: cargo run --release listens on $addr"

health="$(curl -sS --max-time 10 -w '\n%{http_code}' "http://$addr/healthz")" ||
  fail "GET /healthz failed"
code="${health##*$'\n'}"
body="${health%$'\n'*}"
[[ "$code" == 200 ]] || fail "GET /healthz answered $code: $body"
[[ "$body" == *'"ok":true'* ]] || fail "GET /healthz body is not ok: $body"
echo "smoke: GET /healthz 200 $body"

if ! cargo run --release -- check "http://$addr" >"$scratch/check.out" 2>&1; then
  cat "$scratch/check.out" >&2
  fail "cargo run --release -- check exited non-zero"
fi
echo "smoke: cargo run --release -- check: $(tail -n 1 "$scratch/check.out")"

kill -TERM "$pid"
# The relay bounds its own drain (--shutdown-deadline-secs, 10 s); 30 s bounds this wait.
deadline=$((SECONDS + 30))
while kill -0 "$pid" 2>/dev/null; do
  ((SECONDS < deadline)) || fail "still running 30 s after SIGTERM"
  sleep 0.1
done
status=0
wait "$pid" || status=$?
pid=""
[[ "$status" -eq 0 ]] || fail "the relay exited $status after SIGTERM (want 0)"
grep -q 'shutdown complete' "$log" || fail "no 'shutdown complete' line after SIGTERM"
echo "smoke: SIGTERM: exit 0, shutdown complete"
