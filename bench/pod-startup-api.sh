#!/usr/bin/env bash
# Pod startup latency through the API server (create with spec.nodeName → Running seen by a
# watch), the nodus kubelet on nodus's runtime vs on containerd (see
# bench/src/bin/pod_startup_api.rs). BENCH_PODS sets the burst size (default 30).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/pod-startup-api --write docs/PERFORMANCE.md
