#!/usr/bin/env bash
# The CPU and topology managers' cost at admission (see
# bench/src/bin/resource_managers.rs). Needs root (cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus-bench --bin resource-managers
target/release/resource-managers --write docs/PERFORMANCE.md
