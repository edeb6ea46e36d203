#!/usr/bin/env bash
# Cluster DNS: dnsperf against `nodus dns` serving a cluster of 1,000 Services (900
# ClusterIP, 100 headless with 3 ready endpoints each, in 50 namespaces) watched from a
# `nodus control-plane`, and against nsd serving the same records from a static zone on
# another port of 127.0.0.1 as the reference. The query set mixes A (ClusterIP and headless), SRV, PTR and
# NXDOMAIN names. Two runs per server: as fast as dnsperf can drive it (queries/s), then
# paced at 30,000 q/s with every query's latency recorded (p50/p99).
# Usage: bench/dns.sh [NODUS_BIN] (default: the release build, built first). Needs dnsperf
# and nsd (installed with apt-get when missing). Measures wall time: run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v dnsperf >/dev/null || ! command -v nsd >/dev/null; then
    apt-get update -qq && apt-get install -y -qq dnsperf nsd >/dev/null
fi
if [ $# -eq 0 ]; then
    cargo build --release --locked -p nodus --bin nodus
fi
BIN="$(realpath "${1:-target/release/nodus}")"
D="$(mktemp -d)"
API_PORT="${API_PORT:-16445}"
export DNS_PORT="${DNS_PORT:-5300}"
export NSD_PORT="${NSD_PORT:-5301}"
DURATION="${DURATION:-15}"
PACED_QPS="${PACED_QPS:-30000}"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ -n "${KEEP:-}" ]; then echo "kept $D" >&2; else rm -rf "$D"; fi
}
trap cleanup EXIT
KC="$D/cp/admin.kubeconfig"

"$BIN" control-plane --data-dir "$D/cp" --secure-port "$API_PORT" >"$D/cp.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 150); do
    kubectl --kubeconfig "$KC" get --raw /readyz >/dev/null 2>&1 && break
    sleep 0.2
done

echo "creating 1,000 services ..." >&2
python3 - "$D/objects.json" <<'PY'
import json, sys
items = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"ns-{n}"}} for n in range(50)]
for i in range(1000):
    ns = f"ns-{i % 50}"
    if i < 900:
        items.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc-{i}", "namespace": ns},
                      "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
        continue
    name = f"hl-{i}"
    items.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
                  "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 8080}]}})
    items.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                  "metadata": {"name": f"{name}-1", "namespace": ns,
                               "labels": {"kubernetes.io/service-name": name}},
                  "addressType": "IPv4",
                  "endpoints": [{"addresses": [f"10.244.{i - 900}.{k + 1}"], "hostname": f"pod-{k}",
                                 "conditions": {"ready": True}} for k in range(3)],
                  "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
json.dump({"apiVersion": "v1", "kind": "List", "items": items}, open(sys.argv[1], "w"))
PY
kubectl --kubeconfig "$KC" create -f "$D/objects.json" >/dev/null
kubectl --kubeconfig "$KC" get services -A -o json >"$D/services.json"

echo "nameserver 127.0.0.1:9" >"$D/resolv.conf"
"$BIN" dns --kubeconfig "$KC" --listen "127.0.0.1:$DNS_PORT" --resolv-conf "$D/resolv.conf" \
    >"$D/dns.log" 2>&1 &
DNS_PID=$!
PIDS+=($DNS_PID)

# The query set and the same records as a static zone for nsd.
python3 - "$D" <<'PY'
import json, sys
d = sys.argv[1]
svcs = json.load(open(f"{d}/services.json"))["items"]
Z = "cluster.local."
zone = [f"$ORIGIN {Z}", "$TTL 5",
        f"@ IN SOA ns.dns.{Z} hostmaster.{Z} 1 7200 1800 86400 5", f"@ IN NS ns.dns.{Z}",
        "ns.dns IN A 127.0.0.1", 'dns-version IN TXT "1.1.0"']
rev = ["$ORIGIN 10.in-addr.arpa.", "$TTL 5",
       f"@ IN SOA ns.dns.{Z} hostmaster.{Z} 1 7200 1800 86400 5", f"@ IN NS ns.dns.{Z}"]
queries = []
def ptr(ip, target):
    o = ip.split(".")
    rev.append(f"{o[3]}.{o[2]}.{o[1]} IN PTR {target}")
    queries.append(f"{o[3]}.{o[2]}.{o[1]}.10.in-addr.arpa PTR")
for s in svcs:
    ns, name = s["metadata"]["namespace"], s["metadata"]["name"]
    if not ns.startswith("ns-"):
        continue
    base = f"{name}.{ns}.svc"
    if name.startswith("svc-"):
        ip = s["spec"]["clusterIP"]
        zone += [f"{base} IN A {ip}", f"_http._tcp.{base} IN SRV 0 100 80 {base}.{Z}"]
        ptr(ip, f"{base}.{Z}")
        queries += [f"{base}.{Z} A"] * 6 + [f"_http._tcp.{base}.{Z} SRV", f"missing-{name}.{ns}.svc.{Z} A"]
    else:
        i = int(name.split("-")[1]) - 900
        for k in range(3):
            ip = f"10.244.{i}.{k + 1}"
            zone += [f"{base} IN A {ip}", f"pod-{k}.{base} IN A {ip}",
                     f"_http._tcp.{base} IN SRV 0 33 8080 pod-{k}.{base}.{Z}"]
            ptr(ip, f"pod-{k}.{base}.{Z}")
        queries += [f"{base}.{Z} A"] * 6 + [f"pod-1.{base}.{Z} A", f"_http._tcp.{base}.{Z} SRV"]
open(f"{d}/cluster.local.zone", "w").write("\n".join(zone) + "\n")
open(f"{d}/10.in-addr.arpa.zone", "w").write("\n".join(rev) + "\n")
import random
random.Random(1).shuffle(queries)
def kind(q):
    name, t = q.split()
    if name.startswith("missing-"): return "NXDOMAIN"
    if t != "A": return t
    return "A of an endpoint hostname" if name.startswith("pod-") else "A of a service"
counts = {}
for q in queries:
    counts[kind(q)] = counts.get(kind(q), 0) + 1
open(f"{d}/mix.txt", "w").write(f"{len(queries)} names: " + ", ".join(
    f"{100 * n / len(queries):.0f} % {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])))
open(f"{d}/queries.txt", "w").write("\n".join(queries) + "\n")
open(f"{d}/nsd.conf", "w").write(f"""server:
    ip-address: 127.0.0.1@{__import__('os').environ['NSD_PORT']}
    server-count: 2
    reuseport: yes
    username: ""
    chroot: ""
    zonesdir: "{d}"
    pidfile: "{d}/nsd.pid"
    xfrdfile: "{d}/xfrd.state"
    zonelistfile: "{d}/zone.list"
    database: ""
    logfile: "{d}/nsd.log"
    verbosity: 0
    # Response rate limiting (on by default, 200/s per source block) would drop most of
    # a benchmark's queries.
    rrl-ratelimit: 0
    rrl-whitelist-ratelimit: 0
remote-control:
    control-enable: no
zone:
    name: cluster.local
    zonefile: cluster.local.zone
zone:
    name: 10.in-addr.arpa
    zonefile: 10.in-addr.arpa.zone
""")
PY
nsd -d -c "$D/nsd.conf" >"$D/nsd.out" 2>&1 &
NSD_PID=$!
PIDS+=($NSD_PID)

LAST="$(tail -n 1 "$D/queries.txt" | cut -d' ' -f1)"
for port in "$DNS_PORT" "$NSD_PORT"; do
    ok=""
    for _ in $(seq 150); do
        if busybox nslookup svc-899.ns-49.svc.cluster.local "127.0.0.1:$port" 2>/dev/null | grep -q '^Address: 10\.'; then
            ok=1
            break
        fi
        sleep 0.2
    done
    [ -n "$ok" ] || { echo "127.0.0.1:$port does not answer" >&2; cat "$D/dns.log" "$D/nsd.out" >&2; exit 1; }
done
echo "query set: $(wc -l <"$D/queries.txt") names (last: $LAST)" >&2

# dnsperf's summary → "qps avg_ms lost"
run_max() {
    dnsperf -s 127.0.0.1 -p "$1" -d "$D/queries.txt" -l "$DURATION" -c 4 -q 200 -t 2 2>&1 | tee "$D/dnsperf-$1.log" |
        awk '/Queries per second:/ {q=$4} /Average Latency/ {a=$4*1000} /Queries lost:/ {l=$3} END {printf "%.0f %.3f %s\n", q, a, l}'
}
# Paced run, every query's latency → "p50_ms p99_ms qps"
run_paced() {
    dnsperf -s 127.0.0.1 -p "$1" -d "$D/queries.txt" -l "$DURATION" -c 4 -q 500 -t 2 -Q "$PACED_QPS" -v 2>/dev/null >"$D/paced-$1.log" || true
    awk '$1 == ">" {print $NF}' "$D/paced-$1.log" | sort -g >"$D/lat-$1"
    local n q
    n=$(wc -l <"$D/lat-$1")
    q=$(awk '/Queries per second:/ {print $4}' "$D/paced-$1.log")
    awk -v n="$n" -v q="$q" 'NR == int(n*0.5) {p50=$1*1000} NR == int(n*0.99) {p99=$1*1000} END {printf "%.3f %.3f %.0f\n", p50, p99, q}' "$D/lat-$1"
}

descendants() {
    local c
    for c in $(pgrep -P "$1" || true); do
        echo "$c"
        descendants "$c"
    done
}
# CPU ticks (user, system) of a process and its descendants (nsd's servers are
# grandchildren): "utime stime".
ticks() {
    local u=0 s=0 p
    for p in "$1" $(descendants "$1"); do
        # Fields after the command name, which may hold spaces ("nsd: main").
        read -r pu ps < <(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12, $13}')
        u=$((u + pu)); s=$((s + ps))
    done
    echo "$u $s"
}
# CPU µs per answered query during a paced run, user / system: "user_us sys_us"
per_query() {
    local hz
    hz=$(getconf CLK_TCK)
    awk -v u0="$2" -v s0="$3" -v u1="$4" -v s1="$5" -v q="$6" -v d="$DURATION" -v hz="$hz" \
        'BEGIN {n = q * d; printf "%.1f %.1f\n", (u1 - u0) / hz * 1e6 / n, (s1 - s0) / hz * 1e6 / n}'
}

read -r N_QPS N_AVG N_LOST < <(run_max "$DNS_PORT")
read -r R_QPS R_AVG R_LOST < <(run_max "$NSD_PORT")
read -r U0 S0 < <(ticks "$DNS_PID")
read -r N_P50 N_P99 N_PQ < <(run_paced "$DNS_PORT")
read -r U1 S1 < <(ticks "$DNS_PID")
read -r N_CPU_U N_CPU_S < <(per_query "" "$U0" "$S0" "$U1" "$S1" "$N_PQ")
read -r U0 S0 < <(ticks "$NSD_PID")
read -r R_P50 R_P99 R_PQ < <(run_paced "$NSD_PORT")
read -r U1 S1 < <(ticks "$NSD_PID")
read -r R_CPU_U R_CPU_S < <(per_query "" "$U0" "$S0" "$U1" "$S1" "$R_PQ")
N_RSS=$(awk '/VmRSS/ {printf "%d", $2/1024}' "/proc/$DNS_PID/status")
NPROC=$(nproc)

TABLE="$(cat <<EOF
<!-- bench:dns:start -->
Command: \`bash bench/dns.sh\` (release build; dnsperf $(dnsperf -h 2>&1 | awk '/^Version/ {print $2}'), nsd $(nsd -v 2>&1 | awk 'NR==1 {print $3}'); $NPROC cores shared by dnsperf and the server; $(cat "$D/mix.txt")).

| server | max queries/s (lost) | avg latency at max | p50 / p99 latency at ${PACED_QPS} q/s offered (achieved) | server CPU per query at ${PACED_QPS} q/s, user + system |
| --- | --- | --- | --- | --- |
| \`nodus dns\`, 1,000 Services + 100 EndpointSlices by watch | ${N_QPS} (${N_LOST}) | ${N_AVG} ms | ${N_P50} / ${N_P99} ms (${N_PQ} q/s) | ${N_CPU_U} + ${N_CPU_S} µs |
| nsd, the same records from a static zone | ${R_QPS} (${R_LOST}) | ${R_AVG} ms | ${R_P50} / ${R_P99} ms (${R_PQ} q/s) | ${R_CPU_U} + ${R_CPU_S} µs |

\`nodus dns\` RSS after the runs: ${N_RSS} MiB.
<!-- bench:dns:end -->
EOF
)"
echo "$TABLE"
if [ "${WRITE:-1}" = 1 ]; then
    python3 - docs/PERFORMANCE.md "$TABLE" <<'PY'
import re, sys
path, table = sys.argv[1], sys.argv[2]
text = open(path).read()
pat = re.compile(r"<!-- bench:dns:start -->.*?<!-- bench:dns:end -->", re.S)
if pat.search(text):
    text = pat.sub(lambda _: table, text)
else:
    text = text.rstrip("\n") + "\n\n## Cluster DNS\n\n" + table + "\n"
open(path, "w").write(text)
PY
fi
