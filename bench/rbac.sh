#!/usr/bin/env bash
# The cost of RBAC: per-decision latency (p50/p99) with 1,000 RoleBindings, in-process, and
# pods created per second under --authorization-mode AlwaysAllow vs Node,RBAC with a
# non-admin user bound to edit (see bench/src/bin/rbac.rs).
# Measures wall time: run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus -p nodus-bench --bin nodus --bin rbac
NODUS_BIN="$PWD/target/release/nodus" target/release/rbac --write docs/PERFORMANCE.md
