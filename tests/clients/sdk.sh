#!/usr/bin/env bash
# The official AEP Python SDK as a real client: builds aep-relay, installs
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

source tests/clients/lib.sh
out="${AEP_SDK_OUT:-$target/sdk-out}"
venv="$target/sdk-venv"

# What the checks need.
need_python_venv
need_nats_server
# The SDK exactly as a user gets it: the pinned release from PyPI, in a venv of its own.
need_venv 'import sys, aep_sdk; sys.exit(aep_sdk.__version__ != "0.1.0.dev1")' \
  'agenteventprotocol-sdk==0.1.0.dev1'

build_relay
# The harness stops every process it started (relays, nats-server).
run_harness 300s tests/clients/sdk.py \
  --bin "$bin" --out "$out" --only "${AEP_SDK_ONLY:-}" \
  --topology "${AEP_SDK_TOPOLOGY:-single,cluster}"
