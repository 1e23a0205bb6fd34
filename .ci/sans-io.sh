#!/usr/bin/env bash
# The core cannot do I/O by construction: the sans-IO module tree names no socket, poller,
# clock or file system. Only the I/O layer (src/io: the reactor, the transport, TLS, the
# JSONL reader threads, the history files, the cluster outbox file and the cluster bridge)
# and the binary touch them. Unit-test files (`tests.rs`) may read the clock to get an
# `Instant` to start from; they are not the core's code.
set -euo pipefail
cd "$(dirname "$0")/.."
core=(src/core src/wire src/filter src/capture src/store src/fanout src/cluster src/control.rs
      src/subscription.rs src/auth src/metrics.rs)
pattern='mio::|TcpStream|TcpListener|UdpSocket|Instant::now|SystemTime::now|\.elapsed\(\)|std::fs|std::net::Tcp|std::thread'
if hits=$(grep -rnE --include='*.rs' --exclude='tests.rs' "$pattern" "${core[@]}"); then
  echo "sans-io: the core names I/O it must not do:" >&2
  echo "$hits" >&2
  exit 1
fi
lines=$(cat src/io/reactor/*.rs | grep -cv "^\s*\(//.*\)\?$")
echo "sans-io: ${#core[@]} core modules name no socket, clock or file; the reactor (src/io/reactor) has $lines lines of code"
