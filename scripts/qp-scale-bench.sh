#!/usr/bin/env bash
# Issue 24 item 4: roce-perf write_bw 64 KiB in loopback with one QP, with
# many QPs on one shared buffer (--shared-buffer: only the QPs' own state
# grows) and with a buffer per QP (perftest's layout), in alternating rounds
# so that the figures of a round come from the same minute.
#
#   scripts/qp-scale-bench.sh [ROUNDS] [QPS] [BINARY]
#
# Defaults: 3 rounds, 16384 QPs, target/release/roce-perf. Takes
# /tmp/rsnic-host.lock around each run (the shared machine's rule).
# PIN=1: the client on CPU 0 (taskset) and the engine thread on CPU 1
# (--core 1), so that no run's ratio depends on where the threads landed.
set -euo pipefail
rounds="${1:-3}"
qps="${2:-16384}"
bin="${3:-target/release/roce-perf}"
pin=()
core=()
if [ "${PIN:-0}" = 1 ]; then
    pin=(taskset -c 0)
    core=(--core 1)
fi
run() {
    flock /tmp/rsnic-host.lock timeout 300 "${pin[@]}" "$bin" write_bw --loopback --ip 10.9.0.1 \
        -s 65536 -D 3 "${core[@]}" "$@" 2>&1 | awk '/^ *[0-9]+ +[0-9]+ /{last=$0} END{print last}'
}
for r in $(seq 1 "$rounds"); do
    echo "round $r -q 1:                    $(run -q 1)"
    echo "round $r -q $qps --shared-buffer: $(run -q "$qps" --shared-buffer)"
    echo "round $r -q $qps:                 $(run -q "$qps")"
    echo "load: $(uptime | sed 's/.*load average/load average/')"
done
