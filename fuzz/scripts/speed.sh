#!/usr/bin/env bash
# Execs/s of fuzz targets, side by side for the builds that matter, in one run: each round
# starts from the committed seeds with the target's dictionary and a fresh scratch corpus,
# pinned to one core, and reports libFuzzer's stat::average_exec_per_sec. Prints one line
# per (build, target) with the median and the spread of the rounds.
#
#   bash fuzz/scripts/speed.sh                       # floor http ws, 3 rounds of 30 s
#   ROUNDS=5 SECS=60 CORE=1 bash fuzz/scripts/speed.sh http ws conn_script
#
# Builds (all `--sanitizer none`, stable Rust):
#   default     `cargo fuzz build`: debug assertions and overflow checks, comparison
#               tracing (what `cargo fuzz run` uses unless told otherwise)
#   no-cmp      `--no-trace-compares`: the same checks, no comparison tracing (the
#               dictionaries give the tokens it would find)
#   release     `-O --no-trace-compares`: neither checks nor comparison tracing
set -euo pipefail
cd "$(dirname "$0")/.."
unset CARGO_TARGET_DIR
rounds=${ROUNDS:-3}
secs=${SECS:-30}
core=${CORE:-1}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(floor http ws)
builds=(default no-cmp release)

flags() {
  case $1 in
    default) echo "" ;;
    no-cmp) echo "--no-trace-compares" ;;
    release) echo "-O --no-trace-compares" ;;
  esac
}

for b in "${builds[@]}"; do
  # shellcheck disable=SC2046
  cargo fuzz build --sanitizer none $(flags "$b") --target-dir "target/speed-$b" >/dev/null 2>&1 \
    || { echo "speed: build $b failed" >&2; exit 1; }
done

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "build target median min max (execs/s; $rounds rounds of ${secs}s on core $core)"
for t in "${targets[@]}"; do
  case $t in http | floor) dict=http ;; sse_query) dict=query ;; ws) dict=ws ;; conn_script) dict= ;; *) dict=json ;; esac
  for b in "${builds[@]}"; do
    bin=target/speed-$b/x86_64-unknown-linux-gnu/release/$t
    runs=()
    for _ in $(seq "$rounds"); do
      rm -rf "$scratch/c" && mkdir -p "$scratch/c"
      # A crash stops the run: it is reported (and kept in artifacts/) instead of a number.
      mkdir -p "artifacts/$t"
      taskset -c "$core" "$bin" "$scratch/c" "corpus/$t" ${dict:+-dict="dict/$dict.dict"} \
        -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="artifacts/$t/" \
        >"$scratch/log" 2>&1 \
        || { echo "speed: $t ($b) failed:" >&2; tail -20 "$scratch/log" >&2; exit 1; }
      runs+=("$(awk '/stat::average_exec_per_sec/ {print $2}' "$scratch/log")")
    done
    sorted=$(printf '%s\n' "${runs[@]}" | sort -n)
    median=$(echo "$sorted" | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
    echo "$b $t $median $(echo "$sorted" | head -1) $(echo "$sorted" | tail -1)"
  done
done
