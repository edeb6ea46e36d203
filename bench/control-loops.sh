#!/usr/bin/env bash
# The control plane's loops: scheduling throughput (5000 pods, 100 nodes), node-lifecycle
# reaction time with upstream's defaults, EndpointSlice update latency
# (see bench/src/bin/control_loops.rs). Measures wall time: run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/control-loops --write docs/PERFORMANCE.md
