#!/usr/bin/env bash
# CRI pod lifecycle latency and per-container memory, nodus vs containerd (see
# bench/src/bin/cri_lifecycle.rs). Run on a quiet machine: it measures wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/cri-lifecycle --write docs/PERFORMANCE.md
