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
#     the kernel's ping still answers; no XDP program is left attached.
# `bench` instead measures write_bw 64 KiB, write_bw 64 B and read_lat over
# net_af_xdp, net_af_packet and net_tap on the same veth pair (docs/benchmarks.md).
#
# usage: scripts/afxdp.sh [all|afxdp|tap|bad|bench]   (root; run under
# `flock /tmp/rsnic-host.lock` next to other users of namespaces)
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

# A TCP transfer of 4 MiB from B to A, checked byte for byte (python3).
tcp_transfer() {
  ip netns exec "$A" python3 - <<'PY' &
import hashlib, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.77.0.1", 18600)); s.listen(1); s.settimeout(20)
c, _ = s.accept(); c.settimeout(20); h = hashlib.sha256(); n = 0
while True:
    b = c.recv(65536)
    if not b: break
    h.update(b); n += len(b)
open("target/afxdp/tcp.rx", "w").write(f"{n} {h.hexdigest()}\n")
PY
  local srv=$!
  sleep 0.3
  ip netns exec "$B" python3 - <<'PY'
import hashlib, socket, time
data = bytes(range(256)) * 16384
for _ in range(50):
    try:
        s = socket.create_connection(("10.77.0.1", 18600), timeout=5); break
    except OSError: time.sleep(0.1)
# Spread over about 2 s, so that it overlaps the RDMA transfer.
for i in range(0, len(data), 65536):
    s.sendall(data[i:i + 65536]); time.sleep(0.03)
s.close()
open("target/afxdp/tcp.tx", "w").write(f"{len(data)} {hashlib.sha256(data).hexdigest()}\n")
PY
  wait "$srv"
  cmp -s "$OUT/tcp.rx" "$OUT/tcp.tx" || fail "TCP transfer over the shared interface: sent $(cat "$OUT/tcp.tx"), received $(cat "$OUT/tcp.rx" 2>/dev/null)"
  echo "afxdp: TCP transfer during RDMA: $(cut -d' ' -f1 "$OUT/tcp.rx") bytes, sha256 equal"
}

# ping from B to A during the transfer: every echo answered.
ping_check() {
  local out
  out=$(ip netns exec "$B" ping -c 30 -i 0.05 -W 1 10.77.0.1) || fail "ping over the shared interface: $out"
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
  cleanup
  echo "afxdp: bad input: pass"
}

[ -x "$BIN" ] || cargo build --release -p bench --bin roce-perf
mount_bpffs
case "${1:-all}" in
  afxdp) run_pair afxdp ;;
  tap) run_pair tap ;;
  bad) bad_input ;;
  all) run_pair afxdp; run_pair tap; bad_input ;;
  bench) exec scripts/afxdp-bench.sh ;;
  *) echo "usage: $0 [all|afxdp|tap|bad|bench]" >&2; exit 2 ;;
esac
