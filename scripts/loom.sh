#!/usr/bin/env bash
# Model-checks nic's doorbell, completion-channel and parking protocols under loom
# (nic/loom: nic/src/{sync,doorbell,notify,park}.rs compiled with --cfg loom).
# Its own workspace and target directory, so the main build is untouched.
# At most 3 preemptions per execution (LOOM_MAX_PREEMPTIONS): beyond that, loom
# 0.7's unfixed RMW-atomicity bug (tokio-rs/loom#254) reports a deadlock the
# memory model forbids; protocols::loom_still_lets_a_store_into_an_rmw says why
# and fails once the loom in use no longer has it (then lift the bound).
set -euo pipefail
cd "$(dirname "$0")/../nic/loom"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
    cargo test --release --lib "$@" -- protocols::
