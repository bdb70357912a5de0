#!/usr/bin/env bash
# Two hosts on one machine, for multi-process tests and roce-perf:
#
#   namespace rsnic-a                               namespace rsnic-b
#   ctl-a 10.99.0.1/24  <-------- veth -------->  ctl-b 10.99.0.2/24   (TCP exchange)
#   rt-a (TAP, DPDK) -- br-a -- dat-a <-- veth --> dat-b -- br-b -- rt-b (TAP, DPDK)
#
# rt-a and rt-b are persistent multi-queue TAP devices: a DPDK process in the
# namespace attaches to one with --dev net_tap0,iface=rt-a. The data path
# carries no kernel addresses, MTU 9000 everywhere (4 KiB RoCE MTU fits).
#
# usage: scripts/netns.sh up | down | status
# RSNIC_NETNS=PREFIX names the namespaces PREFIX-a and PREFIX-b (default rsnic).
set -euo pipefail
A=${RSNIC_NETNS:-rsnic}-a
B=${RSNIC_NETNS:-rsnic}-b

down() {
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
}

up() {
  down
  ip netns add "$A"
  ip netns add "$B"
  for ns in "$A" "$B"; do
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.default.disable_ipv6=1
    ip -n "$ns" link set lo up
  done
  ip link add ctl-a netns "$A" type veth peer name ctl-b netns "$B"
  ip -n "$A" addr add 10.99.0.1/24 dev ctl-a
  ip -n "$B" addr add 10.99.0.2/24 dev ctl-b
  ip link add dat-a netns "$A" mtu 9000 type veth peer name dat-b netns "$B" mtu 9000
  for side in a b; do
    ns=${RSNIC_NETNS:-rsnic}-$side
    ip -n "$ns" tuntap add dev "rt-$side" mode tap multi_queue
    # The TAP's queue towards rsnic is its RX ring: 4096 frames, as a NIC's
    # ring of 4096 descriptors (the default 1000 dropped 358 of udaddy -C 1000's
    # 2000-datagram burst while the 2-core VM's engine caught up; UD has no
    # retransmission to hide that).
    ip -n "$ns" link set "rt-$side" txqueuelen 4096
    ip -n "$ns" link add "br-$side" type bridge
    ip -n "$ns" link set "br-$side" mtu 9000
    for dev in "rt-$side" "dat-$side"; do
      ip -n "$ns" link set "$dev" mtu 9000
      ip -n "$ns" link set "$dev" master "br-$side"
      ip -n "$ns" link set "$dev" up
    done
    ip -n "$ns" link set "br-$side" up
    ip -n "$ns" link set "ctl-$side" up
  done
  # The kernel may report the data veth's carrier up to a second after both
  # ends are up (it rate-limits link events), and a bridge forwards on a port
  # only from then on: a test that starts at once loses its first frames
  # for that long (seen: dat-b forwarding after both TAPs, and a WRITE that
  # ran out of retries). Wait for both bridge ports (brport state 3).
  for side in a b; do
    ns=${RSNIC_NETNS:-rsnic}-$side
    state=
    for _ in $(seq 100); do
      state=$(ip netns exec "$ns" cat "/sys/class/net/dat-$side/brport/state" 2>/dev/null || true)
      [ "$state" = 3 ] && break
      sleep 0.05
    done
    if [ "$state" != 3 ]; then
      echo "netns: dat-$side is not forwarding after 5 s (brport state '$state')" >&2
      exit 1
    fi
  done
}

case "${1:-}" in
  up) up; echo "netns: $A (ctl 10.99.0.1, TAP rt-a) <-> $B (ctl 10.99.0.2, TAP rt-b)" ;;
  down) down ;;
  status) ip netns list; for ns in "$A" "$B"; do echo "== $ns"; ip -n "$ns" -br link 2>/dev/null || true; done ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
