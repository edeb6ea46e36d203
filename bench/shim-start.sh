#!/usr/bin/env bash
# What starting a shim costs, exec'd per container or forked by the runtime's fork server
# (see bench/src/bin/shim_start.rs). Needs root and runc; about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v runc >/dev/null || { echo "shim-start: runc is not installed" >&2; exit 1; }
cargo build --release --locked -p nodus -p nodus-bench --bin nodus --bin shim-start
NODUS_BIN="$PWD/target/release/nodus" target/release/shim-start "$@"
