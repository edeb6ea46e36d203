#!/usr/bin/env bash
# Pod cgroup create/delete churn through the kubelet's container manager (see
# bench/src/bin/cgroup_churn.rs). Needs root (real cgroups under a private root).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus-bench
target/release/cgroup-churn --write docs/PERFORMANCE.md
