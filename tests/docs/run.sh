#!/usr/bin/env bash
# The documentation, run (CI runs it after tests/clients/run.sh): every command of
# README.md and docs/*.md against real relays, each shown output compared
# (tests/docs/run_docs.py says how a page's blocks are read). Builds aep-relay, installs
# what the pages use when it is missing (curl, openssl, nats-server from Debian;
# `websockets` from PyPI into the clients' venv), then prints PASS/FAIL/SKIP per command and
# `N passed, N failed, N skipped`, and exits non-zero on any failure.
#
# Usage: tests/docs/run.sh [PAGE.md...]     (default: README.md and docs/*.md)
# Env:   CARGO_TARGET_DIR                   (honoured, as cargo does)
#        AEP_DOCS_OUT                       (scratch directories; default $target/docs-out)
set -euo pipefail
cd "$(dirname "$0")/../.."

source tests/clients/lib.sh
out="${AEP_DOCS_OUT:-$target/docs-out}"
# The same venv and pin as tests/clients/run.sh: one install serves both.
venv="$target/clients-venv"

need_deb curl curl
need_deb openssl openssl
need_python_venv
need_nats_server
need_venv 'import websockets' 'websockets==17.4'

build_relay
run_harness 900s tests/docs/run_docs.py --bin "$bin" --venv "$venv" --out "$out" "$@"
