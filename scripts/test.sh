#!/usr/bin/env bash
# Runs every check the project has: formatting, clippy, all tests (release
# build, once), the interop matrix against Linux rxe and perftest in a QEMU
# guest, and a few seconds of each fuzz target. Installs what is missing
# first.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's header shows the minutes:seconds since the start, so a slow
# stage stands out in CI's log (the whole run must stay under 30 minutes on
# the 2-core VM).
t0=$SECONDS
stage() { printf '== [%d:%02d] %s\n' $(((SECONDS - t0) / 60)) $(((SECONDS - t0) % 60)) "$*"; }
trap 'stage "end (exit $?)"' EXIT
scripts/setup.sh

stage "cargo fmt --check"
cargo fmt --all -- --check

stage "cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings

stage "cargo test (release)"
# The back-to-back and through-switch transfer tests move 256 MiB per CC and
# operation here (1 GiB by default): the same paths, a quarter of the time.
RSNIC_TEST_BYTES=$((256 << 20)) cargo test --workspace --release

stage "roce-sim, small fat-tree (32 hosts, 2 ms of WebSearch at 30 %): exits non-zero unless every flow completes, bytes are conserved and every slowdown is >= 1"
cargo run --release -p sim --bin roce-sim -- fattree --hosts 32 --duration-ms 2 --load 0.3 --cc hpcc,dcqcn,ldcp --quiet --out target/sim-ci

stage "the verbs example (nic/examples/verbs.rs) runs"
cargo run --release -p nic --example verbs -- --cc dcqcn --size 262144

stage "unmodified ibverbs programs on rsnic (librsnic_verbs.so): Debian's perftest, ibv_rc_pingpong, ibv_devinfo in two namespaces, and the C ABI check (scripts/verbs-abi.sh)"
timeout 1500 scripts/verbs-abi.sh all

stage "rdma_cm programs on rsnic in two namespaces (librsnic_verbs.so's librdmacm): rping -v, ucmatose, udaddy, rdma_server/rdma_client, perftest -R, qperf -cm1 (scripts/verbs-abi.sh cm)"
timeout 600 scripts/verbs-abi.sh cm

stage "pipeline benchmarks against dpdk-testpmd, smoke run (each checks its frames; the figures of record, with longer runs, are in docs/benchmarks.md)"
# Built with the release profile the tests used (no second build with the
# bench profile's thin LTO: a smoke run checks frames, not figures).
IO_FWD_SECS=3 IO_FWD_ROUNDS=1 cargo bench --profile release -p bench --bench io_fwd
TXP_SECS=3 TXP_ROUNDS=1 cargo bench --profile release -p bench --bench tx_pipeline
SWITCH_FWD_SECS=3 SWITCH_FWD_ROUNDS=1 cargo bench --profile release -p bench --bench switch_fwd
GOODPUT_SECS=1 cargo bench --profile release -p bench --bench nic_goodput
GL_SECS=1 GL_ROUNDS=1 cargo bench --profile release -p bench --bench gather_loopback

stage "interop: roce-perf, and perftest on rsnic (librsnic_verbs.so), against Linux rxe + perftest 4.5 in a QEMU guest (scripts/interop.sh; about 2.5 minutes on the 2-core VM, the guest image included)"
scripts/rxe-guest.sh agent-check
timeout 780 scripts/interop.sh all

stage "net_af_xdp: rsnic on a veth shared with the kernel, peers on AF_XDP, TAP and Linux rxe in the QEMU guest, TCP and ping alongside; roce-switch and perftest on rsnic (librsnic_verbs.so) on AF_XDP ports; bad input (scripts/afxdp.sh; 80 s on the 2-core VM at load 3, 49 s of it for the rxe guest, roce-switch, verbs and signal checks)"
timeout 300 scripts/afxdp.sh all

stage "chaos soak, 30 s: every CC, 1 % loss/dup/reorder/corruption, bytes checked (10-minute run in docs/reliability.md)"
scripts/soak.sh 0.5
stage "fuzz smoke (${FUZZ_SECONDS:-5} s per target)"
scripts/fuzz.sh "${FUZZ_SECONDS:-5}"
