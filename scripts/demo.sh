#!/usr/bin/env bash
# The main job, on a fresh machine with no internet: `nodus up` starts a whole cluster
# (a node: kubelet + CRI runtime + kube-proxy, whose kubelet runs etcd, the API server, the
# scheduler and the controllers as static pods, as kubeadm bootstraps), and the lesson's
# hands-on lab runs against it with the real kubectl:
#   1. the node's runtime, capacity and allocatable   2. the node Lease being renewed
#   3. static pods and their mirror pods               4. containers at the CRI level (crictl)
#   5. QoS classes from requests and limits            6. a memory limit read back from the cgroup
# plus a Service whose ClusterIP kube-proxy programs, reached from the node.
#
# Images are built offline from the host's busybox-static and served by a real registry as
# a mirror of docker.io (so `busybox` and `nginx` resolve). Everything runs inside a private
# network namespace, its own cgroup parent and a temp dir, and is stopped by PID on exit:
# the machine's own network is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked -p nodus -p testkit --bins
BIN=$PWD/target/release

WORK=$(mktemp -d /tmp/nodus-demo.XXXXXX)
NS=nodus-demo-$$
CG=nodus-demo-$$
NODE=node-lab
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  exec 3>&-
  # `nodus up` stops its pods' containers on SIGTERM only as far as the kubelet's shutdown
  # goes; give every daemon time, then SIGKILL what is left and remove the containers.
  for _ in $(seq 100); do
    alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  # Container processes (shims and what they run) live in this demo's cgroup parent.
  for d in /sys/fs/cgroup/*/"$CG" /sys/fs/cgroup/"$CG"; do
    [[ -d $d ]] || continue
    find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null
  done
  pgrep -f "nodus shim .*$WORK" | xargs -r kill -9 2>/dev/null
  sleep 0.5
  grep " $WORK" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
  ip netns del "$NS" 2>/dev/null
  for d in /sys/fs/cgroup/*/"$CG" /sys/fs/cgroup/"$CG"; do
    [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
# An uplink-like interface with an address and a default route, so the node finds its
# InternalIP as it would on a real machine (both veth ends stay inside the namespace).
ip -n "$NS" link add eth0 type veth peer name uplink0
ip -n "$NS" addr add 10.250.0.2/24 dev eth0
ip -n "$NS" link set uplink0 up
ip -n "$NS" link set eth0 up
ip -n "$NS" route add default via 10.250.0.1 dev eth0
for d in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do [[ -e $d/cgroup.procs ]] && mkdir -p "$d/$CG"; done
# nsenter --net switches only the network namespace (the host's mount namespace, where
# /sys/fs/cgroup is, stays): daemons are started with nsenter itself so that `$!` is the
# daemon's own PID, which the cleanup stops.
in_ns() { nsenter --net="/run/netns/$NS" "$@"; }

echo "== a local registry with busybox and an nginx stand-in, built offline from /bin/busybox"
mkfifo "$WORK/registry.stdin"
nsenter --net="/run/netns/$NS" "$BIN/nodus-testkit" registry --push busybox=library/busybox:latest \
  --push web=library/nginx:latest --ready-file "$WORK/registry" < "$WORK/registry.stdin" 2> "$WORK/registry.log" &
PIDS+=("$!")
exec 3> "$WORK/registry.stdin"
for _ in $(seq 100); do [[ -s $WORK/registry ]] && break; sleep 0.1; done
REG=$(cat "$WORK/registry")
mkdir -p "$WORK/certs.d/docker.io" "$WORK/net.d"
cat > "$WORK/certs.d/docker.io/hosts.toml" <<TOML
server = "https://registry-1.docker.io"
[host."http://$REG"]
  capabilities = ["pull", "resolve"]
TOML
cat > "$WORK/net.d/10-demo.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "demo", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.85.0.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$WORK/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
cat > "$WORK/runtime.toml" <<TOML
registry-config-dir = "$WORK/certs.d"
cni-conf-dir = "$WORK/net.d"
TOML

echo "== nodus up"
UP=$WORK/up
nsenter --net="/run/netns/$NS" "$BIN/nodus" up --data-dir "$UP" -- \
  --runtime-config "$WORK/runtime.toml" --hostname-override "$NODE" --cgroup-root "/$CG" \
  --pod-logs-dir "$WORK/pod-logs" --cluster-cidr 10.85.0.0/24 > "$WORK/up.out" 2> "$WORK/up.log" &
PIDS+=("$!")
# The first start builds the control plane's images from the binary and starts its static pods.
for _ in $(seq 1200); do grep -q '^next:' "$WORK/up.out" 2>/dev/null && break; sleep 0.1; done
cat "$WORK/up.out"
export KUBECONFIG=$UP/control-plane/admin.kubeconfig
export HOME=$WORK
kubectl() { echo "\$ kubectl $*" >&2; in_ns kubectl "$@"; }
crictl() { echo "\$ crictl $*" >&2; in_ns "$BIN/nodus" crictl --runtime-endpoint "unix://$UP/node/run/nodus.sock" "$@"; }
quiet() { in_ns kubectl "$@" 2>/dev/null; }
for _ in $(seq 300); do
  [[ $(quiet get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]] && break
  sleep 0.2
done

echo; echo "== 1. the node's runtime, capacity and allocatable"
kubectl get nodes -o wide
kubectl describe node | sed -n '/Capacity:/,/Allocatable:/p'

echo; echo "== 2. the node Lease, renewed every 10 s"
kubectl get leases -n kube-node-lease
kubectl get lease -n kube-node-lease -o jsonpath='{.items[0].spec.renewTime}{"\n"}'
sleep 12
kubectl get lease -n kube-node-lease -o jsonpath='{.items[0].spec.renewTime}{"\n"}'

echo; echo "== 3. the control plane's static pods (kubeadm-style), seen as mirror pods"
for _ in $(seq 300); do
  [[ $(quiet get pods -n kube-system -l tier=control-plane --field-selector status.phase=Running -o name | wc -l) == 4 ]] && break
  sleep 0.2
done
kubectl get pods -n kube-system -o wide
ls "$UP/manifests"
echo "# challenge 4: deleting etcd's mirror pod through the API does not remove it"
kubectl delete pod -n kube-system "etcd-$NODE" --wait=false
for _ in $(seq 100); do quiet get pod -n kube-system "etcd-$NODE" >/dev/null && break; sleep 0.2; done
kubectl get pods -n kube-system | grep etcd
echo "# a static pod of our own from the manifest directory, and its mirror pod"
cat > "$UP/manifests/node-agent.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: node-agent, namespace: kube-system, labels: {app: node-agent}}
spec:
  containers:
  - name: agent
    image: busybox
    command: ["sh", "-c", "while true; do echo agent alive; sleep 5; done"]
YAML
for _ in $(seq 300); do
  [[ $(quiet get pod -n kube-system "node-agent-$NODE" -o jsonpath='{.status.phase}') == Running ]] && break
  sleep 0.2
done
kubectl get pods -n kube-system
echo "# deleting the mirror pod: the kubelet recreates it (the file on disk is the source of truth)"
kubectl delete pod -n kube-system "node-agent-$NODE" --wait=false
for _ in $(seq 100); do quiet get pod -n kube-system "node-agent-$NODE" >/dev/null && break; sleep 0.2; done
sleep 1
kubectl get pods -n kube-system

echo; echo "== 5. QoS classes from requests and limits (before 4, so crictl shows them)"
kubectl run be --image=nginx --restart=Never
kubectl run guaranteed --image=nginx --restart=Never \
  --overrides='{"spec":{"containers":[{"name":"guaranteed","image":"nginx","resources":{"requests":{"cpu":"100m","memory":"64Mi"},"limits":{"cpu":"100m","memory":"64Mi"}}}]}}'
for _ in $(seq 300); do
  [[ $(quiet get pod be guaranteed -o jsonpath='{.items[*].status.phase}') == "Running Running" ]] && break
  sleep 0.2
done
kubectl get pod be guaranteed -o custom-columns=NAME:.metadata.name,QOS:.status.qosClass,NODE:.spec.nodeName,IP:.status.podIP

echo; echo "== 4. the containers at the CRI level, as the runtime sees them"
crictl ps | head
crictl images | head
crictl pods

echo; echo "== 6. the memory limit, pushed down into the container's cgroup"
kubectl exec guaranteed -- cat /sys/fs/cgroup/memory.max 2>/dev/null || \
kubectl exec guaranteed -- cat /sys/fs/cgroup/memory/memory.limit_in_bytes

echo; echo "== a Service: the EndpointSlice controller lists the pod, kube-proxy programs the ClusterIP"
kubectl expose pod guaranteed --name web --port 80
for _ in $(seq 300); do
  [[ -n $(quiet get endpointslices -l kubernetes.io/service-name=web -o jsonpath='{.items[*].endpoints[?(@.conditions.ready==true)].addresses[0]}') ]] && break
  sleep 0.2
done
kubectl get service web
kubectl get endpointslices -l kubernetes.io/service-name=web
IP=$(quiet get service web -o jsonpath='{.spec.clusterIP}')
echo "\$ curl http://$IP/   # from the node"
for _ in $(seq 50); do in_ns curl -sS --max-time 2 "http://$IP/" 2>/dev/null && break; sleep 0.3; done
in_ns "$BIN/nodus" proxy --kubeconfig "$UP/control-plane/admin.kubeconfig" --show-rules 2>/dev/null | sed -n '/default\/web/,/^$/p' | head -20

echo; echo "== cleanup"
kubectl delete pod be guaranteed --ignore-not-found
kubectl delete service web
echo "demo: ok"
