#!/usr/bin/env bash
# The API server on etcd vs on the embedded store: pods created per second (1 and 8
# clients), the list of 10,000 pods, RSS of the server and of etcd (Debian's /usr/bin/etcd,
# started on free 127.0.0.1 ports in a temp dir). See bench/src/bin/apiserver_etcd.rs.
# Measures wall time: run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodus -p nodus-bench
NODUS_BIN="$PWD/target/release/nodus" target/release/apiserver-etcd --write docs/PERFORMANCE.md
