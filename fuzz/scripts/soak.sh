#!/usr/bin/env bash
# Long runs, one target at a time (one libFuzzer job: the machine is shared).
#
#   fuzz/scripts/soak.sh SECONDS [TARGET...]
#
# Runs each target (all seven by default) for SECONDS of fuzzing in total, on the stable
# toolchain without a sanitizer. New corpus entries go to fuzz/work/<target> (ignored by
# git), the committed seeds in fuzz/corpus/<target> are read too. A crash stops libFuzzer;
# the script keeps the artifact (fuzz/artifacts/<target>/) and restarts the target for
# the rest of its time. One line per run goes to fuzz/work/soak.log.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:?usage: soak.sh SECONDS [TARGET...]}
shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(envelope filter downlevel sse_query http ws conn_script)
unset CARGO_TARGET_DIR
cargo fuzz build --sanitizer none >/dev/null 2>&1 || { echo "build failed" >&2; exit 1; }
mkdir -p work
for t in "${targets[@]}"; do
  case $t in http) dict=http; extra=(-max_len=8192) ;; ws) dict=ws; extra=(-max_len=8192) ;; sse_query) dict=query; extra=() ;; conn_script) dict=; extra=(-max_len=4096) ;; *) dict=json; extra=() ;; esac
  mkdir -p "work/$t"
  left=$secs
  while [ "$left" -gt 0 ]; do
    start=$(date +%s)
    log="work/$t.$(date +%H%M%S).log"
    cargo fuzz run --sanitizer none "$t" "work/$t" "corpus/$t" -- \
      ${dict:+-dict="dict/$dict.dict"} -max_total_time="$left" -timeout=10 -print_final_stats=1 \
      "${extra[@]}" >"$log" 2>&1
    rc=$?
    used=$(( $(date +%s) - start ))
    execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    crash=$(grep -o 'Test unit written to .*' "$log" | sed 's/Test unit written to //')
    echo "$(date -Is) $t rc=$rc seconds=$used execs=${execs:-?} crash=${crash:-none}" | tee -a work/soak.log
    left=$(( left - used ))
    [ "$rc" -ne 0 ] && [ -z "$crash" ] && break
  done
done
exit 0
