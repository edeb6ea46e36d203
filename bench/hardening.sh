#!/usr/bin/env bash
# The API server under the attacker probe's load (issue "Identity and access", part 6):
# RSS and store.redb size before/after 3,000 updates of a 100 KB ConfigMap, and /readyz
# latency (a new TLS connection per request) with 10,000 idle sockets open vs none.
# Usage: bench/hardening.sh [NODUS_BIN] (default: the release build, built first). Measures
# wall time and memory: run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
    cargo build --release --locked -p nodus --bin nodus
fi
BIN="${1:-target/release/nodus}"
D="$(mktemp -d)"
PORT="${PORT:-16443}"
"$BIN" control-plane --data-dir "$D" --secure-port "$PORT" >"$D/log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$D"' EXIT
for _ in $(seq 100); do
    kubectl --kubeconfig "$D/admin.kubeconfig" get --raw /readyz >/dev/null 2>&1 && break
    sleep 0.2
done
python3 - "$D" "$PORT" "$PID" <<'PY'
import base64, http.client, json, resource, socket, ssl, statistics, sys, time, yaml
d, port, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kc = yaml.safe_load(open(f"{d}/admin.kubeconfig"))
u = kc["users"][0]["user"]
for name, key in (("c.crt", "client-certificate-data"), ("c.key", "client-key-data")):
    open(f"{d}/{name}", "wb").write(base64.b64decode(u[key]))
ctx = ssl.create_default_context(cafile=f"{d}/pki/ca.crt")
ctx.load_cert_chain(f"{d}/c.crt", f"{d}/c.key")
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1]) // 1024
def size():
    import os
    return os.path.getsize(f"{d}/store.redb") // (1 << 20)
def req(conn, method, path, body=None):
    conn.request(method, path, body=body and json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse(); data = r.read()
    assert r.status < 300, (r.status, data[:300])
    return data
conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx)
blob = "0123456789abcdef" * (100 * 1024 // 16)
path = "/api/v1/namespaces/default/configmaps"
req(conn, "POST", path, {"metadata": {"name": "big"}, "data": {"blob": "start"}})
before = (rss(), size())
t = time.time()
marks = []
for i in range(3000):
    req(conn, "PUT", path + "/big", {"metadata": {"name": "big"}, "data": {"blob": f"{i}{blob}"}})
    if (i + 1) % 1000 == 0:
        marks.append(f"{rss()} MiB / {size()} MiB after {i + 1}")
took = time.time() - t
after = (rss(), size())
print(f"3000 x 100 KB updates in {took:.1f} s: RSS {before[0]} MiB -> {after[0]} MiB, store.redb {before[1]} MiB -> {after[1]} MiB (RSS / store.redb: {'; '.join(marks)})")
def fds():
    import os
    return len(os.listdir(f"/proc/{pid}/fd"))
def readyz_ms(n=50):
    out = []
    for _ in range(n):
        t = time.time()
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=60)
        req(c, "GET", "/readyz"); c.close()
        out.append((time.time() - t) * 1000)
    out.sort()
    return statistics.median(out), out[int(len(out) * 0.99) - 1]
m0 = readyz_ms()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(10000)]
m1 = readyz_ms()
held = fds()
print(f"/readyz median/p99: {m0[0]:.1f}/{m0[1]:.1f} ms with no idle sockets, {m1[0]:.1f}/{m1[1]:.1f} ms with 10000 idle sockets open; RSS {rss()} MiB")
# The 10 s TLS handshake timeout closes the idle ones (the client keeps its ends open).
time.sleep(12)
print(f"server descriptors: {held} with the 10000 idle sockets open, {fds()} 12 s later")
PY
