#!/usr/bin/env bash
# roce-perf against Linux SoftRoCE (rxe) and the real perftest 4.5 in a QEMU
# guest (scripts/rxe-guest.sh): the six tests x both roles x 64 B, 4 KiB,
# 64 KiB at MTU 1024, then a lossy run (1 % loss both ways on the bridge).
# Each run must end with exit 0 on both sides, perftest's row (size and
# iterations) on the guest, our --out_json row on the host, and the data
# packets counted on both NICs (ours, rxe's hw_counters) at least
# iterations x ceil(size / 1024). Prints the matrix; exit 1 if a run failed.
#
# usage: scripts/interop.sh [matrix|lossy|all]   (default all)
# env:   INTEROP_MATRIX_OUT=FILE  also write the matrix there (markdown)
set -uo pipefail
cd "$(dirname "$0")/.."
G=scripts/rxe-guest.sh
B=$PWD/target/release/roce-perf
NIC_IP=10.0.0.1
NIC_MAC=02:52:53:00:00:01    # roce-perf's default on a TAP: 02:52:53:<ip>
GUEST_IP=10.0.0.2
GUEST_MAC=52:54:00:00:00:02
what=${1:-all}
[ -x "$B" ] || cargo build --release -q -p bench --bin roce-perf
W=$(mktemp -d /tmp/rsnic-interop.XXXXXX)
cleanup() { $G down >/dev/null 2>&1; rm -rf "$W"; }
trap cleanup EXIT

# Until the NIC answers and sends ARP, the guest gets a static entry for the
# NIC and roce-perf the guest's MAC (--peer_mac). Detected from the NIC's
# counters, so that the runs need neither once ARP is in.
STATIC=""
if ! "$B" write_bw --loopback --ip 10.9.0.1 -n 1 -s 64 --out_json "$W/arp.json" >/dev/null 2>&1 \
   || ! grep -q '"arp_' "$W/arp.json"; then
  STATIC=1
  echo "interop: this NIC has no ARP yet: a static neighbour entry in the guest and --peer_mac on the host"
fi
guest_pre=""; host_pre=()
if [ -n "$STATIC" ]; then
  guest_pre="/sbin/ip neigh replace $NIC_IP lladdr $NIC_MAC dev eth0;"
  host_pre=(--peer_mac "$GUEST_MAC")
fi

$G down >/dev/null 2>&1
$G net-up
$G boot rxe0 || exit 1

# Iterations per size, so that the TCG guest (about 0.25 Gbit/s unloaded)
# finishes each run in a few seconds.
iters() { # TEST SIZE
  case "$1:$2" in
    *_bw:64) echo 200 ;; *_bw:4096) echo 100 ;; *_bw:65536) echo 20 ;;
    *_lat:64) echo 100 ;; *_lat:4096) echo 50 ;; *_lat:65536) echo 10 ;;
  esac
}

counters() { # the guest's rxe counters as "sent rcvd"
  echo "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && echo \$(cat sent_pkts) \$(cat rcvd_pkts)"
}

fails=0
rows=()
run_one() { # TEST ROLE(of roce-perf) SIZE [extra roce-perf args...]
  local t=$1 role=$2 size=$3; shift 3
  local n pkts id=$t-$role-$size ok=1 why="" figure=""
  n=$(iters "$t" "$size")
  pkts=$(( n * ((size + 1023) / 1024) ))
  local gcmd="timeout 60 ib_$t -d rxe0 -x 1 -F -s $size -n $n"
  local before host_rc guest_out guest_rc after
  before=$($G run rxe0 "$(counters)" 10)
  if [ "$role" = server ]; then
    timeout 90 ip netns exec rxe-ns "$B" "$t" --dev net_tap0,iface=rsnic-tap0 --ip $NIC_IP \
      "${host_pre[@]}" -s "$size" -n "$n" --timeout 60 --out_json "$W/$id.json" "$@" >"$W/$id.host" 2>&1 &
    local hp=$!
    sleep 1.5
    $G start rxe0 "$id" "$guest_pre sleep 0.5; $gcmd 10.0.0.254"
  else
    $G start rxe0 "$id" "$guest_pre $gcmd"
    sleep 2
    timeout 90 ip netns exec rxe-ns "$B" "$t" --dev net_tap0,iface=rsnic-tap0 --ip $NIC_IP \
      "${host_pre[@]}" --exchange perftest -s "$size" -n "$n" --timeout 20 \
      --out_json "$W/$id.json" "$@" $GUEST_IP >"$W/$id.host" 2>&1 &
    local hp=$!
  fi
  wait $hp; host_rc=$?
  guest_out=$($G wait rxe0 "$id" 90); guest_rc=$?
  after=$($G run rxe0 "$(counters)" 10)
  echo "$guest_out" >"$W/$id.guest"
  [ $host_rc = 0 ] || { ok=0; why="roce-perf rc=$host_rc: $(grep -m1 'roce-perf:' "$W/$id.host")"; }
  [ $guest_rc = 0 ] || { ok=0; why="$why ib_$t rc=$guest_rc: $(grep -m1 -iE 'err|fail|couldn|unable' "$W/$id.guest")"; }
  # The figures and the checks of our side.
  if [ $ok = 1 ]; then
    local check
    check=$(python3 - "$W/$id.json" "$t" "$role" "$size" "$n" "$pkts" "$before" "$after" <<'PY'
import json, sys
path, t, role, size, n, pkts, before, after = sys.argv[1:]
size, n, pkts = int(size), int(n), int(pkts)
d = json.load(open(path))
c = d["counters"]
sent0, rcvd0 = map(int, before.split()); sent1, rcvd1 = map(int, after.split())
g_sent, g_rcvd = sent1 - sent0, rcvd1 - rcvd0
# Who receives the data: the server for WRITE/SEND, the client for READ;
# both ways for the ping-pongs.
lat_pp = t in ("write_lat", "send_lat")
we_receive = lat_pp or (t.startswith("read") == (role == "client"))
we_send = lat_pp or not we_receive
errs = []
if we_receive and c["rx_data_packets"] < pkts: errs.append(f"our rx_data_packets {c['rx_data_packets']} < {pkts}")
if we_send and c["tx_data_packets"] < pkts: errs.append(f"our tx_data_packets {c['tx_data_packets']} < {pkts}")
if we_receive and g_sent < pkts: errs.append(f"rxe sent_pkts +{g_sent} < {pkts}")
if we_send and g_rcvd < pkts: errs.append(f"rxe rcvd_pkts +{g_rcvd} < {pkts}")
res = d["results"]
fig = ""
if res:
    r = res[-1]
    if r["bytes"] != size or r["iterations"] != n:
        errs.append(f"our row {r['bytes']} B x {r['iterations']}, expected {size} x {n}")
    fig = f"{r['bw_avg_gbps']:.3f} Gb/s" if "bw_avg_gbps" in r else f"{r['t_typical']:.0f} us"
elif not (t == "read_lat" and role == "server"):
    errs.append("no result row")
print(("FAIL " + "; ".join(errs)) if errs else "OK " + fig)
PY
)
    case $check in OK*) figure=${check#OK }; figure=${figure# } ;; *) ok=0; why=$check ;; esac
    # perftest's own row: size and iterations (read_lat's server prints none).
    if ! { [ "$t" = read_lat ] && [ "$role" = client ]; } && \
       ! grep -qE "^ *$size +$n " "$W/$id.guest"; then
      ok=0; why="$why no '$size $n' row from ib_$t"
    fi
    [ -n "$figure" ] || figure=$(awk -v s="$size" '$1==s {print ($0 ~ /usec/) ? $5" us" : $4" MB/s"; exit}' "$W/$id.guest")
  fi
  if [ $ok = 1 ]; then
    printf 'interop: %-9s roce-perf %-6s %6s B x %-3s ok   %s\n' "$t" "$role" "$size" "$n" "$figure"
    rows+=("| $t | $role | $size | $n | pass | $figure |")
  else
    fails=$((fails + 1))
    printf 'interop: %-9s roce-perf %-6s %6s B x %-3s FAIL %s\n' "$t" "$role" "$size" "$n" "$why"
    rows+=("| $t | $role | $size | $n | **fail** | ${why:0:80} |")
    sed 's/^/    host: /' "$W/$id.host" | grep -v "tap\|qdisc" | tail -5
    sed 's/^/    guest: /' "$W/$id.guest" | tail -5
  fi
}

start=$(date +%s)
if [ "$what" = all ] || [ "$what" = matrix ]; then
  for t in write_bw read_bw send_bw write_lat read_lat send_lat; do
    for role in server client; do
      for size in 64 4096 65536; do
        run_one "$t" "$role" "$size"
      done
    done
  done
fi
if [ "$what" = all ] || [ "$what" = lossy ]; then
  # 1 % loss on both bridge ports, so both directions lose frames.
  for dev in rsnic-tap0 rxe-tap0; do
    ip netns exec rxe-ns tc qdisc replace dev $dev root netem loss 1%
  done
  echo "interop: lossy (netem loss 1% on rsnic-tap0 and rxe-tap0)"
  run_one write_bw client 65536
  run_one read_bw server 4096
  for dev in rsnic-tap0 rxe-tap0; do
    ip netns exec rxe-ns tc qdisc del dev $dev root 2>/dev/null
  done
fi
echo "interop: $(( $(date +%s) - start )) s, $fails failed${STATIC:+ (static ARP: the NIC has no ARP yet)}"
if [ -n "${INTEROP_MATRIX_OUT:-}" ]; then
  { echo "| test | roce-perf role | size (B) | -n | result | roce-perf figure |"
    echo "|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"; } >"$INTEROP_MATRIX_OUT"
fi
[ $fails = 0 ]
