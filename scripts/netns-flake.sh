#!/usr/bin/env bash
# The fresh-machine check of bench/tests/netns.rs (issue 14): before each of
# N runs (default 10) everything the test stands on is removed - both
# namespaces with their TAPs, bridges and veths, and the tun, veth and
# bridge modules where they can be unloaded (not while something else uses
# them, nor when built into the kernel) - so that every run is a first run.
# Runs roce_perf_between_two_namespaces_over_tap in namespaces named
# $RSNIC_NETNS-a/-b (default rsnic-rel) so it cannot collide with the
# default rsnic-a/-b. Exits 1 unless every run passed. Needs root.
#
# usage: scripts/netns-flake.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-10}"
export RSNIC_NETNS="${RSNIC_NETNS:-rsnic-rel}"
log_dir=target/netns-flake
mkdir -p "$log_dir"

echo "== building the netns test and roce-perf"
bin=$(cargo test --release -p bench --test netns --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\/deps\/netns-[^"]*\)".*/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "netns-flake: could not build the netns test" >&2; exit 1; }

from_nothing() {
  RSNIC_NETNS="$RSNIC_NETNS" scripts/netns.sh down
  # A module in use (another test's TAP, a bridge elsewhere) stays loaded;
  # a built-in one cannot be unloaded at all.
  for m in tun veth bridge; do
    if [ -e "/sys/module/$m/initstate" ] && modprobe -r "$m" 2>/dev/null; then
      echo "   unloaded $m"
    else
      echo "   $m: built in or in use, not unloaded"
    fi
  done
}

pass=0
for i in $(seq 1 "$runs"); do
  echo "== run $i/$runs: from nothing"
  from_nothing
  start=$(date +%s%N)
  if "$bin" --exact roce_perf_between_two_namespaces_over_tap --test-threads 1 >"$log_dir/run$i.log" 2>&1; then
    pass=$((pass + 1))
    echo "   PASS ($(( ($(date +%s%N) - start) / 1000000 )) ms)"
  else
    echo "   FAIL: $log_dir/run$i.log"
    grep -E "RetryExc|did not|panicked|error" "$log_dir/run$i.log" | head -n 5 | sed 's/^/   /'
  fi
done
RSNIC_NETNS="$RSNIC_NETNS" scripts/netns.sh down
echo "netns-flake: $pass of $runs runs passed"
[ "$pass" = "$runs" ]
