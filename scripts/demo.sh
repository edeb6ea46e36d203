#!/usr/bin/env bash
# The main job, on a fresh machine with no internet: build nodus, build a busybox image from
# the host's busybox-static, serve it from a real registry on 127.0.0.1 (as a mirror of
# docker.io, so plain `busybox` resolves), run `nodus runtime`, and drive it with
# `nodus crictl` the way an operator would. Everything lives in a temp dir and is stopped
# (by PID) on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked -p nodus -p testkit --bins
BIN=target/release

WORK=$(mktemp -d /tmp/nodus-demo.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== starting a local registry with busybox built offline from /bin/busybox"
sleep infinity > /dev/null &   # keeps the registry's stdin open until cleanup
HOLD=$!
PIDS+=("$HOLD")
"$BIN/nodus-testkit" registry --push busybox=library/busybox:latest \
  --ready-file "$WORK/registry" < <(tail -f /dev/null --pid "$HOLD") &
PIDS+=("$!")
for _ in $(seq 100); do [[ -s $WORK/registry ]] && break; sleep 0.1; done
REG=$(cat "$WORK/registry")
echo "registry: http://$REG"

mkdir -p "$WORK/certs.d/docker.io"
cat > "$WORK/certs.d/docker.io/hosts.toml" <<TOML
server = "https://registry-1.docker.io"
[host."http://$REG"]
  capabilities = ["pull", "resolve"]
TOML
echo "registry-config-dir = \"$WORK/certs.d\"" > "$WORK/runtime.toml"

echo "== starting nodus runtime"
SOCK="$WORK/nodus.sock"
"$BIN/nodus" runtime --listen "$SOCK" --root-dir "$WORK/root" --state-dir "$WORK/state" \
  --config "$WORK/runtime.toml" 2> "$WORK/runtime.log" &
PIDS+=("$!")
for _ in $(seq 100); do [[ -S $SOCK ]] && break; sleep 0.1; done

crictl() { echo "\$ nodus crictl $*"; "$BIN/nodus" crictl --runtime-endpoint "unix://$SOCK" "$@"; }
crictl version
crictl pull busybox
crictl images
crictl inspecti busybox | head -n 20
crictl imagefsinfo
crictl rmi busybox
crictl images
echo "== runtime log"
cat "$WORK/runtime.log"
echo "demo: ok"
