#!/usr/bin/env bash
# Runs every nodus test: unit tests and the root-only integration tests against real
# registries, containerd, runc and the kernel. Needs root (as CI is).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ $(id -u) -ne 0 ]]; then
  echo "test: the integration tests need root (namespaces, mounts, cgroups)" >&2
  exit 1
fi
export NODUS_TEST_REQUIRE_ROOT=1
cargo build --workspace --all-targets --locked
cargo test --workspace --locked --no-fail-fast -- --test-threads 4
