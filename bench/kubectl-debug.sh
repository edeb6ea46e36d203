#!/usr/bin/env bash
# `kubectl debug -i --target` latency (ephemeral containers), the nodus kubelet on nodus's
# runtime vs on containerd + runc (see bench/src/bin/kubectl_debug.rs). BENCH_RUNS sets the
# number of debuggers (default 20). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/kubectl-debug --write docs/PERFORMANCE.md
