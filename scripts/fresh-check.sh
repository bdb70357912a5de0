#!/usr/bin/env bash
# The CI run from a state as fresh as this machine can be made: a new clone
# of the committed HEAD in a new directory, with every cache and leftover
# that the scripts and tests create removed first, then `.ci/run` in it,
# timed. A first run on a new machine must pass; this is how to check it
# without one. It takes as long as CI (20-30 minutes on 2 cores).
#
# Removed before the run (what a used machine has and a new one lacks):
#   /tmp/rxe-guest        the rxe guest image, console logs, control sockets
#                         (scripts/rxe-guest.sh; $RXE_DIR)
#   /tmp/rsnic-interop.*  scratch directories of a killed interop run
#   /tmp/rsnic-fresh.*    clones of earlier fresh checks
#   namespaces            rxe-ns, rsnic-a/-b and every other rsnic*/rxe*/xd-*
#                         namespace (rxe-guest.sh, netns.sh, afxdp.sh, the tests),
#                         with the TAPs, veths and bridges inside them
#   QEMU guests           any rxe guest still running
#   DPDK runtime files    /var/run/dpdk/* (file prefixes of killed processes)
#   hugepages             the reservation and the hugetlbfs mount at
#                         /dev/hugepages (scripts/setup.sh makes both again)
#   cargo-fuzz            uninstalled (scripts/setup.sh installs it again)
#   target/ (the fuzz builds too)  absent in the new clone
# Kept (a new Debian 12 gets them from scripts/setup.sh, which this run
# executes): Debian's packages, unless FRESH_PURGE_PACKAGES=1 removes them
# too (apt-get purge; only on a machine where nothing else needs them), and
# the Rust toolchain itself.
#
# usage: scripts/fresh-check.sh [REF]   (default HEAD of this checkout)
# env:   FRESH_KEEP=1 keeps the clone afterwards; FRESH_PURGE_PACKAGES=1
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
ref=${1:-HEAD}
commit=$(git -C "$repo" rev-parse "$ref")

echo "fresh-check: removing what earlier runs left"
pkill -f 'qemu-system-x86_64.*rxe-guest' 2>/dev/null || true
for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
  case $ns in rxe*|rsnic*|xd-*) ip netns del "$ns" ;; esac
done
rm -rf "${RXE_DIR:-/tmp/rxe-guest}" /tmp/rsnic-interop.* /tmp/rsnic-fresh.*
rm -rf /var/run/dpdk/* 2>/dev/null || true
if grep -q ' /dev/hugepages hugetlbfs ' /proc/mounts; then
  rm -f /dev/hugepages/* 2>/dev/null || true
  umount /dev/hugepages 2>/dev/null || echo "fresh-check: /dev/hugepages is in use; left mounted"
fi
[ -w /proc/sys/vm/nr_hugepages ] && echo 0 > /proc/sys/vm/nr_hugepages || true
if cargo fuzz --version >/dev/null 2>&1; then cargo uninstall -q cargo-fuzz || true; fi
if [ "${FRESH_PURGE_PACKAGES:-}" = 1 ]; then
  echo "fresh-check: purging the project's Debian packages"
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq dpdk dpdk-dev libdpdk-dev tshark qemu-system-x86 \
    rdma-core ibverbs-utils ibverbs-providers perftest busybox-static >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get autoremove -y -qq >/dev/null
fi

dir=$(mktemp -d /tmp/rsnic-fresh.XXXXXX)
[ "${FRESH_KEEP:-}" = 1 ] || trap 'rm -rf "$dir"' EXIT
git clone -q "$repo" "$dir/rsnic"
git -C "$dir/rsnic" checkout -q "$commit"
echo "fresh-check: .ci/run in $dir/rsnic at $(git -C "$dir/rsnic" log -1 --format='%h %s' | cut -c1-72)"
start=$(date +%s)
set +e
(cd "$dir/rsnic" && CI=true bash .ci/run)
rc=$?
set -e
secs=$(( $(date +%s) - start ))
echo "fresh-check: .ci/run exited $rc after $((secs / 60)) min $((secs % 60)) s (commit ${commit:0:7})"
exit $rc
