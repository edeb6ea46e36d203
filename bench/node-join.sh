#!/usr/bin/env bash
# Node join: `nodus node --token …` (token discovery + TLS bootstrap) vs
# `--control-plane-data-dir` from process start to Node Ready, each on a fresh control plane
# in its own network namespace (see bench/src/bin/node_join.rs). Needs root.
# BENCH_JOIN_SAMPLES sets the samples per join (default 5). Measures wall time: run on a
# quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus -p nodus-bench --bin nodus --bin node-join
NODUS_BIN="$PWD/target/release/nodus" target/release/node-join --write docs/PERFORMANCE.md
