#!/usr/bin/env bash
# Custom resources vs ConfigMaps of the same size: creates/s on one API server
# (see bench/src/bin/crd.rs). Measures wall time: run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/crd --write docs/PERFORMANCE.md
