#!/usr/bin/env bash
# The workload controllers under load on one node: 100 bare pods (baseline), a 100-replica
# Deployment to Ready, its rolling update, a 500-completion Job with parallelism 50 (see
# bench/src/bin/workloads.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/workloads --write docs/PERFORMANCE.md
