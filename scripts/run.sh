#!/usr/bin/env bash
# The main job. For now: the foundation demo, moving packets between two
# DPDK ports (an in-process ring pair) and printing rates. Arguments are
# passed to roce-demo (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo run --release -q -p bench --bin roce-demo -- "$@"
