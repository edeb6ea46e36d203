#!/usr/bin/env bash
# Pod network across nodes: pod-to-pod TCP throughput (iperf3) and round trips (ping -c 200
# -i 0.01) between two pods on one node and between pods on two nodes, for
# `--flannel-backend host-gw` and `vxlan`. Each backend gets a fresh cluster: `nodus
# control-plane` (--allocate-node-cidrs) in a "LAN" network namespace holding a bridge, two
# `nodus node`s (release build) in namespaces of their own plugged into it, pods on the
# runtime's default network from the node's podCIDR. The host's iperf3 and busybox ping run
# inside the pods' network namespaces (nsenter on the sandbox's pinned netns). The same-node
# pair is measured in the same cluster, so each backend is compared with its own baseline.
#
# Needs root. Installs iperf3 with apt-get when missing. Writes its figures into
# docs/PERFORMANCE.md between the bench:podnet markers (the section is added when absent).
# BENCH_PODNET_SECONDS: seconds per iperf3 run (default 10); BENCH_PODNET_RUNS: runs per
# pair, alternating same-node and cross-node (default 3). NODUS_BIN: a nodus binary to use
# instead of building the release one. Measures wall time: run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECS=${BENCH_PODNET_SECONDS:-10}
RUNS=${BENCH_PODNET_RUNS:-3}

[ "$(id -u)" = 0 ] || { echo "bench/podnet.sh needs root" >&2; exit 1; }
if ! command -v iperf3 >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y iperf3 >/dev/null
fi
if [ -z "${NODUS_BIN:-}" ]; then
    cargo build --release -p nodus --bin nodus
    NODUS_BIN=$ROOT/target/release/nodus
fi
KUBECTL=$(command -v kubectl)

WORK=$(mktemp -d /tmp/nodus-bench-podnet.XXXXXX)
TAG=$$
LAN=nodus-bpn-lan-$TAG
PIDS=()
NSS=()
CGROUPS=()

log() { echo "[podnet] $*" >&2; }

cleanup() {
    set +e
    for cfg in "$WORK"/*/cp/data/admin.kubeconfig; do
        [ -f "$cfg" ] && k "$cfg" delete pods --all --grace-period=1 --wait=true --timeout=30s >/dev/null 2>&1
    done
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    # Whatever the nodes left: shims, containers and pinned pid-namespace inits (by the pids
    # they recorded), then every mount under the work dir.
    for f in "$WORK"/*/node-*/data/run/runtime/containers/*/shim/*.pid \
             "$WORK"/*/node-*/data/run/runtime/sandboxes/*/ns/pid-init; do
        [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
    done
    for f in "$WORK"/iperf-*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    findmnt -rn -o TARGET | grep "^$WORK" | sort -r | while read -r m; do umount -l "$m"; done
    for ns in "${NSS[@]}"; do ip netns del "$ns" 2>/dev/null; done
    for cg in "${CGROUPS[@]}"; do
        for base in /sys/fs/cgroup /sys/fs/cgroup/*; do
            [ -d "$base/$cg" ] && find "$base/$cg" -depth -type d -exec rmdir {} + 2>/dev/null
        done
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

k() { local cfg=$1; shift; nsenter --net=/run/netns/$LAN "$KUBECTL" --kubeconfig "$cfg" "$@"; }

# busybox as an OCI archive for `nodus runtime import` (the nodes pull nothing).
python3 - "$WORK/busybox.tar" <<'EOF'
import hashlib, io, json, os, platform, sys, tarfile
arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
def blob(data):
    return "sha256:" + hashlib.sha256(data).hexdigest(), data
lb = io.BytesIO()
with tarfile.open(fileobj=lb, mode="w", format=tarfile.PAX_FORMAT) as t:
    for d, mode in [("bin", 0o755), ("tmp", 0o1777), ("proc", 0o755), ("sys", 0o755), ("dev", 0o755), ("etc", 0o755)]:
        i = tarfile.TarInfo(d); i.type = tarfile.DIRTYPE; i.mode = mode; t.addfile(i)
    bb = open("/bin/busybox", "rb").read()
    i = tarfile.TarInfo("bin/busybox"); i.size = len(bb); i.mode = 0o755; t.addfile(i, io.BytesIO(bb))
    for a in ["sh", "sleep"]:
        i = tarfile.TarInfo("bin/" + a); i.type = tarfile.LNKTYPE; i.linkname = "bin/busybox"; t.addfile(i)
layer_digest, layer = blob(lb.getvalue())
config_digest, config = blob(json.dumps({
    "architecture": arch, "os": "linux",
    "config": {"Env": ["PATH=/bin"], "Cmd": ["sh"]},
    "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}).encode())
manifest_digest, manifest = blob(json.dumps({
    "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": len(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": len(layer)}]}).encode())
index = json.dumps({"schemaVersion": 2, "manifests": [{
    "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest, "size": len(manifest),
    "annotations": {"io.containerd.image.name": "docker.io/library/busybox:latest",
                    "org.opencontainers.image.ref.name": "latest"}}]}).encode()
with tarfile.open(sys.argv[1], "w") as t:
    def add(name, data):
        i = tarfile.TarInfo(name); i.size = len(data); t.addfile(i, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add("index.json", index)
    for d, data in [(layer_digest, layer), (config_digest, config), (manifest_digest, manifest)]:
        add("blobs/sha256/" + d.split(":")[1], data)
EOF

ip netns add "$LAN"; NSS+=("$LAN")
ip -n "$LAN" link set lo up
ip -n "$LAN" link add br0 type bridge
ip -n "$LAN" addr add 10.253.9.1/24 dev br0
ip -n "$LAN" link set br0 up

# wait_for DESCRIPTION SECONDS COMMAND...: polls until COMMAND succeeds.
wait_for() {
    local what=$1 secs=$2; shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then log "timed out: $what"; return 1; fi
        sleep 0.5
    done
}

# The pinned network namespace file of the sandbox whose eth0 holds IP on node dir D.
pod_netns() {
    local d=$1 ip=$2 f
    for f in "$d"/data/run/runtime/sandboxes/*/ns/net; do
        if nsenter --net="$f" ip -4 -o addr show dev eth0 2>/dev/null | grep -q " $ip/"; then
            echo "$f"; return 0
        fi
    done
    return 1
}

# iperf3 client run: Gbit/s received.
iperf() {
    local ns=$1 ip=$2
    nsenter --net="$ns" iperf3 -c "$ip" -t "$SECS" -J |
        python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
}

# ping round trips: "avg max" in ms.
rtt() {
    local ns=$1 ip=$2
    nsenter --net="$ns" busybox ping -c 200 -i 0.01 -q "$ip" |
        sed -n 's|.*min/avg/max = \([0-9.]*\)/\([0-9.]*\)/\([0-9.]*\) ms|\2 \3|p'
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

ROWS=()
net=1
for backend in host-gw vxlan; do
    # Each backend's nodes get addresses and bridge ports of their own on the LAN.
    net=$((net + 1))
    B=$WORK/$backend
    mkdir -p "$B/cp"
    cidr=10.79.0.0/16
    log "$backend: starting the control plane and two nodes"
    nsenter --net=/run/netns/$LAN "$NODUS_BIN" control-plane --data-dir "$B/cp/data" \
        --bind-address 10.253.9.1 --secure-port 6443 --allocate-node-cidrs --cluster-cidr "$cidr" \
        >"$B/cp/log" 2>&1 &
    CP_PID=$!
    PIDS+=("$CP_PID")
    wait_for "control plane" 60 test -f "$B/cp/data/admin.kubeconfig"
    CFG=$B/cp/data/admin.kubeconfig
    wait_for "API server" 60 k "$CFG" get --raw /readyz
    NODE_PIDS=()
    for i in 0 1; do
        name=node-$i
        d=$B/$name
        ns=nodus-bpn-$backend-$i-$TAG
        cg=nodus-bpn-$backend-$i-$TAG
        ip netns add "$ns"; NSS+=("$ns")
        ip -n "$ns" link set lo up
        ip -n "$LAN" link add "p$net-$i" type veth peer name eth0 netns "$ns"
        ip -n "$LAN" link set "p$net-$i" master br0 up
        ip -n "$ns" addr add "10.253.9.$net$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" route add default via 10.253.9.1 dev eth0
        for base in /sys/fs/cgroup /sys/fs/cgroup/*; do
            [ -f "$base/cgroup.procs" ] && mkdir -p "$base/$cg"
        done
        CGROUPS+=("$cg")
        mkdir -p "$d/net.d"
        printf 'cni-conf-dir = "%s"\ncni-bin-dirs = ["/usr/lib/cni", "/opt/cni/bin"]\ndefault-network-ipam-data-dir = "%s"\n' \
            "$d/net.d" "$d/ipam" >"$d/runtime.toml"
        "$NODUS_BIN" runtime import "$WORK/busybox.tar" --root-dir "$d/data/runtime" >/dev/null
        nsenter --net=/run/netns/$ns "$NODUS_BIN" node --data-dir "$d/data" \
            --control-plane-data-dir "$B/cp/data" --runtime-config "$d/runtime.toml" \
            --hostname-override "$name" --root-dir "$d/kubelet" --pod-logs-dir "$d/logs" \
            --cgroup-root "/$cg" \
            --eviction-hard 'memory.available<100Mi,nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%' \
            --flannel-backend "$backend" --cluster-cidr "$cidr" >"$d/log" 2>&1 &
        NODE_PIDS+=($!)
        PIDS+=($!)
    done
    for i in 0 1; do
        wait_for "node-$i Ready" 120 sh -c "nsenter --net=/run/netns/$LAN $KUBECTL --kubeconfig $CFG get node node-$i -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
    done
    for p in c:node-0 s0:node-0 s1:node-1; do
        k "$CFG" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: ${p%%:*}, namespace: default}
spec:
  nodeName: ${p##*:}
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: docker.io/library/busybox:latest, imagePullPolicy: IfNotPresent, command: [sleep, "36000"]}
EOF
    done
    declare -A IP NS
    for p in c:node-0 s0:node-0 s1:node-1; do
        pod=${p%%:*}
        wait_for "$pod Running" 120 sh -c "nsenter --net=/run/netns/$LAN $KUBECTL --kubeconfig $CFG get pod $pod -o jsonpath='{.status.phase}' | grep -qx Running"
        IP[$pod]=$(k "$CFG" get pod "$pod" -o jsonpath='{.status.podIP}')
        NS[$pod]=$(pod_netns "$B/${p##*:}" "${IP[$pod]}")
    done
    for pod in s0 s1; do
        nsenter --net="${NS[$pod]}" iperf3 -s -D --pidfile "$WORK/iperf-$backend-$pod.pid"
    done
    sleep 1
    log "$backend: c (node-0) → s0 (node-0) ${IP[s0]}, → s1 (node-1) ${IP[s1]}"
    same=(); cross=()
    for r in $(seq "$RUNS"); do
        same+=("$(iperf "${NS[c]}" "${IP[s0]}")")
        cross+=("$(iperf "${NS[c]}" "${IP[s1]}")")
        log "$backend run $r: same node ${same[-1]} Gbit/s, across nodes ${cross[-1]} Gbit/s"
    done
    read -r same_avg same_max < <(rtt "${NS[c]}" "${IP[s0]}")
    read -r cross_avg cross_max < <(rtt "${NS[c]}" "${IP[s1]}")
    same_med=$(printf '%s\n' "${same[@]}" | median)
    cross_med=$(printf '%s\n' "${cross[@]}" | median)
    pct=$(awk -v a="$cross_med" -v b="$same_med" 'BEGIN {printf "%.0f", 100*a/b}')
    goal=$([ "$backend" = host-gw ] && echo 90 || echo 70)
    met=$([ "$pct" -ge "$goal" ] && echo met || echo "not met")
    mtu=$(nsenter --net="${NS[c]}" cat /sys/class/net/eth0/mtu)
    ROWS+=("| $backend | $same_med Gbit/s ($(IFS=/; echo "${same[*]}")) | $cross_med Gbit/s ($(IFS=/; echo "${cross[*]}")) | $pct % (goal $goal %, $met) | $same_avg / $same_max ms | $cross_avg / $cross_max ms | $mtu |")
    log "${ROWS[-1]}"

    # This backend's cluster goes before the next one starts.
    for f in "$WORK"/iperf-$backend-*.pid; do kill -TERM "$(cat "$f")" 2>/dev/null || true; done
    k "$CFG" delete pods --all --grace-period=1 --wait=true --timeout=60s >/dev/null || true
    for p in "${NODE_PIDS[@]}" "$CP_PID"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    unset IP NS
done

LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
BLOCK=$(cat <<EOF
Pod to pod on the runtime's default network (bridge, host-local from the node's podCIDR), one
client pod on node-0 against a server pod on node-0 (same node) and on node-1 (across nodes,
through the LAN bridge of the bench's namespace); nodes are network namespaces on one veth-based
LAN, so "the wire" is a veth pair and the figures show the cost of the pod network's own path
(routing, VXLAN encapsulation, nftables), not of a NIC. iperf3 TCP, one stream, ${SECS} s per run,
median of ${RUNS} runs (each run in brackets), runs alternating same node and across; ping -c 200
-i 0.01 (busybox) average / maximum. Release build, $(nproc) cores shared with other jobs, load
average $LOAD at the end. \`bash bench/podnet.sh\`, $(date -u +%Y-%m-%d).

| backend | same node | across nodes | across / same | rtt same node (avg / max) | rtt across (avg / max) | pod MTU |
| --- | --- | --- | --- | --- | --- | --- |
$(printf '%s\n' "${ROWS[@]}")
EOF
)
python3 - "$ROOT/docs/PERFORMANCE.md" "$BLOCK" <<'EOF'
import sys
path, block = sys.argv[1], sys.argv[2]
start, end = "<!-- bench:podnet:start -->", "<!-- bench:podnet:end -->"
text = open(path).read()
if start in text:
    head, rest = text.split(start, 1)
    text = head + start + "\n" + block + "\n" + end + rest.split(end, 1)[1]
else:
    text = text.rstrip("\n") + "\n\n## Pod network across nodes (`bash bench/podnet.sh`)\n\n" + start + "\n" + block + "\n" + end + "\n"
open(path, "w").write(text)
EOF
printf '%s\n' "${ROWS[@]}"
