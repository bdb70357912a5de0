#!/usr/bin/env bash
# The main job: an in-process RoCEv2 fabric (N sender NICs -> switch with a
# shaped bottleneck -> one receiver NIC, on DPDK ring pairs) running an N:1
# incast once per congestion control, then the comparison table and where the
# SVG plots are. Without arguments: `roce-testbed incast --cc all`; any
# arguments replace that (try `--help`, `fairness --help`, `longshort --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -q -p bench --bin roce-testbed
if [ "$#" -eq 0 ]; then
  set -- incast --cc all
fi
exec target/release/roce-testbed "$@"
