#!/usr/bin/env bash
# The shard-scaling and one-QP matrix of docs/benchmarks.md ("Line rate on
# many cores"): roce-perf --loopback, each line one configuration, -D 3.
#
#   scripts/scale-matrix.sh [OUT.txt]
#
# ROCE_PERF: the command that runs roce-perf (default target/release/roce-perf;
# on a host without DPDK, a bundle's `run roce-perf`, ../shared/device/README.md).
# EAL: extra EAL arguments (e.g. --no-huge -m 4096 -d PMDS on such a host).
# MATRIX: which part: all (default), shards, small, oneqp, qpscale (16k QPs
# against one, item 4), shared (64 B confined to CPUs 0-1, alone and beside
# a `yes` on CPU 0, item 5).
# LINE_GBPS: the ring pair's line rate (--line_rate_gbps, default 400): the
# shards of a side share their port's line, so the matrix's port is faster
# than anything it measures.
set -u
out=${1:-/dev/stdout}
rp=${ROCE_PERF:-target/release/roce-perf}
eal=${EAL:-}
line=${LINE_GBPS:-400}
part=${MATRIX:-all}
n=0
run() { # label, roce-perf args...
  local label=$1; shift
  n=$((n + 1))
  local res json=${TMPDIR:-/tmp}/scale-matrix.$$.json
  rm -f "$json"
  # shellcheck disable=SC2086
  res=$(timeout 60 ${WRAP:-} $rp "$@" --loopback --ip 10.9.0.1 --report_gbits -D 3 --line_rate_gbps "$line" --out_json "$json" \
        -- $eal --file-prefix=sm$$_$n --log-level=error 2>&1)
  local row warn losses
  row=$(printf '%s\n' "$res" | awk '$1 ~ /^[0-9]+$/ && NF >= 5 {print $4, $5}' | tail -1)
  warn=$(printf '%s\n' "$res" | grep -c 'warning: ' || true)
  # The client NIC's loss recovery and drops, where there were any.
  losses=$(grep -o '"\(retransmits\|timeouts\|[a-z_]*drop[a-z_]*\)":[1-9][0-9]*' "$json" 2>/dev/null \
           | tr -d '"' | tr '\n' ' ')
  printf '%-44s %s%s%s\n' "$label" "${row:-FAILED: $(printf '%s' "$res" | tail -2 | tr '\n' ' ')}" \
    "$([ "$warn" != 0 ] && echo ' (oversubscribed)')" "${losses:+ [$losses]}" >>"$out"
  rm -f "$json"
}
[ "$out" = /dev/stdout ] || : >"$out"
echo "# label  Gbit/s_avg  Mmsg/s  ($(nproc) CPUs, $(date -u +%FT%TZ))" >>"$out"
if [ "$part" = all ] || [ "$part" = oneqp ]; then
  run "write 64K -q1 (engines on one thread)" write_bw -s 65536
  run "write 64K -q1 --shards 1" write_bw -s 65536 --shards 1
  run "read 64K -q1 --shards 1" read_bw -s 65536 --shards 1
  run "write 64K -q1 --shards 1 -t 512" write_bw -s 65536 --shards 1 -t 512
  run "read 64K -q1 --shards 1 -t 512" read_bw -s 65536 --shards 1 -t 512
  run "write 64K -q1 --shards 1 --copy_threshold 4096" write_bw -s 65536 --shards 1 --copy_threshold 4096
  run "read 64K -q1 --shards 1 --copy_threshold 4096" read_bw -s 65536 --shards 1 --copy_threshold 4096
fi
if [ "$part" = all ] || [ "$part" = shards ]; then
  for s in 1 2 4 6 7 8; do
    run "write 64K --shards $s -q $((2 * s))" write_bw -s 65536 --shards $s -q $((2 * s))
  done
  run "write 64K --shards 4 -q 8 --dispatcher" write_bw -s 65536 --shards 4 -q 8 --dispatcher
  run "write 64K --shards 6 -q 12 --dispatcher" write_bw -s 65536 --shards 6 -q 12 --dispatcher
fi
if [ "$part" = all ] || [ "$part" = qpscale ]; then
  for r in 1 2; do
    run "write 64K -q 1 (round $r)" write_bw -s 65536 -q 1
    run "write 64K -q 16384 --shared-buffer (round $r)" write_bw -s 65536 -q 16384 --shared-buffer
    run "write 64K -q 16384 (round $r)" write_bw -s 65536 -q 16384
  done
fi
if [ "$part" = all ] || [ "$part" = shared ]; then
  for r in 1 2 3; do
    WRAP="taskset -c 0,1" run "write 64B on CPUs 0-1, alone (round $r)" write_bw -s 64
    taskset -c 0 yes >/dev/null &
    y=$!
    WRAP="taskset -c 0,1" run "write 64B on CPUs 0-1, yes on 0 (round $r)" write_bw -s 64
    kill "$y"; wait "$y" 2>/dev/null
  done
fi
if [ "$part" = all ] || [ "$part" = small ]; then
  run "write 64B -q1 (engines on one thread)" write_bw -s 64
  for s in 1 2 4 6 7 8; do
    run "write 64B --shards $s -q $((4 * s)) -t 1024 -l 16" write_bw -s 64 --shards $s -q $((4 * s)) -t 1024 -l 16
  done
  run "write 64B --shards 4 -q 16 -t 1024 (-l 1)" write_bw -s 64 --shards 4 -q 16 -t 1024
  run "write 64B --shards 7 -q 28 -t 1024 (-l 1)" write_bw -s 64 --shards 7 -q 28 -t 1024
  run "write 64B --shards 4 -q 16 -t 1024 -l 16 --dispatcher" write_bw -s 64 --shards 4 -q 16 -t 1024 -l 16 --dispatcher
fi
