//! Pod networking across nodes, end to end: `nodus control-plane` allocating pod CIDRs and
//! real `nodus node`s, each in a network namespace of its own, whose pods use the
//! runtime's default network (no conflist written by the test) from the node's podCIDR.
//!
//! host-gw: the nodes share one LAN (a bridge inside a namespace the test creates). A pod
//! on one node fetches a CGI page from a pod on the other, which answers with its name and
//! the client's address: the client's pod IP, not its node's. A ClusterIP Service with an
//! endpoint on each node answers from both endpoints when called from each node. A third
//! node joins later and is reachable; once it is deleted (`kubectl delete node`) its route
//! is gone from the others. A Node whose pod CIDR overlaps an older node's gets a Warning
//! Event and no route.
//!
//! vxlan: two nodes on different subnets behind a router namespace (host-gw cannot work
//! there), pod to pod both ways over `nodus.1`, the VTEP MACs published in flannel's
//! annotations.

mod common;

use common::cluster::{self, ControlPlane, NodeOptions, NodeProcess};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::Netns;

const T: Duration = Duration::from_secs(120);

/// A busybox httpd whose `/cgi-bin/who` prints the pod's name and the caller's address.
fn who_pod(name: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
  labels: {{app: who}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command:
    - sh
    - -c
    - |
      mkdir -p /www/cgi-bin
      cat > /www/cgi-bin/who <<'EOF'
      #!/bin/sh
      echo "Content-Type: text/plain"
      echo
      echo "$(hostname) $REMOTE_ADDR"
      EOF
      chmod +x /www/cgi-bin/who
      exec httpd -f -p 8080 -h /www
"#
    )
}

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata:
  name: who
  namespace: default
spec:
  selector: {app: who}
  ports:
  - {port: 80, targetPort: 8080}
";

fn run_ok(ns: &Netns, args: &[&str]) {
    let out = ns.run("ip", args).expect("ip");
    assert!(
        out.status.success(),
        "ip {args:?} in {}: {}",
        ns.name(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Puts `node` on `lan`'s bridge `br0` as `ip`/24 with its default route via `gw`.
fn join_lan(lan: &Netns, port: &str, node: &Netns, ip: &str, gw: &str) {
    run_ok(
        lan,
        &[
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            node.name(),
        ],
    );
    run_ok(lan, &["link", "set", port, "master", "br0", "up"]);
    run_ok(node, &["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
    run_ok(node, &["link", "set", "eth0", "up"]);
    run_ok(node, &["route", "add", "default", "via", gw, "dev", "eth0"]);
}

/// The pod's IP once it is Running.
fn pod_ip(cp: &ControlPlane, name: &str, logs: &dyn Fn() -> String) -> String {
    let p = cp.wait_json(&["pod", name], T, &format!("{name} Running"), logs, |p| {
        p["status"]["phase"] == "Running" && p["status"]["podIP"].is_string()
    });
    p["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `GET url` from inside pod `from` (busybox wget), retried until it answers: the body.
fn fetch_from_pod(cp: &ControlPlane, from: &str, url: &str, logs: &dyn Fn() -> String) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (ok, out, err) =
            cp.kubectl(&["exec", from, "--", "timeout", "10", "wget", "-qO-", url]);
        if ok && !out.trim().is_empty() {
            return normalize(&out);
        }
        if Instant::now() > deadline {
            panic!("{from} → {url}: {out}{err}\n{}", logs());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `nslookup args…` from inside pod `from` (busybox, resolv.conf's nameserver: the kube-dns
/// ClusterIP), retried until its output contains `want`; the output.
fn nslookup_from(
    cp: &ControlPlane,
    from: &str,
    args: &[&str],
    want: &str,
    logs: &dyn Fn() -> String,
) -> String {
    let mut cmd = vec!["timeout", "10", "nslookup"];
    cmd.extend_from_slice(args);
    exec_until(cp, from, &cmd, want, logs)
}

/// `cmd` in pod `from`, retried until its output contains `want`; the output.
fn exec_until(
    cp: &ControlPlane,
    from: &str,
    cmd: &[&str],
    want: &str,
    logs: &dyn Fn() -> String,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut all = vec!["exec", from, "--"];
    all.extend_from_slice(cmd);
    loop {
        let (_, out, err) = cp.kubectl(&all);
        if out.contains(want) {
            return out;
        }
        if Instant::now() > deadline {
            panic!(
                "{from}: {cmd:?} never showed {want:?}: {out}{err}\n{}",
                logs()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A busybox pod on `node` with the host's glibc `getent` mounted in, to resolve as glibc
/// programs do (resolv.conf's search list and ndots, NSS).
fn getent_pod(name: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  volumes:
  - {{name: getent, hostPath: {{path: /usr/bin/getent, type: File}}}}
  - {{name: libs, hostPath: {{path: /usr/lib/x86_64-linux-gnu, type: Directory}}}}
  - {{name: lib64, hostPath: {{path: /usr/lib64, type: Directory}}}}
  containers:
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: [sleep, '3600']
    volumeMounts:
    - {{name: getent, mountPath: /usr/bin/getent, readOnly: true}}
    - {{name: libs, mountPath: /lib/x86_64-linux-gnu, readOnly: true}}
    - {{name: lib64, mountPath: /lib64, readOnly: true}}
"#
    )
}

const NODE_PORT: &str = "apiVersion: v1
kind: Service
metadata:
  name: who-nodeport
  namespace: default
spec:
  type: NodePort
  selector: {app: who}
  ports:
  - {port: 80, targetPort: 8080, nodePort: 30080}
";

const DNS_OBJECTS: &str = "apiVersion: v1
kind: Service
metadata:
  name: who-headless
  namespace: default
spec:
  clusterIP: None
  selector: {app: who}
  ports:
  - {name: http, port: 8080}
---
apiVersion: v1
kind: Service
metadata:
  name: outside
  namespace: default
spec:
  type: ExternalName
  externalName: who.default.svc.cluster.local
";

/// The CGI page's `<pod> <caller>` with busybox httpd's IPv4-mapped form of the caller
/// (`[::ffff:10.77.0.2]`) written as the IPv4 address.
fn normalize(body: &str) -> String {
    body.trim().replace("[::ffff:", "").replace(']', "")
}

/// `GET url` from a node's namespace with the host's busybox: the body, if any.
fn fetch_from_node(ns: &Netns, url: &str) -> Option<String> {
    let out = ns
        .run("timeout", &["10", "busybox", "wget", "-qO-", url])
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The destinations of the node's nodus routes (`ip route show proto 151`).
fn nodus_routes(ns: &Netns) -> Vec<String> {
    let out = ns
        .run("ip", &["-4", "route", "show", "proto", "151"])
        .expect("ip route");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn wait_until(what: &str, logs: &dyn Fn() -> String, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        if Instant::now() > deadline {
            panic!("{what}: not within {T:?}\n{}", logs());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn pod_cidr(cp: &ControlPlane, node: &str, logs: &dyn Fn() -> String) -> String {
    let n = cp.wait_json(
        &["node", node],
        T,
        &format!("{node} Ready with a podCIDR"),
        logs,
        |n| {
            n["spec"]["podCIDR"].is_string()
                && cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True")
        },
    );
    n["spec"]["podCIDR"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// nsd (Debian's package) in `lan` on `10.253.0.1:53`, the upstream resolver the nodes'
/// resolv.conf names: it serves `outside.example.test` (192.0.2.7), a name outside the
/// cluster that the nodes' DNS must forward.
fn upstream_resolver(lan: &Arc<Netns>, dir: &std::path::Path) -> testkit::daemon::Daemon {
    std::fs::write(
        dir.join("example.test.zone"),
        "$ORIGIN example.test.\n$TTL 60\n@ IN SOA ns hostmaster 1 3600 600 86400 60\n@ IN NS ns\nns IN A 10.253.0.1\noutside IN A 192.0.2.7\n",
    )
    .expect("zone");
    let d = dir.display();
    std::fs::write(
        dir.join("nsd.conf"),
        format!(
            "server:\n  ip-address: 10.253.0.1@53\n  username: \"\"\n  chroot: \"\"\n  zonesdir: \"{d}\"\n  pidfile: \"{d}/nsd.pid\"\n  xfrdfile: \"{d}/xfrd.state\"\n  zonelistfile: \"{d}/zone.list\"\n  database: \"\"\n  logfile: \"{d}/nsd.log\"\nremote-control:\n  control-enable: no\nzone:\n  name: example.test\n  zonefile: example.test.zone\n"
        ),
    )
    .expect("nsd.conf");
    let mut cmd = lan
        .command("nsd")
        .expect("nsd in the LAN namespace (Debian's nsd package)");
    cmd.arg("-d").arg("-c").arg(dir.join("nsd.conf"));
    testkit::daemon::Daemon::spawn("nsd", cmd, &dir.join("nsd.out"), Duration::from_secs(5))
        .expect("spawn nsd")
}

const HOST_GW: NodeOptions<'static> = NodeOptions {
    subnet: None,
    extra: &[
        "--flannel-backend",
        "host-gw",
        "--cluster-cidr",
        "10.77.0.0/16",
    ],
};

#[test]
fn host_gw_pods_reach_pods_on_other_nodes_with_their_own_address() {
    if !common::have_root() {
        return;
    }
    let lan = Arc::new(Netns::new("nodus-pn-lan").expect("netns"));
    run_ok(&lan, &["link", "add", "br0", "type", "bridge"]);
    run_ok(&lan, &["addr", "add", "10.253.0.1/24", "dev", "br0"]);
    run_ok(&lan, &["link", "set", "br0", "up"]);
    let names = ["node-a", "node-b", "node-c"];
    let ips = ["10.253.0.11", "10.253.0.12", "10.253.0.13"];
    let node_ns: Vec<Arc<Netns>> = names
        .iter()
        .map(|n| Arc::new(Netns::new(&format!("nodus-pn-{}", &n[5..])).expect("netns")))
        .collect();
    for (i, ns) in node_ns.iter().enumerate() {
        join_lan(&lan, &format!("port{i}"), ns, ips[i], "10.253.0.1");
    }
    let cgroups: Vec<testkit::CgroupParent> = names
        .iter()
        .map(|n| {
            let c = testkit::CgroupParent::new(&format!("nodus-pn-{n}"));
            c.create();
            c
        })
        .collect();
    let cp = ControlPlane::start_bound(
        lan.clone(),
        "10.253.0.1".parse().expect("ip"),
        &["--allocate-node-cidrs", "--cluster-cidr", "10.77.0.0/16"],
    );
    // The nodes' resolv.conf names the LAN's resolver, as a host's names its network's.
    let upstream_dir = tempfile::tempdir().expect("tempdir");
    let _upstream = upstream_resolver(&lan, upstream_dir.path());
    let resolv = upstream_dir.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 10.253.0.1\n").expect("resolv.conf");
    let resolv = resolv.display().to_string();
    let extra: Vec<&str> = HOST_GW
        .extra
        .iter()
        .copied()
        .chain(["--resolv-conf", resolv.as_str()])
        .collect();
    let host_gw = NodeOptions {
        subnet: None,
        extra: &extra,
    };
    let mut nodes: Vec<NodeProcess> = (0..2)
        .map(|i| NodeProcess::start_opts(&node_ns[i], &cp, names[i], &cgroups[i].path(), &host_gw))
        .collect();
    let logs_of = |nodes: &[NodeProcess]| {
        nodes
            .iter()
            .zip(names)
            .map(|(n, name)| format!("{name} log:\n{}\n", n.log()))
            .collect::<String>()
    };
    let cidr_a = pod_cidr(&cp, "node-a", &|| logs_of(&nodes));
    let cidr_b = pod_cidr(&cp, "node-b", &|| logs_of(&nodes));
    assert_ne!(cidr_a, cidr_b);

    // Each node routes the other's pod CIDR via its InternalIP, marked as nodus's.
    wait_until(
        "routes to each other's pod CIDR",
        &|| logs_of(&nodes),
        || {
            nodus_routes(&node_ns[0])
                .iter()
                .any(|r| r.starts_with(&format!("{cidr_b} via 10.253.0.12")))
                && nodus_routes(&node_ns[1])
                    .iter()
                    .any(|r| r.starts_with(&format!("{cidr_a} via 10.253.0.11")))
        },
    );

    // Pod to pod across nodes, both ways; the server sees the client's pod IP.
    cp.apply(&who_pod("who-a", "node-a"));
    cp.apply(&who_pod("who-b", "node-b"));
    let logs = || logs_of(&nodes);
    let ip_a = pod_ip(&cp, "who-a", &logs);
    let ip_b = pod_ip(&cp, "who-b", &logs);
    let net = |cidr: &str| {
        cidr.rsplit_once('.')
            .map(|(p, _)| p.to_string())
            .unwrap_or_default()
    };
    assert!(ip_a.starts_with(&net(&cidr_a)), "{ip_a} in {cidr_a}");
    assert!(ip_b.starts_with(&net(&cidr_b)), "{ip_b} in {cidr_b}");
    assert_eq!(
        fetch_from_pod(
            &cp,
            "who-a",
            &format!("http://{ip_b}:8080/cgi-bin/who"),
            &logs
        ),
        format!("who-b {ip_a}")
    );
    assert_eq!(
        fetch_from_pod(
            &cp,
            "who-b",
            &format!("http://{ip_a}:8080/cgi-bin/who"),
            &logs
        ),
        format!("who-a {ip_b}")
    );
    // Traffic leaving the pod network is still masqueraded (to the node's address).
    let out = node_ns[0]
        .run("nft", &["list", "table", "ip", "nodus-podnet"])
        .expect("nft");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("masquerade"), "{table}");

    // A ClusterIP Service with an endpoint on each node answers from both, from each node.
    cp.apply(SERVICE);
    let svc = cp.wait_json(&["svc", "who"], T, "who has a ClusterIP", &logs, |s| {
        s["spec"]["clusterIP"].is_string()
    });
    let vip = svc["spec"]["clusterIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for (i, ns) in node_ns[..2].iter().enumerate() {
        let mut seen = std::collections::BTreeSet::new();
        wait_until(
            &format!("{} reaches both endpoints of {vip}", names[i]),
            &logs,
            || {
                if let Some(body) = fetch_from_node(ns, &format!("http://{vip}/cgi-bin/who"))
                    && let Some(pod) = body.split_whitespace().next()
                {
                    seen.insert(pod.to_string());
                }
                seen.len() == 2
            },
        );
        assert_eq!(seen, ["who-a".to_string(), "who-b".to_string()].into());
    }

    // Cluster DNS, served by every node behind kube-dns: from a pod on each node, the
    // Service's name (full, and through the resolv.conf search path), the headless Service's
    // endpoints, its SRV record, the pod name form and an ExternalName's CNAME.
    cp.apply(DNS_OBJECTS);
    let dashed = |ip: &str| ip.replace('.', "-");
    for pod in ["who-a", "who-b"] {
        nslookup_from(&cp, pod, &["who.default.svc.cluster.local"], &vip, &logs);
        nslookup_from(&cp, pod, &["who"], &vip, &logs);
        let headless = nslookup_from(
            &cp,
            pod,
            &["who-headless.default.svc.cluster.local"],
            &ip_a,
            &logs,
        );
        assert!(headless.contains(&ip_b), "{headless}");
        nslookup_from(
            &cp,
            pod,
            &[
                "-type=SRV",
                "_http._tcp.who-headless.default.svc.cluster.local",
            ],
            &format!(
                "8080 {}.who-headless.default.svc.cluster.local",
                dashed(&ip_b)
            ),
            &logs,
        );
        nslookup_from(
            &cp,
            pod,
            &[&format!("{}.default.pod.cluster.local", dashed(&ip_a))],
            &ip_a,
            &logs,
        );
        nslookup_from(
            &cp,
            pod,
            &["outside.default.svc.cluster.local"],
            "who.default.svc.cluster.local",
            &logs,
        );
    }
    let kube_dns = |cp: &ControlPlane| -> Vec<String> {
        let v = cp
            .get_json(&[
                "endpointslices",
                "-n",
                "kube-system",
                "-l",
                "kubernetes.io/service-name=kube-dns",
            ])
            .unwrap_or_default();
        let mut nodes: Vec<String> = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .filter(|e| e["conditions"]["ready"] == true)
            .filter_map(|e| e["nodeName"].as_str().map(str::to_string))
            .collect();
        nodes.sort();
        nodes
    };
    // A name outside the cluster is forwarded to the nodes' upstream (nsd on the LAN).
    for pod in ["who-a", "who-b"] {
        nslookup_from(&cp, pod, &["outside.example.test"], "192.0.2.7", &logs);
    }
    // glibc's resolver (getent, the host's, mounted into a pod on each node): full names,
    // the search path, a forwarded name.
    for (pod, node) in [("getent-a", "node-a"), ("getent-b", "node-b")] {
        cp.apply(&getent_pod(pod, node));
        pod_ip(&cp, pod, &logs);
        for (name, want) in [
            ("who.default.svc.cluster.local", vip.as_str()),
            ("who", vip.as_str()),
            ("who-headless", "10.77."), // an endpoint's pod IP, not a ClusterIP
            ("outside.example.test", "192.0.2.7"),
        ] {
            exec_until(&cp, pod, &["getent", "hosts", name], want, &logs);
        }
    }
    // A NodePort Service answers on each node's address, from outside every node.
    cp.apply(NODE_PORT);
    for ip in &ips[..2] {
        wait_until(&format!("NodePort 30080 on {ip}"), &logs, || {
            fetch_from_node(&lan, &format!("http://{ip}:30080/cgi-bin/who"))
                .is_some_and(|b| b.starts_with("who-"))
        });
    }
    wait_until("both nodes serve kube-dns", &logs, || {
        kube_dns(&cp) == ["node-a", "node-b"]
    });

    // A third node joins later and is reachable from both.
    nodes.push(NodeProcess::start_opts(
        &node_ns[2],
        &cp,
        "node-c",
        &cgroups[2].path(),
        &host_gw,
    ));
    let logs = || logs_of(&nodes);
    let cidr_c = pod_cidr(&cp, "node-c", &logs);
    cp.apply(&who_pod("who-c", "node-c"));
    let ip_c = pod_ip(&cp, "who-c", &logs);
    assert_eq!(
        fetch_from_pod(
            &cp,
            "who-a",
            &format!("http://{ip_c}:8080/cgi-bin/who"),
            &logs
        ),
        format!("who-c {ip_a}")
    );
    assert_eq!(
        fetch_from_pod(
            &cp,
            "who-c",
            &format!("http://{ip_b}:8080/cgi-bin/who"),
            &logs
        ),
        format!("who-b {ip_c}")
    );
    for ns in &node_ns[..2] {
        assert!(
            nodus_routes(ns)
                .iter()
                .any(|r| r.starts_with(&format!("{cidr_c} via 10.253.0.13"))),
            "{:?}",
            nodus_routes(ns)
        );
    }

    wait_until("node-c serves kube-dns too", &logs, || {
        kube_dns(&cp) == ["node-a", "node-b", "node-c"]
    });
    nslookup_from(
        &cp,
        "who-c",
        &["who.default.svc.cluster.local"],
        &vip,
        &logs,
    );

    // A Node claiming node-b's pod CIDR (created later) gets a Warning and no route.
    cp.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: impostor\nspec:\n  podCIDR: {cidr_b}\n  podCIDRs: [{cidr_b}]\n"
    ));
    let (ok, out, err) = cp.kubectl(&[
        "patch",
        "node",
        "impostor",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"addresses":[{"type":"InternalIP","address":"10.253.0.99"}]}}"#,
    ]);
    assert!(ok, "{out}{err}");
    wait_until(
        "a Warning about impostor's overlapping pod CIDR",
        &logs,
        || {
            cluster::events_for(&cp, "default", "impostor")
                .iter()
                .any(|(reason, msg)| {
                    reason == "CIDRNotAvailable"
                        && msg.contains(&format!("overlaps pod CIDR {cidr_b} of node node-b"))
                })
        },
    );
    for ns in &node_ns {
        let routes = nodus_routes(ns);
        assert!(
            !routes.iter().any(|r| r.contains("10.253.0.99")),
            "{routes:?}"
        );
    }
    assert_eq!(
        fetch_from_pod(
            &cp,
            "who-a",
            &format!("http://{ip_b}:8080/cgi-bin/who"),
            &logs
        ),
        format!("who-b {ip_a}")
    );
    let (ok, out, err) = cp.kubectl(&["delete", "node", "impostor"]);
    assert!(ok, "{out}{err}");

    // node-c leaves: its process dies and its Node is deleted; its route goes.
    nodes[2].kill();
    let (ok, out, err) = cp.kubectl(&["delete", "node", "node-c"]);
    assert!(ok, "{out}{err}");
    wait_until(
        "node-c's route removed from node-a and node-b",
        &logs,
        || {
            node_ns[..2]
                .iter()
                .all(|ns| !nodus_routes(ns).iter().any(|r| r.starts_with(&cidr_c)))
        },
    );
    // DNS goes on without it: node-c's kube-dns endpoint went with its Node.
    wait_until("kube-dns without node-c", &logs, || {
        kube_dns(&cp) == ["node-a", "node-b"]
    });
    for pod in ["who-a", "who-b"] {
        nslookup_from(&cp, pod, &["who.default.svc.cluster.local"], &vip, &logs);
    }
    // The others' routes stay.
    assert!(
        nodus_routes(&node_ns[0])
            .iter()
            .any(|r| r.starts_with(&cidr_b))
    );

    drop(nodes);
    drop(cp);
    drop(cgroups);
}

#[test]
fn vxlan_pods_reach_pods_on_a_node_behind_a_router() {
    if !common::have_root() {
        return;
    }
    // The router (and the control plane) in one namespace, each node on a subnet of its own.
    let router = Arc::new(Netns::new("nodus-pn-rt").expect("netns"));
    let node_ns: Vec<Arc<Netns>> = ["nodus-pn-vxa", "nodus-pn-vxb"]
        .iter()
        .map(|n| Arc::new(Netns::new(n).expect("netns")))
        .collect();
    let links = [
        ("peer-a", "10.252.11.1", "10.252.11.2"),
        ("peer-b", "10.252.12.1", "10.252.12.2"),
    ];
    for ((r_if, r_ip, n_ip), ns) in links.iter().zip(&node_ns) {
        cluster::link_namespaces_via(&router, r_if, r_ip, ns, n_ip);
    }
    let out = router
        .run("sysctl", &["-w", "net.ipv4.ip_forward=1"])
        .expect("sysctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cgroups: Vec<testkit::CgroupParent> = ["nodus-pn-vxa", "nodus-pn-vxb"]
        .iter()
        .map(|n| {
            let c = testkit::CgroupParent::new(n);
            c.create();
            c
        })
        .collect();
    let cp = ControlPlane::start_bound(
        router.clone(),
        links[0].1.parse().expect("ip"),
        &["--allocate-node-cidrs", "--cluster-cidr", "10.78.0.0/16"],
    );
    let opts = NodeOptions {
        subnet: None,
        extra: &[
            "--flannel-backend",
            "vxlan",
            "--cluster-cidr",
            "10.78.0.0/16",
        ],
    };
    let nodes: Vec<NodeProcess> = ["node-a", "node-b"]
        .iter()
        .zip(&node_ns)
        .zip(&cgroups)
        .map(|((name, ns), cg)| NodeProcess::start_opts(ns, &cp, name, &cg.path(), &opts))
        .collect();
    let logs = || {
        format!(
            "node-a log:\n{}\nnode-b log:\n{}",
            nodes[0].log(),
            nodes[1].log()
        )
    };
    for (name, (_, _, ip)) in ["node-a", "node-b"].iter().zip(links) {
        let n = cp.wait_json(
            &["node", name],
            T,
            &format!("{name} publishes its VTEP"),
            &logs,
            |n| n["metadata"]["annotations"]["flannel.alpha.coreos.com/backend-type"] == "vxlan",
        );
        let ann = &n["metadata"]["annotations"];
        assert_eq!(ann["flannel.alpha.coreos.com/public-ip"], ip, "{n}");
        let data: Value = serde_json::from_str(
            ann["flannel.alpha.coreos.com/backend-data"]
                .as_str()
                .unwrap_or("{}"),
        )
        .expect("backend-data is JSON");
        assert_eq!(data["VNI"], 1, "{data}");
        let mac = data["VtepMAC"].as_str().unwrap_or_default().to_string();
        assert_eq!(mac.len(), 17, "{data}");
    }
    let cidr_a = pod_cidr(&cp, "node-a", &logs);
    let cidr_b = pod_cidr(&cp, "node-b", &logs);
    // The device: VNI 1, port 8472, local VTEP on the InternalIP, <podCIDR>.0/32, MTU − 50.
    let out = node_ns[0]
        .run("ip", &["-d", "addr", "show", "dev", "nodus.1"])
        .expect("ip");
    let dev = String::from_utf8_lossy(&out.stdout);
    let vtep_a = cidr_a.replace("/24", "/32");
    for want in [
        "vxlan id 1",
        "local 10.252.11.2",
        "dstport 8472",
        "mtu 1450",
        &vtep_a,
    ] {
        assert!(dev.contains(want), "{want} in {dev}");
    }

    cp.apply(&who_pod("who-a", "node-a"));
    cp.apply(&who_pod("who-b", "node-b"));
    let ip_a = pod_ip(&cp, "who-a", &logs);
    let ip_b = pod_ip(&cp, "who-b", &logs);
    assert_eq!(
        fetch_from_pod(
            &cp,
            "who-a",
            &format!("http://{ip_b}:8080/cgi-bin/who"),
            &logs
        ),
        format!("who-b {ip_a}")
    );
    assert_eq!(
        fetch_from_pod(
            &cp,
            "who-b",
            &format!("http://{ip_a}:8080/cgi-bin/who"),
            &logs
        ),
        format!("who-a {ip_b}")
    );
    // The route to the other node's pods goes over the VXLAN device.
    let routes = nodus_routes(&node_ns[0]);
    let vtep_b = cidr_b.replace(".0/24", ".0");
    assert!(
        routes
            .iter()
            .any(|r| r.starts_with(&format!("{cidr_b} via {vtep_b} dev nodus.1"))),
        "{routes:?}"
    );

    drop(nodes);
    drop(cp);
    drop(cgroups);
}
