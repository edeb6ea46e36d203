#!/usr/bin/env bash
# kube-proxy's sync engine at 100/1k/10k/30k services, nftables vs iptables, each run in a
# private network namespace (see bench/src/bin/proxy_sync.rs). Needs root. Measures wall
# time: run on a quiet machine. PROXY_BENCH_SIZES=100,1000 for a quick run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus-bench --bin proxy-sync
target/release/proxy-sync --write docs/PERFORMANCE.md
