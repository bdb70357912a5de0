#!/usr/bin/env bash
# Issue 24 item 5: roce-perf's rate with and without one busy process
# (`yes > /dev/null`) on the machine, in alternating rounds, so that both
# figures of a round come from the same minute.
#
#   scripts/shared-core-bench.sh [ROUNDS] [BINARY] [-- roce-perf arguments]
#
# Defaults: 4 rounds, target/release/roce-perf,
# `write_bw --loopback --ip 10.9.0.1 -s 64 -D 3`. Prints one line per run
# (round, alone|yes, the last row of roce-perf's table) and the load.
# Takes /tmp/rsnic-host.lock around each run (the shared machine's rule).
set -euo pipefail
rounds="${1:-4}"
bin="${2:-target/release/roce-perf}"
shift $(( $# > 2 ? 2 : $# )) || true
[[ "${1:-}" == "--" ]] && shift
args=("$@")
(( ${#args[@]} )) || args=(write_bw --loopback --ip 10.9.0.1 -s 64 -D 3)
run() {
    flock /tmp/rsnic-host.lock timeout 120 "$bin" "${args[@]}" 2>&1 \
        | awk '/^ *[0-9]+ +[0-9]+ /{last=$0} END{print last}'
}
for r in $(seq 1 "$rounds"); do
    echo "round $r alone: $(run)"
    yes > /dev/null &
    y=$!
    sleep 0.5
    echo "round $r yes:   $(run)"
    kill "$y"
    wait "$y" 2>/dev/null || true
    echo "load: $(uptime | sed 's/.*load average/load average/')"
done
