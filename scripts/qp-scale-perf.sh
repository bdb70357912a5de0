#!/usr/bin/env bash
# Issue 24 item 4, timed two ways at once: roce-perf write_bw 64 KiB in
# loopback with -q 1 and with -q QPS --shared-buffer, each under
# `perf record -e cpu-clock`, pinned (client on CPU 0, engine on CPU 1), for
# each binary in turn, ROUNDS rounds. Each run prints its rate (MB/s) and its
# engine time per message in units of its ICRC work
# (scripts/perf-per-crc.py), which the VM's speed of the minute moves less.
# The summary gives, per binary, the medians of the rounds' rate ratio and
# unit ratio (-q 1 over -q QPS: 1.0 is no cost of the QPs' state) and of the
# -q QPS units.
#
#   scripts/qp-scale-perf.sh ROUNDS QPS BINARY [BINARY...]
#
# Needs perf (Debian's linux-perf). Takes /tmp/rsnic-host.lock around each run.
set -euo pipefail
rounds="${1:?rounds}"
qps="${2:?qps}"
shift 2
[ $# -ge 1 ] || { echo "usage: $0 ROUNDS QPS BINARY [BINARY...]" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
run() { # binary qps -> "MBps units"
    local data="$work/perf.data"
    local bw
    bw=$(flock /tmp/rsnic-host.lock perf record -q -e cpu-clock -F 4999 -o "$data" -- \
        taskset -c 0 "$1" write_bw --loopback --ip 10.9.0.1 -s 65536 -D 3 --core 1 \
        -q "$2" --shared-buffer 2>/dev/null | awk '/^ *[0-9]+ +[0-9]+ /{bw=$4} END{print bw}')
    echo "$bw $("$here/perf-per-crc.py" "$data" | awk '{print $2}')"
}
for r in $(seq 1 "$rounds"); do
    for b in "$@"; do
        one=$(run "$b" 1)
        many=$(run "$b" "$qps")
        echo "$b $one $many" | tee -a "$work/rows"
    done
done
python3 - "$work/rows" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    b, bw1, u1, bwn, un = line.split()
    rows.setdefault(b, []).append((float(bwn) / float(bw1), float(u1) / float(un), float(un)))
for b, r in rows.items():
    med = lambda i: statistics.median(x[i] for x in r)
    print(f"{b}: rate ratio {med(0):.3f}, unit ratio {med(1):.3f}, "
          f"-q N units {med(2):.3f} ({len(r)} rounds)")
EOF
