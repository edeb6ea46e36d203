#!/usr/bin/env bash
# The device manager's cost at admission and a plugin's health change reaching the API
# (see bench/src/bin/device_plugins.rs). Needs root (cgroups, network namespace).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/device-plugins --write docs/PERFORMANCE.md
