#!/usr/bin/env bash
# Pod startup latency through the kubelet and the kubelet's footprint at 100 pods, nodus
# runtime vs containerd (see bench/src/bin/kubelet_startup.rs). Measures wall time: run
# on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/kubelet-startup --write docs/PERFORMANCE.md
