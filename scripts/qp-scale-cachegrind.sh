#!/usr/bin/env bash
# Issue 24 item 4, counted instead of timed: what one 64 KiB WRITE costs with
# one QP and with QPS QPs on one shared buffer, in instructions and in cache
# misses of a simulated 32 MiB last-level cache (valgrind's cachegrind). The
# counts do not move with the machine's speed, which on a shared VM moves a
# timed ratio by +-30 % from one run to the next.
#
#   scripts/qp-scale-cachegrind.sh [QPS] [BINARY]
#
# Defaults: 16384 QPs, target/release/roce-perf. Needs valgrind
# (apt-get install valgrind). Each figure is the difference of two runs,
# -n K+2 minus -n K messages per QP, so that the set-up (creating and
# connecting the QPs) drops out; about 4 minutes on 2 cores (two runs at a
# time: valgrind runs a process's threads one at a time).
#
# KEEP=DIR keeps each run's cachegrind output in DIR (many1, many3, one1,
# oneN .out) for a line-by-line account:
#   scripts/cachegrind-lines.py DIR/many1.out DIR/many3.out $((2 * QPS))
#
# Caveat: under valgrind a run is ~50x slower while timers keep wall time,
# so time-driven work (a 67 ms retransmit timer, the 1 ms counter
# publication) happens after far less work than natively, and what it
# costs natively when a QP has gone cold by then does not show here.
set -euo pipefail
qps="${1:-16384}"
bin="${2:-target/release/roce-perf}"
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
[ -z "${KEEP:-}" ] || mkdir -p "$KEEP"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
run() { # NAME ARGS...
    local name="$1"
    shift
    local cgout=/dev/null
    if [ -n "${KEEP:-}" ]; then cgout="$KEEP/$name.out"; fi
    # Large allocations from the heap, not one mmap each: valgrind has a
    # fixed number of address-space segments.
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432 timeout 1500 \
        valgrind --tool=cachegrind --cache-sim=yes --LL=33554432,16,64 --fair-sched=yes \
        --cachegrind-out-file="$cgout" "$bin" write_bw --loopback --ip 10.9.0.1 -s 65536 "$@" \
        >"$out/$name.log" 2>&1 || {
        echo "$name failed:" >&2
        tail -5 "$out/$name.log" >&2
        return 1
    }
}
# Ir, D1 misses and LL misses (reads + writes) of a run's summary.
totals() {
    awk '/ I +refs:/{gsub(",","",$4); ir=$4}
         / D1  misses:/{gsub(",","",$4); d1=$4}
         / LLd misses:/{gsub(",","",$4); ll=$4}
         END{print ir, d1, ll}' "$out/$1.log"
}
per_message() { # NAME_MORE NAME_LESS MESSAGES LABEL
    read -r i1 d1 l1 <<<"$(totals "$1")"
    read -r i0 d0 l0 <<<"$(totals "$2")"
    awk -v i="$((i1 - i0))" -v d="$((d1 - d0))" -v l="$((l1 - l0))" -v n="$3" -v t="$4" \
        'BEGIN{printf "%-28s %9.0f instructions %7.0f D1 misses %6.1f LL misses per message\n", t, i/n, d/n, l/n}'
}
# The shared machine's rule: DPDK runs hold /tmp/rsnic-host.lock.
exec 9>/tmp/rsnic-host.lock
flock 9
msgs=$((2 * qps))
run many1 -q "$qps" -n 1 --shared-buffer &
a=$!
run many3 -q "$qps" -n 3 --shared-buffer &
b=$!
wait "$a"
wait "$b"
run one1 -q 1 -n 1 &
a=$!
run oneN -q 1 -n $((msgs + 1)) &
b=$!
wait "$a"
wait "$b"
per_message oneN one1 "$msgs" "-q 1"
per_message many3 many1 "$msgs" "-q $qps --shared-buffer"
