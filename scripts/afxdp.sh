#!/usr/bin/env bash
# rsnic on a kernel interface shared with the kernel (net_af_xdp, issue 25),
# in two network namespaces on a veth pair:
#
#   namespace xd-a                                namespace xd-b
#   xdv-a 10.77.0.1/24 <----------- veth ----------> xdv-b 10.77.0.2/24     (afxdp)
#   xdv-a 10.77.0.1/24 <--- veth ---> xdv-b -- xdbr 10.77.0.2/24 -- xdt-b  (tap: TAP NIC 10.77.0.3)
#
# rsnic runs on xdv-a through net_af_xdp with its XDP program (RoCEv2 to the
# socket, all else to the kernel), in host mode: no --ip, it takes
# 10.77.0.1 and xdv-a's MAC, and resolves peers through the kernel's
# neighbour table. The peer is rsnic on AF_XDP too (afxdp) or rsnic on a TAP
# bridged with the veth (tap). During each RDMA transfer a TCP transfer and a
# ping cross the same interface; both must complete without loss. Checks:
#   - the RDMA test passes on both sides (the exchange runs over TCP on the
#     shared interface too; perftest's exchange, which carries no MAC);
#   - the AF_XDP NIC sent no ARP (tx_arp_requests = 0) and the kernel of xd-a
#     holds the peer's entry (learned by ARP, not PERMANENT);
#   - tap: tshark on xdv-b decodes the NIC's frames as RoCEv2 (BTH), sent to
#     the MAC of the kernel's entry;
#   - bad input: an interface that does not exist, an XDP object that does
#     not load, a second NIC on a busy interface: one clear error each, and
#     the kernel's ping still answers; no XDP program is left attached, also
#     not by a NIC killed with SIGINT or SIGTERM.
# Further, each described above its function below:
#   - switch: roce-switch with both ports on af_xdp between two AF_XDP hosts;
#   - verbs: Debian's perftest under rsnic-exec on af_xdp (host mode);
#   - rxe: (c) rsnic on AF_XDP against Linux rxe and perftest in the QEMU
#     guest of scripts/rxe-guest.sh, through a bridge (about 45 s of it).
# `bench` instead measures write_bw 64 KiB, write_bw 64 B and read_lat over
# net_af_xdp, net_af_packet and net_tap on the same veth pair (docs/benchmarks.md).
#
# usage: scripts/afxdp.sh [all|afxdp|tap|bad|switch|verbs|rxe|bench]   (root;
# run under `flock /tmp/rsnic-host.lock` next to other users of namespaces;
# rxe uses rxe-guest.sh's namespace rxe-ns and guest rxe0, as interop.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
A=xd-a
B=xd-b
BIN=target/release/roce-perf
OUT=target/afxdp
mkdir -p "$OUT"
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  if [ -n "${RXE_UP:-}" ]; then rxe_down; fi
  if [ -n "${SW_UP:-}" ]; then switch_down; fi
}
trap cleanup EXIT

fail() { echo "afxdp: FAIL: $*" >&2; exit 1; }

mount_bpffs() {
  # libxdp keeps its dispatcher state in bpffs; without it, it falls back to
  # one program per interface (ours is loaded by libbpf either way).
  grep -q ' /sys/fs/bpf bpf ' /proc/mounts || mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
}

# up MODE: the namespaces and the veth; MODE tap bridges xdv-b with a TAP.
up() {
  cleanup
  PIDS=()
  ip netns add "$A"
  ip netns add "$B"
  for ns in "$A" "$B"; do
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.default.disable_ipv6=1
    ip -n "$ns" link set lo up
  done
  ip link add xdv-a netns "$A" type veth peer name xdv-b netns "$B"
  ip -n "$A" addr add 10.77.0.1/24 dev xdv-a
  ip -n "$A" link set xdv-a up
  if [ "$1" = tap ]; then
    ip -n "$B" tuntap add dev xdt-b mode tap multi_queue
    ip -n "$B" link add xdbr type bridge
    for d in xdv-b xdt-b; do
      ip -n "$B" link set "$d" master xdbr
      ip -n "$B" link set "$d" up
    done
    ip -n "$B" addr add 10.77.0.2/24 dev xdbr
    ip -n "$B" link set xdbr up
  else
    ip -n "$B" addr add 10.77.0.2/24 dev xdv-b
    ip -n "$B" link set xdv-b up
  fi
  # The kernels' first ARP is part of the test: start with empty tables.
  ip -n "$A" neigh flush dev xdv-a
}

# tcp_transfer [SRV_NS CLI_NS ADDR]: a TCP transfer of 4 MiB from CLI_NS to
# ADDR:18600 in SRV_NS (default B to A, 10.77.0.1), checked byte for byte
# (python3), spread over about 2 s so that it overlaps the RDMA transfer.
tcp_transfer() {
  local sns=${1:-$A} cns=${2:-$B} addr=${3:-10.77.0.1}
  rm -f "$OUT/tcp.rx" "$OUT/tcp.tx"
  ip netns exec "$sns" python3 - "$addr" <<'PY' &
import hashlib, socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 18600)); s.listen(1); s.settimeout(20)
c, _ = s.accept(); c.settimeout(20); h = hashlib.sha256(); n = 0
while True:
    b = c.recv(65536)
    if not b: break
    h.update(b); n += len(b)
open("target/afxdp/tcp.rx", "w").write(f"{n} {h.hexdigest()}\n")
PY
  local srv=$!
  sleep 0.3
  ip netns exec "$cns" python3 - "$addr" <<'PY'
import hashlib, socket, sys, time
data = bytes(range(256)) * 16384
for _ in range(50):
    try:
        s = socket.create_connection((sys.argv[1], 18600), timeout=5); break
    except OSError: time.sleep(0.1)
for i in range(0, len(data), 65536):
    s.sendall(data[i:i + 65536]); time.sleep(0.03)
s.close()
open("target/afxdp/tcp.tx", "w").write(f"{len(data)} {hashlib.sha256(data).hexdigest()}\n")
PY
  wait "$srv"
  cmp -s "$OUT/tcp.rx" "$OUT/tcp.tx" || fail "TCP transfer over the shared interface: sent $(cat "$OUT/tcp.tx"), received $(cat "$OUT/tcp.rx" 2>/dev/null)"
  echo "afxdp: TCP transfer during RDMA: $(cut -d' ' -f1 "$OUT/tcp.rx") bytes, sha256 equal"
}

# ping_check [FROM_NS ADDR]: 30 pings (default from B to 10.77.0.1) during
# the transfer, every echo answered.
ping_check() {
  local from=${1:-$B} addr=${2:-10.77.0.1} out
  out=$(ip netns exec "$from" ping -c 30 -i 0.05 -W 1 "$addr") || fail "ping over the shared interface: $out"
  echo "$out" | grep -q ' 0% packet loss' || fail "ping lost echoes: $(echo "$out" | tail -2)"
  echo "afxdp: ping during RDMA: $(echo "$out" | grep -o '[0-9]* received') of 30, 0% loss"
}

counter() { # counter FILE NAME
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['counters'].get(sys.argv[2], 0))" "$1" "$2"
}

no_xdp_left() {
  if ip -n "$A" link show xdv-a | grep -q ' xdp'; then fail "an XDP program is left on xdv-a"; fi
}

# run_pair KIND: the RDMA transfer with TCP and ping alongside.
run_pair() {
  local kind=$1 cdev cip=()
  local srv_json="$OUT/$kind-server.json" cli_json="$OUT/$kind-client.json"
  up "$kind"
  if [ "$kind" = tap ]; then
    cdev=net_tap0,iface=xdt-b
    cip=(--ip 10.77.0.3)
    ip netns exec "$B" tshark -q -i xdv-b -f "udp port 4791" -w "$OUT/tap.pcapng" 2>/dev/null &
    PIDS+=($!)
    sleep 1
  else
    cdev=af_xdp:xdv-b
  fi
  # The AF_XDP NIC is the server, in host mode (no --ip).
  ip netns exec "$A" "$BIN" write_bw --dev af_xdp:xdv-a -D 3 -s 65536 --timeout 30 \
    --out_json "$srv_json" -- --no-huge -m 512 --no-pci --no-shconf --no-telemetry \
    --log-level=error --file-prefix=xd-a >"$OUT/$kind-server.log" 2>&1 &
  local srv=$!
  PIDS+=("$srv")
  sleep 1.5
  ip netns exec "$B" "$BIN" write_bw --dev "$cdev" "${cip[@]}" -D 3 -s 65536 --timeout 30 \
    --exchange perftest --out_json "$cli_json" 10.77.0.1 -- --no-huge -m 512 --no-pci --no-shconf \
    --no-telemetry --log-level=error --file-prefix=xd-b >"$OUT/$kind-client.log" 2>&1 &
  local cli=$!
  PIDS+=("$cli")
  sleep 1.5
  ping_check &
  local pinger=$!
  tcp_transfer
  wait "$pinger" || fail "ping (above)"
  wait "$cli" || { cat "$OUT/$kind-client.log"; fail "$kind: the client failed"; }
  wait "$srv" || { cat "$OUT/$kind-server.log"; fail "$kind: the AF_XDP server failed"; }
  grep -E '^ *65536 ' "$OUT/$kind-client.log" | tail -1 | sed "s/^/afxdp: $kind write_bw client: /"
  # Host mode: no ARP from the NIC; the kernel's entry is the peer's.
  local arp
  arp=$(counter "$srv_json" tx_arp_requests)
  [ "$arp" = 0 ] || fail "$kind: the AF_XDP NIC sent $arp ARP requests in host mode"
  local peer=10.77.0.2
  [ "$kind" = tap ] && peer=10.77.0.3
  local entry
  entry=$(ip -n "$A" neigh show "$peer" dev xdv-a)
  echo "afxdp: kernel entry in $A: $entry; NIC tx_arp_requests=$arp"
  echo "$entry" | grep -qE 'lladdr ([0-9a-f]{2}:){5}[0-9a-f]{2}' || fail "no kernel neighbour entry for $peer"
  echo "$entry" | grep -q PERMANENT && fail "the entry for $peer is static"
  local mac
  mac=$(echo "$entry" | grep -oE '([0-9a-f]{2}:){5}[0-9a-f]{2}')
  if [ "$kind" = tap ]; then
    sleep 1
    kill "${PIDS[0]}" 2>/dev/null || true
    wait "${PIDS[0]}" 2>/dev/null || true
    local amac n bad
    amac=$(ip -n "$A" -br link show xdv-a | awk '{print $3}')
    n=$(tshark -r "$OUT/tap.pcapng" -Y "infiniband.bth.opcode && eth.src == $amac && eth.dst == $mac" 2>/dev/null | wc -l)
    bad=$(tshark -r "$OUT/tap.pcapng" -Y "udp.dstport == 4791 && (!infiniband.bth.opcode || _ws.malformed)" 2>/dev/null | wc -l)
    echo "afxdp: tshark on xdv-b: $n RoCEv2 frames from the AF_XDP NIC ($amac) to the kernel entry's MAC $mac, $bad undecoded"
    [ "$n" -gt 100 ] || fail "tshark saw $n RoCEv2 frames from the AF_XDP NIC"
    [ "$bad" = 0 ] || fail "tshark could not decode $bad UDP 4791 frames"
  else
    # Both ends AF_XDP: the client resolved through its kernel too.
    local carp
    carp=$(counter "$cli_json" tx_arp_requests)
    [ "$carp" = 0 ] || fail "the AF_XDP client sent $carp ARP requests"
    ip -n "$B" neigh show 10.77.0.1 dev xdv-b | grep -q lladdr || fail "no kernel entry for 10.77.0.1 in $B"
  fi
  no_xdp_left
  cleanup
  echo "afxdp: $kind: pass"
}

# (c) rsnic on AF_XDP against Linux rxe with the real perftest in the QEMU
# guest of scripts/rxe-guest.sh (its namespace rxe-ns, bridge rxe-br0
# 10.0.0.254 and guest rxe0 10.0.0.2 on TAP rxe-tap0), joined by a veth
# whose other end is in the bridge:
#
#   namespace xd-r                         namespace rxe-ns
#   xdv-r 10.0.0.1/24 <--- veth ---> xdv-g -- rxe-br0 -- rxe-tap0 -- guest rxe0 10.0.0.2
#
# roce-perf on af_xdp:xdv-r in host mode (it takes 10.0.0.1) against
# perftest 4.5 on rxe, both roles: RXE_RUNS, default "write_bw server 65536
# 100" (the guest's ib_write_bw connects) and "read_lat client 64 20000"
# (roce-perf connects to the guest's ib_read_lat). Each run: both ends exit
# 0 and print their row, our data packets counted, ping and a TCP transfer
# from rxe-ns to 10.0.0.1 over the same veth while the RDMA test runs (the
# capture must show RDMA data frames between their start and end); then
# the kernel's entry for 10.0.0.2 in xd-r is the guest's MAC, learned by
# ARP, the NIC sent no ARP, tshark on xdv-g decodes every UDP 4791 frame as
# RoCEv2 and the NIC's frames go to that entry's MAC; the guest learned
# 10.0.0.1 as xdv-r's MAC (the kernel answered its ARP).
G=scripts/rxe-guest.sh
R=xd-r
GUEST_MAC=52:54:00:00:00:02
rxe_down() {
  ip netns del "$R" 2>/dev/null || true
  $G down >/dev/null 2>&1 || true
}

rxe_guest() {
  local t0=$SECONDS
  RXE_UP=1
  $G down >/dev/null 2>&1 || true
  $G build >/dev/null || fail "rxe: the guest image did not build"
  $G net-up
  ip netns del "$R" 2>/dev/null || true
  ip netns add "$R"
  ip netns exec "$R" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  ip -n "$R" link set lo up
  ip link add xdv-r netns "$R" type veth peer name xdv-g netns rxe-ns
  ip -n rxe-ns link set xdv-g master rxe-br0
  ip -n rxe-ns link set xdv-g up
  ip -n "$R" addr add 10.0.0.1/24 dev xdv-r
  ip -n "$R" link set xdv-r up
  $G boot rxe0 || fail "rxe: the guest did not boot"
  echo "afxdp: rxe: guest up in $((SECONDS - t0)) s"
  ip netns exec rxe-ns tshark -q -i xdv-g -f "udp port 4791" -w "$OUT/rxe.pcapng" 2>/dev/null &
  local shark=$!
  PIDS+=("$shark")
  sleep 1
  RXE_WINDOWS=()
  while read -r t role size n; do
    [ -n "$t" ] || continue
    rxe_one "$t" "$role" "$size" "$n"
  done <<<"$(echo "${RXE_RUNS:-write_bw server 65536 100;read_lat client 64 20000}" | tr ';' '\n')"
  sleep 0.5
  kill "$shark" 2>/dev/null || true
  wait "$shark" 2>/dev/null || true
  rxe_overlap "$OUT/rxe.pcapng"
  # What the NIC used is the kernel's entry: the guest's MAC, learned by ARP.
  local entry amac n bad gentry
  entry=$(ip -n "$R" neigh show 10.0.0.2 dev xdv-r)
  echo "afxdp: rxe: kernel entry in $R: $entry"
  echo "$entry" | grep -q "lladdr $GUEST_MAC" || fail "rxe: the kernel's entry for 10.0.0.2 is not the guest's MAC $GUEST_MAC"
  echo "$entry" | grep -q PERMANENT && fail "rxe: the entry for 10.0.0.2 is static"
  amac=$(ip -n "$R" -br link show xdv-r | awk '{print $3}')
  n=$(tshark -r "$OUT/rxe.pcapng" -Y "infiniband.bth.opcode && eth.src == $amac && eth.dst == $GUEST_MAC" 2>/dev/null | wc -l)
  local other
  other=$(tshark -r "$OUT/rxe.pcapng" -Y "eth.src == $amac && eth.dst != $GUEST_MAC" 2>/dev/null | wc -l)
  bad=$(tshark -r "$OUT/rxe.pcapng" -Y "udp.dstport == 4791 && (!infiniband.bth.opcode || _ws.malformed)" 2>/dev/null | wc -l)
  echo "afxdp: rxe: tshark on xdv-g: $n RoCEv2 frames from the AF_XDP NIC ($amac) to the kernel entry's MAC $GUEST_MAC, $other to any other MAC, $bad undecoded"
  [ "$n" -gt 100 ] || fail "rxe: tshark saw $n RoCEv2 frames from the AF_XDP NIC to the guest"
  [ "$other" = 0 ] || fail "rxe: the NIC sent $other RoCEv2 frames to a MAC other than the kernel's entry"
  [ "$bad" = 0 ] || fail "rxe: tshark could not decode $bad UDP 4791 frames"
  gentry=$($G run rxe0 '/sbin/ip neigh show 10.0.0.1' 10) || true
  echo "afxdp: rxe: the guest's entry for 10.0.0.1: $gentry"
  echo "$gentry" | grep -q "lladdr $amac" || fail "rxe: the guest did not learn 10.0.0.1 as $amac (the kernel of $R answers ARP for it)"
  if ip -n "$R" link show xdv-r | grep -q ' xdp'; then fail "rxe: an XDP program is left on xdv-r"; fi
  rxe_down
  RXE_UP=""
  echo "afxdp: rxe: pass ($((SECONDS - t0)) s)"
}

# rxe_start ID SCRIPT: the guest's side; a START the agent did not confirm
# is sent once more (as interop.sh does), then the run fails on its own.
rxe_start() {
  $G start rxe0 "$1" "$2" && return 0
  echo "afxdp: rxe: the guest agent did not confirm starting $1; sending it again"
  sleep 1
  $G start rxe0 "$1" "$2" || fail "rxe: the guest did not start $1"
}

# rxe_one TEST ROLE(of roce-perf) SIZE ITERS
rxe_one() {
  local t=$1 role=$2 size=$3 n=$4 id="xd-$1-$2" t1=$SECONDS
  local j="$OUT/rxe-$t-$role.json" log="$OUT/rxe-$t-$role.log" peer="" xchg=()
  if [ "$role" = server ]; then peer=10.0.0.1; else xchg=(--exchange perftest 10.0.0.2); fi
  # -u 18 on both sides (1.07 s): the TCG guest may stall on a loaded host.
  local gs="timeout 120 ib_$t -d rxe0 -x 1 -F -u 18 -s $size -n $n $peer"
  local perf=(ip netns exec "$R" timeout 150 "$BIN" "$t" --dev af_xdp:xdv-r -u 18 -s "$size" -n "$n"
              --timeout 60 --out_json "$j" "${xchg[@]}" -- --no-huge -m 512 --no-pci --no-shconf
              --no-telemetry --log-level=error --file-prefix=xd-r)
  rm -f "$j"
  if [ "$role" = server ]; then
    "${perf[@]}" >"$log" 2>&1 &
  else
    rxe_start "$id" "$gs"
    "${perf[@]}" >"$log" 2>&1 &
  fi
  local hp=$!
  PIDS+=("$hp")
  if [ "$role" = server ]; then
    for _ in $(seq 100); do ip netns exec "$R" ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
    rxe_start "$id" "$gs"
  fi
  # Ping and TCP once the QPs are connected (roce-perf printed the peer's
  # QP), while the transfer runs.
  local k=0
  until grep -q 'remote address' "$log" 2>/dev/null; do
    kill -0 "$hp" 2>/dev/null || break
    sleep 0.1; k=$((k + 1)); [ $k -lt 600 ] || break
  done
  kill -0 "$hp" 2>/dev/null || { cat "$log"; $G wait rxe0 "$id" 5; fail "rxe: roce-perf $t ended before ping and TCP started"; }
  local ts te
  ts=$(date +%s.%N)
  ping_check rxe-ns 10.0.0.1 &
  local pinger=$!
  tcp_transfer "$R" rxe-ns 10.0.0.1
  wait "$pinger" || fail "rxe: ping (above)"
  te=$(date +%s.%N)
  # Checked against the capture once it is closed (rxe_guest): RoCEv2 data
  # frames between the NIC and the guest while ping and TCP ran.
  RXE_WINDOWS+=("$t $ts $te")
  local during=no
  kill -0 "$hp" 2>/dev/null && during=yes
  wait "$hp" || { cat "$log"; $G wait rxe0 "$id" 30; fail "rxe: roce-perf $t ($role) failed"; }
  local gout
  gout=$($G wait rxe0 "$id" 120) || { echo "$gout"; fail "rxe: ib_$t in the guest failed"; }
  # perftest's row (read_lat's server prints none) and ours.
  if [ "$t" != read_lat ] || [ "$role" = server ]; then
    echo "$gout" | grep -qE "^ *$size +$n " || { echo "$gout"; fail "rxe: no '$size $n' row from ib_$t"; }
  fi
  python3 - "$j" "$t" "$role" "$size" "$n" <<'PY' || fail "rxe: roce-perf's counters (above)"
import json, sys
path, t, role, size, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
d = json.load(open(path)); c = d["counters"]
pkts = n * ((size + 1023) // 1024)
# Data travels to the server for WRITE, to the client for READ.
we_receive = t.startswith("read") == (role == "client")
key = "rx_data_packets" if we_receive else "tx_data_packets"
errs = []
if c[key] < pkts: errs.append(f"{key} {c[key]} < {pkts}")
if c.get("tx_arp_requests", 0) != 0: errs.append(f"tx_arp_requests {c['tx_arp_requests']} (host mode sends none)")
if d["exchange"] != "perftest": errs.append("not perftest's exchange")
r = d["results"][-1] if d["results"] else None
if r is None and not (t == "read_lat" and role == "server"): errs.append("no result row")
fig = "" if r is None else (f"{r['bw_avg_gbps']*1000:.1f} Mbit/s" if "bw_avg_gbps" in r else f"{r['t_typical']:.0f} us typical")
if errs: print("afxdp: rxe:", "; ".join(errs)); sys.exit(1)
print(f"afxdp: rxe: roce-perf {t} ({role}, af_xdp) <-> ib_{t} on rxe: {size} B x {n} ok, {fig}, {key} {c[key]}, tx_arp_requests 0")
PY
  echo "afxdp: rxe: $t: transfer still running when ping and TCP were done: $during ($((SECONDS - t1)) s)"
}

# rxe_overlap PCAP: for each run of RXE_WINDOWS ("TEST START END", epoch
# seconds), the RoCEv2 data frames (RDMA WRITE, READ request or response)
# the capture on xdv-g saw while that run's ping and TCP transfer ran;
# fails unless there were some, and says how many and over how much of the
# window.
rxe_overlap() {
  local pcap=$1 w t ts te got n span window
  for w in "${RXE_WINDOWS[@]}"; do
    read -r t ts te <<<"$w"
    got=$(tshark -r "$pcap" -T fields -e frame.time_epoch \
            -Y "(infiniband.bth.opcode >= 6 && infiniband.bth.opcode <= 16) && frame.time_epoch >= $ts && frame.time_epoch <= $te" \
            2>/dev/null | awk -v s="$ts" -v e="$te" 'NR == 1 {f = $1} {l = $1; n++} END {if (n) printf "%d %.1f %.1f", n, l - f, e - s; else printf "0 0 %.1f", e - s}')
    read -r n span window <<<"$got"
    echo "afxdp: rxe: $t: $n RoCEv2 data frames on xdv-g while ping and TCP ran (over $span s of their $window s)"
    [ "$n" -gt 0 ] || fail "rxe: $t: no RDMA data moved while ping and TCP ran"
  done
}

# roce-switch with both ports on af_xdp, routing RoCEv2 between two hosts
# while the kernel of its namespace routes everything else on the same
# interfaces (ip_forward):
#
#   xd-h1: xdh-1 10.78.1.1/24 <-veth-> xds-1 10.78.1.254 [xd-sw] 10.78.2.254 xds-2 <-veth-> xdh-2 10.78.2.1/24 :xd-h2
#          (default via .254)            roce-switch --port af_xdp:xds-1 --port af_xdp:xds-2   (default via .254)
#
# The hosts run roce-perf on af_xdp in host mode: the peer is behind their
# gateway, so each NIC resolves the gateway through its kernel (route, then
# neighbour) and sends RoCEv2 to xds-N's MAC; the switch's XDP program hands
# it to roce-switch, which routes it by its table (next hops: the hosts'
# MACs). The perftest exchange (TCP) and ping go through the same
# interfaces to the switch namespace's kernel, which forwards them. Checks:
# write_bw completes; the switch forwarded at least the data packets the
# client sent (port 1 rx, port 0 tx) with no unroutable or malformed frame;
# the hosts' kernels hold the gateway's entry; ping and TCP across the
# switch's interfaces during the transfer; no XDP program left.
SW_CFG='switch_id = 1
int_dscp = 0x18
seed = 7
fcs_in_frame = false
[defaults]
speed = "10Gbps"
buf_max = "1MiB"
k_min = "100KiB"
k_max = "400KiB"
p_max = 0.01
k_drop = "1MiB"
ctrl_buf_max = "64KiB"
burst = "16KiB"
[[port]]
id = 0
mac = "02:78:01:00:00:fe"
[[port]]
id = 1
mac = "02:78:02:00:00:fe"
[[route]]
prefix = "10.78.1.0/24"
port = 0
next_hop_mac = "02:78:01:00:00:01"
[[route]]
prefix = "10.78.2.0/24"
port = 1
next_hop_mac = "02:78:02:00:00:01"'
SW_NS="xd-h1 xd-h2 xd-sw"
switch_down() { for n in $SW_NS; do ip netns del "$n" 2>/dev/null || true; done; }

switch_afxdp() {
  local t0=$SECONDS sw=target/release/roce-switch eal=(--no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=error)
  [ -x "$sw" ] || cargo build --release -q -p switch --bin roce-switch
  SW_UP=1
  switch_down
  for n in $SW_NS; do
    ip netns add "$n"
    ip -n "$n" link set lo up
    ip netns exec "$n" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  done
  # Fixed MACs: the switch's port MACs and next hops (its TOML) are these.
  ip link add xdh-1 netns xd-h1 address 02:78:01:00:00:01 type veth peer name xds-1 netns xd-sw address 02:78:01:00:00:fe
  ip link add xdh-2 netns xd-h2 address 02:78:02:00:00:01 type veth peer name xds-2 netns xd-sw address 02:78:02:00:00:fe
  for i in 1 2; do
    ip -n "xd-h$i" addr add "10.78.$i.1/24" dev "xdh-$i"
    ip -n "xd-h$i" link set "xdh-$i" up
    ip -n "xd-h$i" route add default via "10.78.$i.254"
    ip -n xd-sw addr add "10.78.$i.254/24" dev "xds-$i"
    ip -n xd-sw link set "xds-$i" up
  done
  ip netns exec xd-sw sysctl -qw net.ipv4.ip_forward=1
  echo "$SW_CFG" >"$OUT/switch.toml"
  ip netns exec xd-sw "$sw" --config "$OUT/switch.toml" --port af_xdp:xds-1 --port af_xdp:xds-2 \
    --stats-interval 0 --duration 60 -- "${eal[@]}" --file-prefix=xd-sw >"$OUT/switch.out" 2>&1 &
  local swp=$!
  PIDS+=("$swp")
  local k=0
  until grep -q 'Ctrl-C to stop' "$OUT/switch.out" 2>/dev/null; do
    kill -0 "$swp" 2>/dev/null || { cat "$OUT/switch.out"; fail "switch: roce-switch did not start on af_xdp ports"; }
    sleep 0.1; k=$((k + 1)); [ $k -lt 200 ] || fail "switch: roce-switch did not start in 20 s"
  done
  ip netns exec xd-h1 "$BIN" write_bw --dev af_xdp:xdh-1 -D 3 -s 65536 --timeout 30 \
    --out_json "$OUT/switch-server.json" -- "${eal[@]}" --file-prefix=xd-h1 >"$OUT/switch-server.log" 2>&1 &
  local srv=$!
  PIDS+=("$srv")
  for _ in $(seq 100); do ip netns exec xd-h1 ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
  ip netns exec xd-h2 "$BIN" write_bw --dev af_xdp:xdh-2 -D 3 -s 65536 --timeout 30 --exchange perftest \
    --out_json "$OUT/switch-client.json" 10.78.1.1 -- "${eal[@]}" --file-prefix=xd-h2 >"$OUT/switch-client.log" 2>&1 &
  local cli=$!
  PIDS+=("$cli")
  sleep 1.5
  kill -0 "$cli" 2>/dev/null || { cat "$OUT/switch-client.log"; fail "switch: the client ended before ping and TCP started"; }
  ping_check xd-h2 10.78.1.1 &
  local pinger=$!
  tcp_transfer xd-h1 xd-h2 10.78.1.1
  wait "$pinger" || fail "switch: ping (above)"
  wait "$cli" || { cat "$OUT/switch-client.log"; fail "switch: the client failed"; }
  wait "$srv" || { cat "$OUT/switch-server.log"; fail "switch: the server failed"; }
  kill -INT "$swp"
  wait "$swp" || { cat "$OUT/switch.out"; fail "switch: roce-switch exited with an error"; }
  grep -E '^ *65536 ' "$OUT/switch-client.log" | tail -1 | sed 's/^/afxdp: switch: write_bw client (af_xdp -> roce-switch on af_xdp -> af_xdp): /'
  python3 - "$OUT/switch-client.json" "$OUT/switch.out" <<'PY' || fail "switch: counters (above)"
import json, re, sys
c = json.load(open(sys.argv[1]))["counters"]
out = open(sys.argv[2]).read()
port = {int(m.group(1)): dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2)))
        for m in re.finditer(r"^  port (\d+): (rx_packets=.*)$", out, re.M)}
errs = []
data = c["tx_data_packets"]
if data < 1000: errs.append(f"the client sent only {data} data packets")
# Frames the switch's socket had no room for are lost before it counts
# them (go-back-N resends them; the client's count includes the resends).
if port[1]["rx_packets"] < 0.9 * data: errs.append(f"switch port 1 received {port[1]['rx_packets']} < 90 % of the {data} data packets sent")
# What port 1 received leaves on port 0 unless port 0's queue dropped it.
if port[0]["tx_packets"] + port[0]["drops"] < port[1]["rx_packets"]:
    errs.append(f"switch port 0 sent {port[0]['tx_packets']} + dropped {port[0]['drops']} of the {port[1]['rx_packets']} received on port 1")
if port[0]["rx_packets"] == 0: errs.append("no ACK came back through the switch")
for p in (0, 1):
    for k in ("rx_unroutable", "rx_malformed", "rx_not_ipv4"):
        if port[p][k]: errs.append(f"port {p} {k}={port[p][k]}")
for side in ("tx_arp_requests",):
    if c.get(side, 0): errs.append(f"the client sent {c[side]} ARP requests in host mode")
if errs: print("afxdp: switch:", "; ".join(errs)); sys.exit(1)
print(f"afxdp: switch: client sent {data} data packets ({c['retransmits']} resent); roce-switch port 1 rx {port[1]['rx_packets']}, "
      f"port 0 tx {port[0]['tx_packets']} (tail drops {port[0]['drops']}), ACKs back {port[0]['rx_packets']}; "
      f"no unroutable, malformed or non-IPv4 frame")
PY
  for i in 1 2; do
    local e
    e=$(ip -n "xd-h$i" neigh show "10.78.$i.254" dev "xdh-$i")
    echo "$e" | grep -q "lladdr 02:78:0$i:00:00:fe" || fail "switch: xd-h$i's kernel has no entry for its gateway: $e"
    if ip -n xd-sw link show "xds-$i" | grep -q ' xdp'; then fail "switch: an XDP program is left on xds-$i"; fi
  done
  echo "afxdp: switch: the hosts' kernels resolved their gateways (xds-1/xds-2's MACs); ping and TCP were forwarded by the switch namespace's kernel"
  switch_down
  SW_UP=""
  echo "afxdp: switch: pass ($((SECONDS - t0)) s)"
}

# Debian's unmodified perftest on rsnic through librsnic_verbs.so
# (rsnic-exec) on af_xdp in host mode (no --ip: the library takes the
# interface's address), both ends on the veth of `up afxdp`, perftest's TCP
# exchange over the same interface: ib_write_bw and ib_read_lat; ibv_devinfo
# shows the interface's address as GID 0 and leaves no XDP program behind.
verbs_afxdp() {
  local t0=$SECONDS ex=$PWD/target/release/rsnic-exec
  [ -x "$ex" ] && [ -f target/release/librsnic_verbs.so ] || cargo build --release -q -p verbs-abi -p rsnic-exec
  up afxdp
  local eal="--no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=error"
  local out objs
  objs=$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'rsnic-xdp-*.o' | wc -l)
  out=$(ip netns exec "$A" timeout 60 "$ex" --dev af_xdp:xdv-a --eal="$eal" -- ibv_devinfo -v 2>&1) || { echo "$out"; fail "verbs: ibv_devinfo failed"; }
  echo "$out" | grep -qE 'GID\[ *0\]:.*(::ffff:10\.77\.0\.1|0000:0000:0000:0000:0000:ffff:0a4d:0001)' \
    || { echo "$out"; fail "verbs: GID 0 is not the interface's 10.77.0.1"; }
  echo "afxdp: verbs: ibv_devinfo on af_xdp:xdv-a (no --ip): $(echo "$out" | grep -E 'GID\[ *0\]' | tr -s ' \t' ' ')"
  # The library's device lives until the program exits, without closing its
  # port: the program is detached at exit (dpdk::xdp_link), else the next
  # NIC on xdv-a would be refused; and its object's file was removed once
  # loaded.
  no_xdp_left
  [ "$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'rsnic-xdp-*.o' | wc -l)" = "$objs" ] || fail "verbs: ibv_devinfo left an XDP object file in ${TMPDIR:-/tmp}"
  local spec t args
  for spec in "ib_write_bw -s 65536 -n 500" "ib_read_lat -s 2 -n 500"; do
    t=${spec%% *}
    args=(${spec#* })
    ip netns exec "$A" timeout 60 "$ex" --dev af_xdp:xdv-a --eal="$eal --file-prefix=xd-va" -- \
      "$t" -d rsnic0 -x 0 -F "${args[@]}" >"$OUT/verbs-$t.server" 2>&1 &
    local sp=$!
    PIDS+=("$sp")
    for _ in $(seq 100); do ip netns exec "$A" ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
    ip netns exec "$B" timeout 60 "$ex" --dev af_xdp:xdv-b --eal="$eal --file-prefix=xd-vb" -- \
      "$t" -d rsnic0 -x 0 -F "${args[@]}" 10.77.0.1 >"$OUT/verbs-$t.client" 2>&1 \
      || { cat "$OUT/verbs-$t.client" "$OUT/verbs-$t.server"; fail "verbs: $t client failed"; }
    wait "$sp" || { cat "$OUT/verbs-$t.server"; fail "verbs: $t server failed"; }
    local row
    row=$(grep -E "^ *${args[1]} +${args[3]} " "$OUT/verbs-$t.client" | tail -1 | tr -s ' ')
    [ -n "$row" ] || { cat "$OUT/verbs-$t.client"; fail "verbs: no row from $t"; }
    echo "afxdp: verbs: $t on rsnic (af_xdp, host mode) both ends: $row"
  done
  ip -n "$A" neigh show 10.77.0.2 dev xdv-a | grep -q lladdr || fail "verbs: no kernel entry for 10.77.0.2"
  no_xdp_left
  # fork() after opening the device (issue 44): the child's verbs fail with
  # EIO and its exit() leaves the parent's XDP program attached (checked by
  # the parent once the child is gone); the program is detached when the
  # parent exits. verbs_stress.c, small: its fork part is what counts here.
  local vs=$OUT/verbs_stress
  gcc -O2 -Wall -o "$vs" verbs-abi/tests/c/verbs_stress.c -libverbs -lpthread
  ip netns exec "$A" env VERBS_STRESS_AFTER_FORK="ip link show dev xdv-a | grep -q ' xdp'" \
    timeout 120 "$ex" --dev af_xdp:xdv-a --eal="$eal --file-prefix=xd-vf" -- "$vs" 2000 20 >"$OUT/verbs-fork.log" 2>&1 \
    || { cat "$OUT/verbs-fork.log"; fail "verbs: fork on af_xdp (verbs_stress.c)"; }
  grep -q '^ok .*`ip link show dev xdv-a' "$OUT/verbs-fork.log" || { cat "$OUT/verbs-fork.log"; fail "verbs: fork: no XDP check ran"; }
  echo "afxdp: verbs: fork after ibv_open_device on af_xdp: the child's verbs fail, the XDP program stays attached until the parent exits"
  no_xdp_left
  cleanup
  echo "afxdp: verbs: pass ($((SECONDS - t0)) s)"
}

# Bad input: a clear error each, the kernel's traffic undisturbed.
bad_input() {
  up afxdp
  local eal=(-- --no-huge -m 256 --no-pci --no-shconf --no-telemetry --log-level=error)
  local out
  out=$(ip netns exec "$A" timeout 20 "$BIN" write_bw --dev af_xdp:xd-nope --timeout 2 "${eal[@]}" --file-prefix=xd-e1 2>&1) \
    && fail "a missing interface was accepted"
  echo "$out" | grep -qE 'no (such )?network interface' || fail "missing interface: $out"
  echo "afxdp: bad: missing interface: $(echo "$out" | grep -E 'no (such )?network' | head -1)"
  head -c 4096 /dev/urandom >"$OUT/garbage.o"
  out=$(ip netns exec "$A" timeout 20 "$BIN" write_bw --dev "net_af_xdp0,iface=xdv-a,xdp_prog=$PWD/$OUT/garbage.o" \
    --timeout 2 "${eal[@]}" --file-prefix=xd-e2 2>&1) && fail "a garbage XDP object was accepted"
  echo "$out" | grep -q 'roce-perf: net_af_xdp on "xdv-a"' || fail "bad XDP object: $out"
  echo "afxdp: bad: XDP object that does not load: $(echo "$out" | grep 'roce-perf:' | cut -c1-160)"
  ip netns exec "$B" ping -c 3 -i 0.1 -W 1 10.77.0.1 >/dev/null || fail "ping after the bad XDP object"
  no_xdp_left
  # Busy: a second NIC on the interface while the first runs.
  ip netns exec "$A" "$BIN" write_bw --dev af_xdp:xdv-a --timeout 8 "${eal[@]}" --file-prefix=xd-e3 \
    >"$OUT/busy-first.log" 2>&1 &
  local first=$!
  PIDS+=("$first")
  sleep 2
  out=$(ip netns exec "$A" timeout 20 "$BIN" write_bw --dev af_xdp:xdv-a --timeout 2 "${eal[@]}" --file-prefix=xd-e4 2>&1) \
    && fail "a second NIC on a busy interface was accepted"
  echo "$out" | grep -q 'another XDP program is already attached' || fail "busy interface: $out"
  echo "afxdp: bad: busy interface: $(echo "$out" | grep 'roce-perf:' | cut -c1-160)"
  kill -0 "$first" 2>/dev/null || { cat "$OUT/busy-first.log"; fail "the first NIC died"; }
  ip netns exec "$B" ping -c 3 -i 0.1 -W 1 10.77.0.1 >/dev/null || fail "ping while the first NIC runs"
  # It gives up waiting for a client after --timeout and closes its port.
  wait "$first" 2>/dev/null && fail "the first NIC had no client and still succeeded"
  grep -q 'no client connected' "$OUT/busy-first.log" || { cat "$OUT/busy-first.log"; fail "the first NIC failed otherwise"; }
  no_xdp_left
  ip netns exec "$B" ping -c 3 -i 0.1 -W 1 10.77.0.1 >/dev/null || fail "ping after the NIC exited"
  # Ctrl-C or kill: roce-perf detaches its program before it dies of the
  # signal (dpdk::xdp_link::detach_on_signals), so the next NIC starts.
  local sig victim
  for sig in INT TERM; do
    ip netns exec "$A" "$BIN" write_bw --dev af_xdp:xdv-a --timeout 30 "${eal[@]}" --file-prefix=xd-e5 \
      >"$OUT/killed.log" 2>&1 &
    victim=$!
    PIDS+=("$victim")
    for _ in $(seq 100); do ip netns exec "$A" ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
    ip -n "$A" link show xdv-a | grep -q ' xdp' || { cat "$OUT/killed.log"; fail "no XDP program on xdv-a while the NIC runs"; }
    kill -"$sig" "$victim"
    wait "$victim" 2>/dev/null && fail "the NIC exited 0 after SIG$sig"
    no_xdp_left
    echo "afxdp: bad: SIG$sig: the NIC detached its XDP program before it died"
  done
  cleanup
  echo "afxdp: bad input: pass"
}

[ -x "$BIN" ] || cargo build --release -p bench --bin roce-perf
mount_bpffs
case "${1:-all}" in
  afxdp) run_pair afxdp ;;
  tap) run_pair tap ;;
  bad) bad_input ;;
  rxe) rxe_guest ;;
  switch) switch_afxdp ;;
  verbs) verbs_afxdp ;;
  all) run_pair afxdp; run_pair tap; bad_input; switch_afxdp; verbs_afxdp; rxe_guest ;;
  bench) exec scripts/afxdp-bench.sh ;;
  *) echo "usage: $0 [all|afxdp|tap|bad|switch|verbs|rxe|bench]" >&2; exit 2 ;;
esac
