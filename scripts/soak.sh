#!/usr/bin/env bash
# The chaos soak (issue 14): every congestion control over a link that
# drops, duplicates, reorders and corrupts 1 % of frames each way, WRITE,
# READ and SEND checked byte by byte at the receiver, RSS, mempools and QP
# counts sampled each second. Fails (exit 1, one FAILED line) if a byte
# differs, a message is lost or delivered twice, or memory grows after the
# warm-up. Extra arguments go to roce-soak (see its --help).
#
# usage: scripts/soak.sh [MINUTES] [roce-soak args...]   (default 10; 0.5 = 30 s, as CI runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-10}"
shift || true
secs=$(awk -v m="$minutes" 'BEGIN { s = int(m * 60 + 0.5); if (s < 1) s = 1; print s }')
cargo build --release -q -p bench --bin roce-soak
exec target/release/roce-soak --secs "$secs" "$@"
