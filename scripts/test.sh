#!/usr/bin/env bash
# Runs every nodus test: unit tests and the root-only integration tests against real
# registries, containerd, runc and the kernel. Needs root (as CI is).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/setup.sh
echo "test: setup: $((SECONDS - start)) s"
if [[ $(id -u) -ne 0 ]]; then
  echo "test: the integration tests need root (namespaces, mounts, cgroups)" >&2
  exit 1
fi
export NODUS_TEST_REQUIRE_ROOT=1
start=$SECONDS
cargo build --workspace --all-targets --locked
echo "test: build: $((SECONDS - start)) s"
start=$SECONDS
rc=0
cargo test --workspace --locked --no-fail-fast -- --test-threads 4 || rc=$?
echo "test: cargo test: $((SECONDS - start)) s"
# The cgroup v2 + systemd lane, in a VM: this host is cgroup v1 without systemd.
start=$SECONDS
bash scripts/vm-test.sh || rc=$?
echo "test: vm lane: $((SECONDS - start)) s"
exit $rc
