#!/usr/bin/env bash
# The cost of access control: authorization decisions with 1,000 RoleBindings and 1,000
# ClusterRoleBindings (in-process and as SubjectAccessReview round trips), pods created per
# second under --authorization-mode AlwaysAllow vs Node,RBAC as a non-admin user, and
# TokenReview throughput for service-account and bootstrap tokens (see
# bench/src/bin/rbac.rs). Measures wall time: run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus -p nodus-bench --bin nodus --bin rbac
NODUS_BIN="$PWD/target/release/nodus" target/release/rbac --write docs/PERFORMANCE.md
