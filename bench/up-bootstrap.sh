#!/usr/bin/env bash
# `nodus up` to a Ready node: the kubeadm-style static-pod bootstrap (cold and warm) vs the
# one-process control plane, alternating, each start in a network namespace of its own.
# See bench/src/bin/up_bootstrap.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/up-bootstrap --write docs/PERFORMANCE.md
