#!/usr/bin/env bash
# Runs every check the project has: formatting, clippy, all tests (release
# build, once), the interop matrix against Linux rxe and perftest in a QEMU
# guest, and a few seconds of each fuzz target. Installs what is missing
# first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings

echo "== cargo test (release)"
cargo test --workspace --release

echo "== roce-sim, small fat-tree (32 hosts, 2 ms of WebSearch at 30 %): exits non-zero unless every flow completes, bytes are conserved and every slowdown is >= 1"
cargo run --release -p sim --bin roce-sim -- fattree --hosts 32 --duration-ms 2 --load 0.3 --cc hpcc,dcqcn,ldcp --quiet --out target/sim-ci

echo "== the verbs example (nic/examples/verbs.rs) runs"
cargo run --release -p nic --example verbs -- --cc dcqcn --size 262144

echo "== unmodified ibverbs programs on rsnic (librsnic_verbs.so): Debian's perftest, ibv_rc_pingpong, ibv_devinfo in two namespaces, and the C ABI check (scripts/verbs-abi.sh)"
timeout 900 scripts/verbs-abi.sh all

echo "== pipeline benchmarks against dpdk-testpmd, smoke run (each checks its frames; the figures of record, with longer runs, are in docs/benchmarks.md)"
IO_FWD_SECS=3 IO_FWD_ROUNDS=1 cargo bench -p bench --bench io_fwd
TXP_SECS=3 TXP_ROUNDS=1 cargo bench -p bench --bench tx_pipeline
SWITCH_FWD_SECS=3 SWITCH_FWD_ROUNDS=1 cargo bench -p bench --bench switch_fwd
GOODPUT_SECS=1 cargo bench -p bench --bench nic_goodput

echo "== interop: roce-perf, and perftest on rsnic (librsnic_verbs.so), against Linux rxe + perftest 4.5 in a QEMU guest (scripts/interop.sh; about 7-8 minutes on 2 busy cores)"
timeout 780 scripts/interop.sh all

echo "== net_af_xdp: rsnic on a veth shared with the kernel, peers on AF_XDP, TAP and Linux rxe in the QEMU guest, TCP and ping alongside; roce-switch and perftest on rsnic (librsnic_verbs.so) on AF_XDP ports; bad input (scripts/afxdp.sh; 80 s on the 2-core VM at load 3, 49 s of it for the rxe guest, roce-switch, verbs and signal checks)"
timeout 300 scripts/afxdp.sh all

scripts/soak.sh 0.5 # chaos soak, 30 s: every CC, 1 % loss/dup/reorder/corruption, bytes checked (issue 14; 10-minute run in docs/reliability.md)
echo "== fuzz smoke (${FUZZ_SECONDS:-5} s per target)"
scripts/fuzz.sh "${FUZZ_SECONDS:-5}"
