#!/usr/bin/env bash
# The pure crates' tests under Miri (nightly with the miri component:
# `rustup +nightly component add miri`): rdma's unit and integration tests
# (not golden.rs: it runs tshark and scapy) and cc's unit tests, with few
# proptest cases (Miri checks every access of the paths a case takes; more
# cases mostly repeat them). The closed-loop bottleneck model tests of the
# CC algorithms (sim/tests/bottleneck_model.rs: seconds of simulated traffic,
# plain arithmetic, no pointers) take hours under Miri and are left out.
# Its own target directory, so the release build is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
export PROPTEST_CASES="${PROPTEST_CASES:-8}"
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
miri() { cargo +nightly miri test --target-dir target/miri "$@"; }
miri -p rdma
miri -p cc@0.1.0 --lib
