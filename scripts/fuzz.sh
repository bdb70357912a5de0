#!/usr/bin/env bash
# Runs every cargo-fuzz target of every crate for N seconds (default 5).
# On the stable toolchain cargo-fuzz needs RUSTC_BOOTSTRAP=1, and we build
# without a sanitizer (-s none) so it needs no nightly runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-5}"
found=0
# One target directory for the three fuzz crates (each is its own
# workspace): libFuzzer and the shared crates are built once, not three
# times.
target_dir="$PWD/target/fuzz"
for dir in */fuzz; do
  [ -f "$dir/Cargo.toml" ] || continue
  for target in $(cd "$dir/.." && RUSTC_BOOTSTRAP=1 cargo fuzz list); do
    found=1
    echo "-- fuzz $dir $target (${secs}s)"
    # Start from the checked-in minimised corpus (fuzz/corpus/<target>, made by
    # scripts/fuzz-record.sh); what this run finds goes to a scratch dir, so
    # the checked-in one stays as committed.
    scratch="$target_dir/scratch-corpus/$target"
    (cd "$dir/.." && mkdir -p "$scratch" && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none --release \
        --target-dir "$target_dir" "$target" \
        "$scratch" $( [ -d "fuzz/corpus/$target" ] && echo "fuzz/corpus/$target" ) -- \
        -max_total_time="$secs" -print_final_stats=0 2>&1 | tail -n 3)
  done
done
[ "$found" = 1 ] || echo "no fuzz targets found"
