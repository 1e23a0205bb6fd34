#!/usr/bin/env bash
# The official AEP Python SDK as a real client (issue 22): builds aep-relay, installs
# `agenteventprotocol-sdk==0.1.0.dev1` (import `aep_sdk`) from PyPI into a virtual
# environment it creates, and runs tests/clients/sdk.py, which drives the real binary on
# 127.0.0.1 with the SDK's every public surface: Emitter/SessionEmitter with http_sink
# and redeliver() read back byte-identical, jsonl_sink into --ingest-file, sync subscribe
# (filter, capture, positions(), a slow-consumer disconnect, a restart with --history),
# from_="all", aio.subscribe live and live=False, the live=0 drain of a position set over
# the SDK's budget, ControlClient (sync and aio) with ControlTarget, roster() and every
# nack, and project_state. Then the same checks against two relays clustered through a
# real nats-server (emitters and control targets at one, subscribers and the control
# sender at the other).
# It prints PASS/FAIL per check, then `N passed, N failed`, and exits non-zero on any
# failure. nats-server comes from Debian's package and the SDK from PyPI the first time;
# later runs reuse them.
#
# Usage: tests/clients/sdk.sh            (from anywhere; run by CI after run.sh)
# Env:   CARGO_TARGET_DIR                (honoured, as cargo does; the venv lives there)
#        AEP_SDK_OUT                     (logs; default $target/sdk-out)
#        AEP_SDK_ONLY                    (comma-separated check names, default all)
#        AEP_SDK_TOPOLOGY                (single,cluster (the default), or one of them)
set -euo pipefail
cd "$(dirname "$0")/../.."

target="${CARGO_TARGET_DIR:-target}"
out="${AEP_SDK_OUT:-$target/sdk-out}"
venv="$target/sdk-venv"
sdk='agenteventprotocol-sdk==0.1.0.dev1'

# What the checks need. apt-get runs only when something is missing (CI runs as root).
apt_updated=""
need_deb_always() { # need_deb_always PACKAGE...
  echo "installing $* (Debian)"
  if [[ -z "$apt_updated" ]]; then
    apt-get update -q
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}
need_deb() { # need_deb COMMAND PACKAGE...: PACKAGE... when COMMAND is missing
  local cmd="$1"
  shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  need_deb_always "$@"
}
need_deb python3 python3 python3-venv
# Debian ships `python3 -m venv` (ensurepip) in a package of its own.
python3 -c 'import ensurepip' 2>/dev/null || need_deb_always python3-venv
# The cluster checks' engine; Debian puts it in /usr/sbin, which a user's PATH may lack.
[[ -x /usr/sbin/nats-server ]] || need_deb nats-server nats-server

# The SDK exactly as a user gets it: the pinned release from PyPI, in a venv of its own.
installed='import sys, aep_sdk; sys.exit(aep_sdk.__version__ != "0.1.0.dev1")'
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "$installed" 2>/dev/null; then
  echo "installing $sdk (PyPI) into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$sdk"
fi

cargo build --locked --bin aep-relay
bin="$target/debug/aep-relay"

rm -rf "$out"
mkdir -p "$out"

# The checks bound each of their waits; `timeout` bounds the whole run. The harness stops
# every process it started (relays, nats-server) when it ends or is terminated.
harness=""
cleanup() {
  if [[ -n "$harness" ]] && kill -0 "$harness" 2>/dev/null; then
    kill -TERM "$harness" 2>/dev/null || true
    wait "$harness" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

timeout --kill-after=15s 300s "$venv/bin/python" tests/clients/sdk.py \
  --bin "$bin" --out "$out" --only "${AEP_SDK_ONLY:-}" \
  --topology "${AEP_SDK_TOPOLOGY:-single,cluster}" &
harness=$!
status=0
wait "$harness" || status=$?
harness=""
exit "$status"
