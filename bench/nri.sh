#!/usr/bin/env bash
# NRI's cost per container with one plugin connected: the raw event round trip and
# CreateContainer+StartContainer with and without the plugin (see
# bench/src/bin/nri_roundtrip.rs). Needs root (network namespace, containers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/nri-roundtrip --write docs/PERFORMANCE.md
