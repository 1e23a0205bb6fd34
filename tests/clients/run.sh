#!/usr/bin/env bash
# Clients people already use, tested for real: builds aep-relay, installs the clients from
# the registries, and runs tests/clients/clients.py, which drives the real binary on
# 127.0.0.1 with
#   - an EventSource page in headless Chromium (another origin, ?access_token=, a filter,
#     Last-Event-ID resume across a SIGTERM and a SIGKILL restart with --history; and
#     against hostile sessions: LF, CR, NUL, %, non-ASCII, 1 KiB),
#   - Python `websockets` as a consumer (two subscriptions) and as an emitter, and with
#     permessage-deflate on and off; Chromium's WebSocket with permessage-deflate,
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

source tests/clients/lib.sh
out="${AEP_CLIENTS_OUT:-$target/clients-out}"
venv="$target/clients-venv"

# What the checks need.
need_deb chromium chromium
need_deb curl curl
need_deb openssl openssl # browser-eventsource-https: the test certificate Chromium trusts
need_python_venv
need_nats_server
need_venv 'import websockets' 'websockets==17.4'

build_relay
# The harness stops every process it started (relays, Chromium, curl).
run_harness 600s tests/clients/clients.py \
  --bin "$bin" --out "$out" --only "${AEP_CLIENTS_ONLY:-}"
