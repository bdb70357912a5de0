#!/usr/bin/env bash
# Model-checks nic's doorbell, completion-channel and parking protocols under loom
# (nic/loom: nic/src/{sync,doorbell,notify,park}.rs compiled with --cfg loom).
# Its own workspace and target directory, so the main build is untouched.
set -euo pipefail
cd "$(dirname "$0")/../nic/loom"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
    cargo test --release --lib "$@" -- protocols::
