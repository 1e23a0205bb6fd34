#!/usr/bin/env bash
# The library depends on no tool: with default features off (no `cli`), the normal
# dependency tree of aep-relay must hold none of the binary's crates. Dev dependencies are
# left out (`-e normal`): criterion pulls clap into the benches only. Fails naming each
# one found, with the path that brings it in.
set -euo pipefail
cd "$(dirname "$0")/.."

forbidden=(clap ureq env_logger signal-hook)
tree="$(cargo tree --locked --no-default-features -e normal --prefix none)"
found=0
for crate in "${forbidden[@]}"; do
  if grep -Eq "^${crate} v" <<<"$tree"; then
    echo "deps: the library (--no-default-features) depends on ${crate}:" >&2
    cargo tree --locked --no-default-features -e normal -i "$crate" >&2 || true
    found=1
  fi
done
if [[ "$found" -ne 0 ]]; then
  exit 1
fi
echo "deps: the library's normal dependencies hold none of ${forbidden[*]}"
