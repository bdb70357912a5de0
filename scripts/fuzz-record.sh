#!/usr/bin/env bash
# Runs every cargo-fuzz target for a fixed number of executions (default
# 10^7) at the lowest CPU priority, one at a time, then minimises its corpus
# (`cargo fuzz cmin`) into <crate>/fuzz/corpus/<target>, the directory that is
# checked in and that scripts/fuzz.sh starts from. Prints one line per target:
# executions, wall time, coverage (libFuzzer's cov/ft) and corpus size.
#
# usage: scripts/fuzz-record.sh [RUNS] [TARGET...]   (log: target/fuzz-record.log)
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-10000000}"
shift || true
only=" $* "
log="$PWD/target/fuzz-record.log"
# The target directory scripts/fuzz.sh builds in (shared by the fuzz crates).
target_dir="$PWD/target/fuzz"
mkdir -p target
for dir in */fuzz; do
  [ -f "$dir/Cargo.toml" ] || continue
  for t in $(cd "$dir/.." && RUSTC_BOOTSTRAP=1 cargo fuzz list); do
    [ "$only" = "  " ] || [[ "$only" == *" $t "* ]] || continue
    corpus="$dir/corpus/$t"
    mkdir -p "$corpus"
    extra=()
    [ -d "$dir/seeds/$t" ] && extra+=("$PWD/$dir/seeds/$t")
    (cd "$dir/.." && RUSTC_BOOTSTRAP=1 nice -n 19 cargo fuzz build -s none --release --target-dir "$target_dir" "$t" >/dev/null 2>&1)
    start=$(date +%s)
    out=$(cd "$dir/.." && RUSTC_BOOTSTRAP=1 nice -n 19 cargo fuzz run -s none --release --target-dir "$target_dir" "$t" \
        "fuzz/corpus/$t" "${extra[@]}" -- -runs="$runs" -print_final_stats=1 2>&1 | tee -a "$log" |
        grep -E '^#[0-9]+[[:space:]]+DONE|^stat::|^==[0-9]+==|panicked|deadly signal' || true)
    secs=$(( $(date +%s) - start ))
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' <<<"$out" | tail -n 1 || true)
    execs=$(grep -E '^stat::number_of_executed_units' <<<"$out" | awk '{print $2}' || true)
    (cd "$dir/.." && RUSTC_BOOTSTRAP=1 nice -n 19 cargo fuzz cmin -s none --release --target-dir "$target_dir" "$t" "fuzz/corpus/$t" >>"$log" 2>&1)
    files=$(find "$corpus" -type f | wc -l)
    echo "$dir $t: ${execs:-?} executions in ${secs} s; ${done_line:-no DONE line (crash? see $log)}; minimised corpus ${files} files"
  done
done
