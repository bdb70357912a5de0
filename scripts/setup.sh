#!/usr/bin/env bash
# Installs what the project needs on Debian 12, idempotently: DPDK 22.11 and
# its headers, clang for bindgen, tshark and scapy for the packet checks,
# iproute2 for namespaces and TAP tests, cargo-fuzz for the fuzz smoke run,
# and the Linux SoftRoCE guest of the interop tests (scripts/rxe-guest.sh):
# QEMU, a Debian kernel with rdma_rxe, rdma-core, perftest, busybox; libbpf
# and libxdp headers for the XDP program of net_af_xdp ports, ping.
# Reserves hugepages (1024 x 2 MiB) where the kernel lets us (everything also runs with
# --no-huge). Safe to run any number of times.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup.sh: not root and no sudo; install the packages below by hand" >&2
  fi
fi

pkgs=(dpdk dpdk-dev libdpdk-dev pkg-config clang libclang-dev gcc make tshark iproute2 python3 python3-pip procps
  qemu-system-x86 linux-image-amd64 rdma-core ibverbs-utils libibverbs-dev ibverbs-providers perftest busybox-static cpio kmod nftables
  libbpf-dev libxdp-dev linux-libc-dev iputils-ping
  librdmacm-dev rdmacm-utils qperf libfabric-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  $SUDO apt-get update -qq
  # tshark asks whether non-root users may capture; the default (no) is fine.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# scapy for the `python3` on PATH (which may be a pyenv build, not Debian's).
if ! python3 -c 'import scapy.contrib.roce' >/dev/null 2>&1; then
  echo "setup.sh: installing scapy for $(command -v python3)"
  python3 -m pip install -q scapy 2>/dev/null \
    || python3 -m pip install -q --break-system-packages scapy 2>/dev/null \
    || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-scapy >/dev/null
  python3 -c 'import scapy.contrib.roce' || { echo "setup.sh: scapy unavailable" >&2; exit 1; }
fi

# Rust components used by the test script.
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "setup.sh: installing cargo-fuzz"
  cargo install -q --locked cargo-fuzz
fi

# Hugepages: optional (everything falls back to --no-huge). Reserve 1024 x 2 MiB
# (2 GiB) if the kernel allows and fewer are set, and mount hugetlbfs at
# /dev/hugepages if nothing is mounted. The benchmarks run dpdk-testpmd and our
# side on them (`bench::memory`); each process takes a modest, preallocated share
# with --in-memory, so nothing is left in the mount when it exits.
hp=/proc/sys/vm/nr_hugepages
if [ -w "$hp" ] && [ "$(cat "$hp")" -lt 1024 ]; then
  echo 1024 > "$hp" 2>/dev/null || true
fi
if [ "$(cat "$hp" 2>/dev/null || echo 0)" -gt 0 ] && ! grep -q ' hugetlbfs ' /proc/mounts; then
  mkdir -p /dev/hugepages 2>/dev/null && mount -t hugetlbfs nodev /dev/hugepages 2>/dev/null || true
fi

# bpffs for libxdp (net_af_xdp ports, scripts/afxdp.sh): without it libxdp
# falls back to one XDP program per interface.
if ! grep -q ' /sys/fs/bpf bpf ' /proc/mounts; then
  $SUDO mount -t bpf bpf /sys/fs/bpf 2>/dev/null || echo "setup.sh: could not mount bpffs at /sys/fs/bpf (libxdp falls back to one program)" >&2
fi
# rsnic's XDP program (xdp/rsnic_xdp.c) needs clang's BPF target.
clang -print-targets 2>/dev/null | grep -qw bpf || { echo "setup.sh: clang has no BPF target" >&2; exit 1; }

pkg-config --exists libdpdk || { echo "setup.sh: libdpdk not found by pkg-config" >&2; exit 1; }
echo "setup.sh: ready (DPDK $(pkg-config --modversion libdpdk), $(tshark --version 2>/dev/null | head -1))"
