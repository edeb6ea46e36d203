#!/usr/bin/env bash
# The cost of one resource-metrics scrape cycle per node with N pods: the kubelet's
# /metrics/resource encoding and the API server's parse + CPU-rate computation (the
# metrics-server role), in thread CPU time, against metrics-server's published ~1 ms CPU
# and 2 MB per node per cycle (see bench/src/bin/metrics.rs). In-process; no root needed.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus-bench --bin metrics
target/release/metrics --write docs/PERFORMANCE.md
