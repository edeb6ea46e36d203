#!/usr/bin/env bash
# The memory manager's cost at admission per Guaranteed pod, Static vs None policy (see
# bench/src/bin/memory_manager.rs). In-process; no root needed.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus-bench --bin memory-manager
target/release/memory-manager --write docs/PERFORMANCE.md
