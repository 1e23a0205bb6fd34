#!/usr/bin/env bash
# The core cannot do I/O by construction (issue 14): the sans-IO module tree names no
# socket, poller, clock or file system. Only the reactor (src/reactor, src/transport.rs,
# src/tls.rs), the JSONL readers (src/jsonl.rs), the history files (src/history) and
# the binary touch them. Unit-test files (`tests.rs`) may read the clock to get an
# `Instant` to start from; they are not the core's code.
set -euo pipefail
cd "$(dirname "$0")/.."
core=(src/core src/envelope src/filter src/capture src/store src/fanout src/ws
      src/cluster/mod.rs src/control.rs src/http.rs src/sse.rs src/subscription.rs src/auth.rs src/metrics.rs)
pattern='mio::|TcpStream|TcpListener|UdpSocket|Instant::now|SystemTime::now|\.elapsed\(\)|std::fs|std::net::Tcp|std::thread'
if hits=$(grep -rnE --include='*.rs' --exclude='tests.rs' "$pattern" "${core[@]}"); then
  echo "sans-io: the core names I/O it must not do:" >&2
  echo "$hits" >&2
  exit 1
fi
lines=$(cat src/reactor/*.rs | grep -cv "^\s*\(//.*\)\?$")
echo "sans-io: ${#core[@]} core modules name no socket, clock or file; the reactor (src/reactor) has $lines lines of code"
