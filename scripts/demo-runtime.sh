#!/usr/bin/env bash
# The runtime alone, on a fresh machine with no internet: build nodus, build a busybox image from
# the host's busybox-static, serve it from a real registry (as a mirror of docker.io, so
# plain `busybox` resolves), run `nodus runtime`, and drive it with `nodus crictl` the way an
# operator would: pull, run a pod and a container, look at it (the lesson's `crictl ps`,
# `crictl pods`, `crictl images`), exec into it, read its logs, tear it down.
#
# Everything runs inside a private network namespace (its own loopback, bridge and pod IPs)
# and a temp dir, and is stopped by PID on exit: the machine's own network is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked -p nodus -p testkit --bins
BIN=$PWD/target/release

WORK=$(mktemp -d /tmp/nodus-demo.XXXXXX)
NS=nodus-demo-$$
CG=nodus-demo-$$
PIDS=()
cleanup() {
  set +e
  if [[ -S $WORK/nodus.sock ]]; then
    nsenter --net="/run/netns/$NS" "$BIN/nodus" crictl -r "unix://$WORK/nodus.sock" rmp -f -a >/dev/null 2>&1
  fi
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  exec 3>&-
  # Give each daemon a few seconds to stop on SIGTERM (the registry helper stops when its
  # stdin closes), then SIGKILL what is left.
  for _ in $(seq 50); do
    alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  ip netns del "$NS" 2>/dev/null
  for d in /sys/fs/cgroup/*/"$CG" /sys/fs/cgroup/"$CG"; do
    [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
# nsenter --net switches only the network namespace: unlike `ip netns exec` it keeps the
# host mount namespace, where /sys/fs/cgroup is (runc needs it). Daemons are started with
# nsenter itself (not through this function) so that `$!` is the daemon's own PID, which
# the cleanup stops.
in_ns() { nsenter --net="/run/netns/$NS" "$@"; }

echo "== a local registry with busybox built offline from /bin/busybox"
# The registry helper serves until its stdin closes: a FIFO this script holds open.
mkfifo "$WORK/registry.stdin"
nsenter --net="/run/netns/$NS" "$BIN/nodus-testkit" registry --push busybox=library/busybox:latest \
  --ready-file "$WORK/registry" < "$WORK/registry.stdin" &
PIDS+=("$!")
exec 3> "$WORK/registry.stdin"
for _ in $(seq 100); do [[ -s $WORK/registry ]] && break; sleep 0.1; done
REG=$(cat "$WORK/registry")
echo "registry: http://$REG (inside network namespace $NS)"

mkdir -p "$WORK/certs.d/docker.io" "$WORK/net.d" "$WORK/logs"
cat > "$WORK/certs.d/docker.io/hosts.toml" <<TOML
server = "https://registry-1.docker.io"
[host."http://$REG"]
  capabilities = ["pull", "resolve"]
TOML
# The pod network: the CNI bridge plugin with host-local IPAM whose state stays in $WORK.
cat > "$WORK/net.d/10-demo.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "demo", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.85.0.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$WORK/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
cat > "$WORK/runtime.toml" <<TOML
registry-config-dir = "$WORK/certs.d"
cni-conf-dir = "$WORK/net.d"
TOML

echo "== nodus runtime"
SOCK="$WORK/nodus.sock"
nsenter --net="/run/netns/$NS" "$BIN/nodus" runtime --listen "$SOCK" --root-dir "$WORK/root" --state-dir "$WORK/state" \
  --config "$WORK/runtime.toml" 2> "$WORK/runtime.log" &
PIDS+=("$!")
for _ in $(seq 100); do [[ -S $SOCK ]] && break; sleep 0.1; done

# crictl runs in the node's network namespace too: exec and port-forward stream from the
# runtime's streaming server on that namespace's 127.0.0.1.
crictl() { echo "\$ crictl $*"; in_ns "$BIN/nodus" crictl --runtime-endpoint "unix://$SOCK" "$@"; }
crictl version
crictl pull busybox
crictl images
cat > "$WORK/pod.json" <<JSON
{"metadata": {"name": "demo", "namespace": "default", "uid": "demo-uid", "attempt": 0},
 "hostname": "demo", "log_directory": "$WORK/logs"}
JSON
cat > "$WORK/container.json" <<JSON
{"metadata": {"name": "hello"}, "image": {"image": "busybox"},
 "command": ["sh", "-c", "echo hello from a nodus container; hostname; exec sleep 3600"],
 "log_path": "hello.log"}
JSON
POD=$(in_ns "$BIN/nodus" crictl -r "unix://$SOCK" runp "$WORK/pod.json")
echo "pod: $POD"
CTR=$(in_ns "$BIN/nodus" crictl -r "unix://$SOCK" create "$POD" "$WORK/container.json" "$WORK/pod.json")
crictl start "$CTR"
sleep 1
crictl pods
crictl ps
crictl exec "$CTR" sh -c 'id; ip -4 addr show eth0 | grep inet'
crictl logs "$CTR"
crictl stats
crictl stopp "$POD"
crictl rmp "$POD"

echo "== nodus kubelet: a static pod from a manifest directory, on the same runtime"
mkdir -p "$WORK/manifests"
cat > "$WORK/manifests/web.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo hello from static pod $(POD_NAME); exec sleep 3600"]
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    readinessProbe:
      exec: {command: ["true"]}
      periodSeconds: 1
YAML
# The kubelet's cgroup root must exist (as upstream's); kubepods and the QoS tiers go under it.
for d in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do [[ -e $d/cgroup.procs ]] && mkdir -p "$d/$CG"; done
nsenter --net="/run/netns/$NS" "$BIN/nodus" kubelet --container-runtime-endpoint "unix://$SOCK" --root-dir "$WORK/kubelet" \
  --pod-manifest-path "$WORK/manifests" --pod-logs-dir "$WORK/pod-logs" --cgroup-root "/$CG" \
  --hostname-override demo-node --healthz-port 0 2> "$WORK/kubelet.log" &
PIDS+=("$!")
for _ in $(seq 300); do
  [[ -n $(in_ns "$BIN/nodus" crictl -r "unix://$SOCK" ps -q --name web --state running 2>/dev/null) ]] && break
  sleep 0.1
done
# The static pod's name carries the node name, the tell-tale of a static pod.
crictl pods --name web-demo-node
crictl ps --name web
crictl logs "$(in_ns "$BIN/nodus" crictl -r "unix://$SOCK" ps -q --name web)"
echo "\$ rm $WORK/manifests/web.yaml   # the kubelet tears the pod down"
rm "$WORK/manifests/web.yaml"
for _ in $(seq 300); do
  [[ -z $(in_ns "$BIN/nodus" crictl -r "unix://$SOCK" pods -q --name web-demo-node 2>/dev/null) ]] && break
  sleep 0.1
done
crictl pods --name web-demo-node
crictl rmi busybox
echo "demo: ok"
