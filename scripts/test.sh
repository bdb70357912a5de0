#!/usr/bin/env bash
# Runs every check the project has: formatting, clippy, all tests (release
# build, once), and a few seconds of each fuzz target. Installs what is
# missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings

echo "== cargo test (release)"
cargo test --workspace --release

echo "== the verbs example (nic/examples/verbs.rs) runs"
cargo run --release -p nic --example verbs -- --cc dcqcn --size 262144

echo "== fuzz smoke (${FUZZ_SECONDS:-5} s per target)"
scripts/fuzz.sh "${FUZZ_SECONDS:-5}"
