#!/usr/bin/env bash
# Clients people already use, tested for real (issue 9 §1, §2): builds aep-relay, installs
# the clients from the registries, and runs tests/clients/clients.py, which drives the
# real binary on 127.0.0.1 with
#   - an EventSource page in headless Chromium (another origin, ?access_token=, a filter,
#     Last-Event-ID resume across a SIGTERM and a SIGKILL restart with --history; and
#     against hostile sessions: LF, CR, NUL, %, non-ASCII, 1 KiB),
#   - Python `websockets` as a consumer (two subscriptions) and as an emitter,
#   - the README's curl commands as the README shows them,
#   - the status page (GET /) in headless Chromium, with screenshots before and after:
#     its counters, sparklines, sessions table and live tail on one relay, and its relays
#     panel on one of two relays clustered through a real nats-server.
# It prints PASS/FAIL per check, then `N passed, N failed`, and exits non-zero on any
# failure. Chromium, curl, nats-server and a Python venv come from Debian's packages and PyPI the
# first time (a clean machine needs a few minutes for Chromium); later runs reuse them.
#
# Usage: tests/clients/run.sh            (from anywhere; run by CI after cargo test)
# Env:   CARGO_TARGET_DIR                (honoured, as cargo does; the venv lives there)
#        AEP_CLIENTS_OUT                 (logs and screenshots; default $target/clients-out)
#        AEP_CLIENTS_ONLY                (comma-separated check names, default all)
set -euo pipefail
cd "$(dirname "$0")/../.."

target="${CARGO_TARGET_DIR:-target}"
out="${AEP_CLIENTS_OUT:-$target/clients-out}"
venv="$target/clients-venv"

# What the checks need. apt-get runs only when something is missing (CI runs as root).
apt_updated=""
need_deb() { # need_deb COMMAND PACKAGE...
  local cmd="$1"
  shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  echo "installing $* (Debian) for $cmd"
  if [[ -z "$apt_updated" ]]; then
    apt-get update -q
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}
need_deb chromium chromium
need_deb curl curl
need_deb python3 python3 python3-venv
# The cluster check's engine; Debian puts it in /usr/sbin, which a user's PATH may lack.
[[ -x /usr/sbin/nats-server ]] || need_deb nats-server nats-server

if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import websockets' 2>/dev/null; then
  echo "installing websockets (PyPI) into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'websockets==17.4'
fi

cargo build --locked --bin aep-relay
bin="$target/debug/aep-relay"

rm -rf "$out"
mkdir -p "$out"

# The checks bound each of their waits; `timeout` bounds the whole run. The harness stops
# every process it started (relays, Chromium, curl) when it ends or is terminated.
harness=""
cleanup() {
  if [[ -n "$harness" ]] && kill -0 "$harness" 2>/dev/null; then
    kill -TERM "$harness" 2>/dev/null || true
    wait "$harness" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

timeout --kill-after=15s 600s "$venv/bin/python" tests/clients/clients.py \
  --bin "$bin" --out "$out" --only "${AEP_CLIENTS_ONLY:-}" &
harness=$!
status=0
wait "$harness" || status=$?
harness=""
exit "$status"
