#!/usr/bin/env bash
# Control-plane failover: two `nodus control-plane` processes on one etcd (Debian's
# /usr/bin/etcd, one member on free 127.0.0.1 ports in a temp dir), upstream's
# leader-election defaults; time from SIGKILL of the leader to the other holding both
# Leases and to the next pod bound. See bench/src/bin/ha_failover.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/ha-failover --write docs/PERFORMANCE.md
