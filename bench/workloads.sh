#!/usr/bin/env bash
# The workload controllers under load on one node: 100 bare pods (baseline) and a 100-replica
# Deployment to Ready, twice each, its rolling update, a 500-completion Job with parallelism
# 50, each beside the runc + CNI floor timed just before it (see bench/src/bin/workloads.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/workloads --write docs/PERFORMANCE.md
