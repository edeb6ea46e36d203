#!/usr/bin/env bash
# The API server under load: pods created per second (1 and 8 clients), list latency and
# RSS at 10k pods, watch fan-out to 50 watchers (see bench/src/bin/apiserver.rs).
# Measures wall time: run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/apiserver --write docs/PERFORMANCE.md
