#!/usr/bin/env bash
# Server-side apply vs update (PUT) of a Deployment: requests/s with one client on one API
# server (see bench/src/bin/ssa.rs). Measures wall time: run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/ssa --write docs/PERFORMANCE.md
