#!/usr/bin/env bash
# CI smoke run of the fuzz targets: keeps them compiling and runs each one for a few
# seconds over its committed seeds. Exits non-zero on a build failure or on any crash,
# panic, leak or timeout libFuzzer reports.
#
#   bash fuzz/smoke.sh            # every target, 5 s each
#   SMOKE_SECS=30 bash fuzz/smoke.sh http
#
# Stable Rust, no sanitizer (cargo-fuzz's AddressSanitizer needs nightly flags; see
# fuzz/README.md). About 2.5 minutes on 2 cores from a cold build cache, plus about 30 s
# when cargo-fuzz has to be installed.
set -euo pipefail
cd "$(dirname "$0")"
secs=${SMOKE_SECS:-5}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(envelope filter downlevel http floor sse_query ws conn_script store auth)

# The fuzz crate has its own workspace and target directory: a CARGO_TARGET_DIR meant
# for the main crate would mix builds with different RUSTFLAGS.
unset CARGO_TARGET_DIR

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "smoke: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

# More codegen units: a much faster build for a few seconds of fuzzing.
cargo fuzz build --sanitizer none --codegen-units 16 --target-dir target/smoke

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for t in "${targets[@]}"; do
  # conn_script's input is opcodes, not text: no dictionary.
  case $t in http | floor) dict=http ;; sse_query) dict=query ;; ws) dict=ws ;; conn_script | store) dict= ;; *) dict=json ;; esac
  mkdir -p "$scratch/$t"
  # New inputs go to the scratch corpus (first directory); the seeds are only read.
  if cargo fuzz run --sanitizer none --codegen-units 16 --target-dir target/smoke "$t" "$scratch/$t" "corpus/$t" -- \
      ${dict:+-dict="dict/$dict.dict"} -max_total_time="$secs" -timeout=10 \
      -print_final_stats=1 >"$scratch/$t.log" 2>&1; then
    runs=$(grep -m1 'stat::number_of_executed_units' "$scratch/$t.log" | awk '{print $2}')
    echo "smoke: $t ok (${runs:-?} runs in ${secs}s)"
  else
    status=1
    echo "smoke: $t FAILED; libFuzzer said:" >&2
    tail -n 40 "$scratch/$t.log" >&2
    ls artifacts/"$t" 2>/dev/null | sed 's/^/smoke: artifact: fuzz\/artifacts\/'"$t"'\//' >&2 || true
  fi
done
exit $status
