#!/usr/bin/env bash
# roce-perf over net_af_xdp, net_af_packet and net_tap on the same veth pair
# between namespaces xd-a and xd-b, in one run (docs/benchmarks.md, issue 25):
# write_bw 64 KiB and 64 B, read_lat 2 B, each PMD in turn, repeated ROUNDS
# times (default 2), figures as ratios to net_tap. net_af_xdp twice: as rsnic
# opens it (busy_budget=0) and with the PMD's own default busy_budget=64
# (preferred busy polling), the setting before rsnic chose 0.
#
#   afxdp:  xdv-a 10.77.0.1 <-- veth --> xdv-b 10.77.0.2; NICs in host mode
#           (no --ip), rsnic's XDP program, copy mode (veth has no AF_XDP
#           zero-copy); the exchange over the same interface
#   packet: the same veth; NICs 10.77.0.11/.12 on net_af_packet
#   tap:    xdv-a/xdv-b bridged with TAPs xdt-a/xdt-b; NICs 10.77.0.11/.12
#
# Every interface keeps MTU 1500 (RoCE MTU 1024 on all three). The engines
# yield when idle (two processes on a 2-core VM).
#
# usage: scripts/afxdp-bench.sh   (root; under flock /tmp/rsnic-host.lock)
set -euo pipefail
cd "$(dirname "$0")/.."
A=xd-a
B=xd-b
BIN=target/release/roce-perf
OUT=target/afxdp/bench
ROUNDS=${ROUNDS:-2}
BW_SECS=${BW_SECS:-3}
LAT_N=${LAT_N:-2000}
mkdir -p "$OUT"

cleanup() {
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
}
trap cleanup EXIT

up() { # up direct|tap
  cleanup
  ip netns add "$A"
  ip netns add "$B"
  for ns in "$A" "$B"; do
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
    ip -n "$ns" link set lo up
  done
  ip link add xdv-a netns "$A" type veth peer name xdv-b netns "$B"
  for s in a b; do
    ns=xd-$s
    ip="10.77.0.$([ $s = a ] && echo 1 || echo 2)/24"
    if [ "$1" = tap ]; then
      ip -n "$ns" tuntap add dev "xdt-$s" mode tap multi_queue
      ip -n "$ns" link add "xdbr-$s" type bridge
      for d in "xdv-$s" "xdt-$s"; do
        ip -n "$ns" link set "$d" master "xdbr-$s"
        ip -n "$ns" link set "$d" up
      done
      ip -n "$ns" addr add "$ip" dev "xdbr-$s"
      ip -n "$ns" link set "xdbr-$s" up
    else
      ip -n "$ns" addr add "$ip" dev "xdv-$s"
      ip -n "$ns" link set "xdv-$s" up
    fi
  done
}

# one PMD TEST SIZE: runs server (xd-a) and client (xd-b); prints the figure
# (bw: Gbit/s average; lat: typical us).
one() {
  local pmd=$1 test=$2 size=$3 sdev cdev sip=() cip=() len=()
  case $pmd in
    afxdp) sdev=af_xdp:xdv-a; cdev=af_xdp:xdv-b ;;
    # The PMD's own busy polling (its default; rsnic's is busy_budget=0, dpdk::af_xdp::DEFAULT_BUSY_BUDGET)
    afxdp64) sdev=af_xdp:xdv-a,busy_budget=64; cdev=af_xdp:xdv-b,busy_budget=64 ;;
    packet) sdev=net_af_packet0,iface=xdv-a; cdev=net_af_packet0,iface=xdv-b
      sip=(--ip 10.77.0.11); cip=(--ip 10.77.0.12) ;;
    tap) sdev=net_tap0,iface=xdt-a; cdev=net_tap0,iface=xdt-b
      sip=(--ip 10.77.0.11); cip=(--ip 10.77.0.12) ;;
  esac
  if [ "$test" = read_lat ]; then len=(-n "$LAT_N"); else len=(-D "$BW_SECS"); fi
  local eal=(-- --no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=error)
  local j="$OUT/$pmd-$test-$size"
  ip netns exec "$A" "$BIN" "$test" --dev "$sdev" "${sip[@]}" -s "$size" "${len[@]}" --timeout 60 \
    --report_gbits "${eal[@]}" --file-prefix=xd-a >"$j.server.log" 2>&1 &
  local srv=$!
  sleep 1
  ip netns exec "$B" "$BIN" "$test" --dev "$cdev" "${cip[@]}" -s "$size" "${len[@]}" --timeout 60 \
    --report_gbits --out_json "$j.json" 10.77.0.1 "${eal[@]}" --file-prefix=xd-b >"$j.client.log" 2>&1 \
    || { cat "$j.client.log" "$j.server.log" >&2; echo "afxdp-bench: $pmd $test $size failed" >&2; exit 1; }
  wait "$srv" || { cat "$j.server.log" >&2; exit 1; }
  python3 - "$j.json" "$test" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(f'{r["t_typical"]:.2f}' if sys.argv[2].endswith("lat") else f'{r["bw_avg_gbps"]:.4f}')
PY
}

# PMDS and TESTS pick a subset, e.g. the busy_budget A/B of docs/benchmarks.md:
# PMDS="afxdp afxdp64" TESTS="read_lat 2" ROUNDS=8 scripts/afxdp-bench.sh
PMDS=${PMDS:-tap afxdp afxdp64 packet}
TESTS=${TESTS:-write_bw 65536;write_bw 64;read_lat 2}
declare -A FIG
for round in $(seq 1 "$ROUNDS"); do
  for pmd in $PMDS; do
    if [ $pmd = tap ]; then up tap; else up direct; fi
    while IFS= read -r t; do
      set -- $t
      f=$(one $pmd "$1" "$2")
      FIG[$pmd,$1,$2]="${FIG[$pmd,$1,$2]:-} $f"
      echo "afxdp-bench: round $round $pmd $1 -s $2: $f $([ "$1" = read_lat ] && echo us || echo Gbit/s)"
    done <<<"$(echo "$TESTS" | tr ';' '\n')"
  done
done

# Medians over rounds, ratios to net_tap, or to the first PMD without it
# (latency: base / pmd, so > 1 is better).
python3 - "$PMDS" "$TESTS" <<PY
import statistics, sys
fig = {}
$(for k in "${!FIG[@]}"; do echo "fig['$k'] = [float(x) for x in '${FIG[$k]}'.split()]"; done)
pmds = sys.argv[1].split()
rows = [t.split() for t in sys.argv[2].split(";") if t.strip()]
name = {"tap": "net_tap", "afxdp": "net_af_xdp (copy)", "afxdp64": "net_af_xdp busy_budget=64", "packet": "net_af_packet"}
short = {"tap": "tap", "afxdp": "af_xdp", "afxdp64": "af_xdp 64", "packet": "af_packet"}
base = "tap" if "tap" in pmds else pmds[0]
others = [p for p in pmds if p != base]
print("| test | " + " | ".join(name[p] for p in pmds) + " | " + " | ".join(f"{short[p]} / {short[base]}" for p in others) + " |")
print("|---" * (1 + len(pmds) + len(others)) + "|")
for t, s in rows:
    unit = "us typical" if t.endswith("lat") else "Gbit/s"
    m = {p: statistics.median(fig[f"{p},{t},{s}"]) for p in pmds}
    r = (lambda p: m[base] / m[p]) if t.endswith("lat") else (lambda p: m[p] / m[base])
    print(f"| {t} -s {s} ({unit}) | " + " | ".join(f"{m[p]:.4g}" for p in pmds) + " | " + " | ".join(f"{r(p):.2f}" for p in others) + " |")
PY
