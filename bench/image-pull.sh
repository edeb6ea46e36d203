#!/usr/bin/env bash
# Pull + unpack of the ~100 MB multi-layer image, cold store, nodus vs containerd.
# Usage: bash bench/image-pull.sh [RUNS]   (default 7)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/image-pull --runs "${1:-7}" --write docs/PERFORMANCE.md
