//! `nodus proxy` end to end with real traffic, in private network namespaces: a node
//! namespace running the control plane and the proxy, backend pods on its bridge, a client
//! outside the cluster. The same suite runs for the nftables and the iptables mode.

#[path = "common/proxy.rs"]
mod proxy_kit;

use proxy_kit::*;
use std::net::Ipv4Addr;

fn nodus_bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_nodus"))
}

const TCP_PORT: &str = "  - {name: \"\", port: 80, targetPort: 8080, protocol: TCP}\n";

fn ip(s: &str) -> Ipv4Addr {
    s.parse().expect("ip")
}

fn is_refused(r: &std::io::Result<String>) -> bool {
    matches!(r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

fn suite(mode: &str) {
    let n = ProxyNode::start(mode, 3);
    let (b1, b2, b3) = (n.backend("b1").ip, n.backend("b2").ip, n.backend("b3").ip);
    let pod = n.backend("b3").ns.clone();

    // A slice whose service does not exist must not disturb anything.
    n.apply(&slice_yaml(
        "ghost-1",
        "ghost",
        "TCP",
        &[(b1, NODE, true, true, false)],
    ));

    // ClusterIP: every backend gets a fair share.
    n.apply(&service_yaml("web", "10.96.100.10", "", TCP_PORT));
    n.apply(&slice_yaml(
        "web-1",
        "web",
        "TCP",
        &[
            (b1, NODE, true, true, false),
            (b2, NODE, true, true, false),
            (b3, NODE, true, true, false),
        ],
    ));
    let vip = ip("10.96.100.10");
    n.eventually("ClusterIP answers", || {
        ProxyNode::tcp(&pod, vip, 80).is_ok()
    });
    let shares = ProxyNode::shares(&n.client, vip, 80, 60);
    for b in ["b1", "b2", "b3"] {
        let got = shares.get(b).copied().unwrap_or(0);
        assert!(got >= 5, "{b} got {got} of 60 connections: {shares:?}");
    }
    assert_eq!(shares.values().sum::<usize>(), 60, "{shares:?}");

    // Removing an endpoint stops traffic to it.
    n.apply(&slice_yaml(
        "web-1",
        "web",
        "TCP",
        &[(b1, NODE, true, true, false), (b2, NODE, true, true, false)],
    ));
    n.eventually("b3 leaves the rotation", || {
        !ProxyNode::shares(&n.client, vip, 80, 15).contains_key("b3")
    });
    let shares = ProxyNode::shares(&n.client, vip, 80, 40);
    assert!(
        !shares.contains_key("b3"),
        "removed endpoint still served: {shares:?}"
    );
    assert_eq!(shares.values().sum::<usize>(), 40, "{shares:?}");

    // No endpoints: connection refused, not a timeout.
    n.apply(&service_yaml("empty", "10.96.100.11", "", TCP_PORT));
    let evip = ip("10.96.100.11");
    n.eventually("service without endpoints rejects", || {
        is_refused(&n.via_client(evip, 80))
    });
    // …and in nftables mode an unknown port of a ClusterIP is rejected too (upstream's
    // cluster-ips-check; iptables mode has no such rule).
    if mode == "nftables" {
        assert!(is_refused(&n.via_client(vip, 81)), "unknown ClusterIP port");
    }

    // NodePort from outside the cluster, on the node's address.
    n.apply(&service_yaml(
        "np",
        "10.96.100.12",
        "  type: NodePort\n",
        "  - {name: \"\", port: 80, targetPort: 8080, protocol: TCP, nodePort: 30080}\n",
    ));
    n.apply(&slice_yaml(
        "np-1",
        "np",
        "TCP",
        &[(b1, NODE, true, true, false)],
    ));
    n.eventually("NodePort answers from outside", || {
        n.via_client(NODE_IP, 30080).is_ok()
    });
    let r = n.via_client(NODE_IP, 30080).expect("nodeport");
    // externalTrafficPolicy Cluster: the source is SNATed to the node.
    assert!(r.starts_with("b1 "), "{r}");
    assert!(
        !r.ends_with(&CLIENT_IP.to_string()),
        "Cluster policy must SNAT: {r}"
    );

    // externalIPs, and a LoadBalancer ingress IP guarded by loadBalancerSourceRanges.
    let ext_svc = |ranges: &str| {
        service_yaml(
            "ext",
            "10.96.100.18",
            &format!(
                "  type: LoadBalancer\n  externalIPs: [198.51.100.7]\n  loadBalancerSourceRanges: [{ranges}]\n"
            ),
            "  - {name: \"\", port: 80, targetPort: 8080, protocol: TCP, nodePort: 30082}\n",
        )
    };
    n.apply(&ext_svc("192.168.50.0/24"));
    n.kubectl(
        &[
            "patch",
            "service",
            "ext",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"loadBalancer":{"ingress":[{"ip":"198.51.100.9"}]}}}"#,
        ],
        None,
    )
    .expect("set the load balancer IP");
    n.apply(&slice_yaml(
        "ext-1",
        "ext",
        "TCP",
        &[(b2, NODE, true, true, false)],
    ));
    let (eip, lbip) = (ip("198.51.100.7"), ip("198.51.100.9"));
    n.eventually("externalIP answers", || n.via_client(eip, 80).is_ok());
    n.eventually("LoadBalancer IP answers an allowed source", || {
        n.via_client(lbip, 80).is_ok()
    });
    assert!(
        n.via_client(eip, 80)
            .expect("external IP")
            .starts_with("b2 ")
    );
    n.apply(&ext_svc("10.0.0.0/8"));
    n.eventually("LoadBalancer IP drops a source outside the ranges", || {
        !n.client_connects(lbip, 80)
    });
    assert!(
        n.via_client(eip, 80).is_ok(),
        "externalIP is not subject to the ranges"
    );

    // externalTrafficPolicy Local keeps the client's address and uses local endpoints only;
    // its healthCheckNodePort says how many there are.
    n.apply(&service_yaml(
        "local",
        "10.96.100.13",
        "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 31999\n",
        "  - {name: \"\", port: 80, targetPort: 8080, protocol: TCP, nodePort: 30081}\n",
    ));
    n.apply(&slice_yaml(
        "local-1",
        "local",
        "TCP",
        &[
            (b1, NODE, true, true, false),
            (b2, "node2", true, true, false),
        ],
    ));
    n.eventually("Local NodePort answers", || {
        n.via_client(NODE_IP, 30081).is_ok()
    });
    for _ in 0..10 {
        let r = n.via_client(NODE_IP, 30081).expect("local nodeport");
        assert_eq!(
            r,
            format!("b1 {CLIENT_IP}"),
            "Local policy: local endpoint, client IP kept"
        );
    }
    let hc = |ns: &testkit::Netns| -> (u16, String) {
        let mut s = ns
            .connect_tcp(std::net::SocketAddr::from((NODE_IP, 31999)))
            .expect("health check port");
        use std::io::{Read as _, Write as _};
        write!(s, "GET / HTTP/1.0\r\n\r\n").expect("write");
        let mut b = String::new();
        s.read_to_string(&mut b).expect("read");
        let code = b
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (code, b)
    };
    n.eventually("health check node port serves", || {
        n.client
            .connect_tcp(std::net::SocketAddr::from((NODE_IP, 31999)))
            .is_ok()
    });
    // The kernel has the rules a moment before the proxy's bookkeeping catches up
    // (nft commits, then exits), so the health answer may lag the traffic briefly.
    n.eventually("health check says 200", || hc(&n.client).0 == 200);
    let (_, body) = hc(&n.client);
    assert!(body.contains("\"localEndpoints\":1"), "{body}");
    // No local endpoint left: external traffic is dropped, health says 503.
    n.apply(&slice_yaml(
        "local-1",
        "local",
        "TCP",
        &[(b2, "node2", true, true, false)],
    ));
    n.eventually("health check turns 503", || hc(&n.client).0 == 503);

    // Session affinity sticks to one backend.
    n.apply(&service_yaml(
        "sticky",
        "10.96.100.14",
        "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n",
        TCP_PORT,
    ));
    n.apply(&slice_yaml(
        "sticky-1",
        "sticky",
        "TCP",
        &[
            (b1, NODE, true, true, false),
            (b2, NODE, true, true, false),
            (b3, NODE, true, true, false),
        ],
    ));
    let svip = ip("10.96.100.14");
    n.eventually("sticky answers", || n.via_client(svip, 80).is_ok());
    let shares = ProxyNode::shares(&n.client, svip, 80, 20);
    assert_eq!(
        shares.len(),
        1,
        "affinity must stick to one backend: {shares:?}"
    );

    // Terminating fallback: only serving-terminating endpoints left, traffic still flows;
    // neither ready nor serving: rejected.
    n.apply(&slice_yaml(
        "web-1",
        "web",
        "TCP",
        &[(b2, NODE, false, true, true)],
    ));
    n.eventually("terminating endpoint serves", || {
        ProxyNode::shares(&n.client, vip, 80, 5)
            .keys()
            .all(|k| k == "b2")
    });
    n.apply(&slice_yaml(
        "web-1",
        "web",
        "TCP",
        &[(b2, NODE, false, false, true)],
    ));
    n.eventually("no serving endpoint rejects", || {
        is_refused(&n.via_client(vip, 80))
    });

    // Hairpin: a pod reaching itself through its service is masqueraded so the reply
    // comes back through the node.
    n.apply(&service_yaml("hair", "10.96.100.15", "", TCP_PORT));
    n.apply(&slice_yaml(
        "hair-1",
        "hair",
        "TCP",
        &[(b3, NODE, true, true, false)],
    ));
    let hvip = ip("10.96.100.15");
    n.eventually("hairpin works", || ProxyNode::tcp(&pod, hvip, 80).is_ok());
    let r = ProxyNode::tcp(&pod, hvip, 80).expect("hairpin");
    assert_eq!(
        r,
        format!("b3 {BRIDGE_IP}"),
        "hairpin traffic is masqueraded to the node"
    );

    // UDP: after the endpoint changes, the same client flow reaches the new one (the
    // stale conntrack entry was deleted).
    n.apply(&service_yaml(
        "dns",
        "10.96.100.16",
        "",
        "  - {name: \"\", port: 53, targetPort: 8080, protocol: UDP}\n",
    ));
    n.apply(&slice_yaml(
        "dns-1",
        "dns",
        "UDP",
        &[(b1, NODE, true, true, false)],
    ));
    let dvip = ip("10.96.100.16");
    let udp = UdpClient::new(&n.client);
    n.eventually("UDP service answers", || {
        udp.ask(dvip, 53).as_deref() == Some("b1")
    });
    n.apply(&slice_yaml(
        "dns-1",
        "dns",
        "UDP",
        &[(b2, NODE, true, true, false)],
    ));
    n.eventually("UDP flow moves to the new endpoint", || {
        udp.ask(dvip, 53).as_deref() == Some("b2")
    });

    // internalTrafficPolicy Local: in-cluster traffic only to this node's endpoints.
    n.apply(&service_yaml(
        "itp",
        "10.96.100.19",
        "  internalTrafficPolicy: Local\n",
        TCP_PORT,
    ));
    n.apply(&slice_yaml(
        "itp-1",
        "itp",
        "TCP",
        &[
            (b1, "node2", true, true, false),
            (b2, NODE, true, true, false),
        ],
    ));
    let ivip = ip("10.96.100.19");
    n.eventually("ITP Local service answers", || {
        n.via_client(ivip, 80).is_ok()
    });
    let shares = ProxyNode::shares(&n.client, ivip, 80, 20);
    assert_eq!(shares.keys().collect::<Vec<_>>(), ["b2"], "{shares:?}");

    // Topology hints: once this node's zone is known, only endpoints hinted for it.
    n.apply(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node1\n  labels: {topology.kubernetes.io/zone: zone-a}\n",
    );
    n.apply(&service_yaml("topo", "10.96.100.20", "", TCP_PORT));
    n.apply(&format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: topo-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: topo}}\naddressType: IPv4\nports:\n- {{name: \"\", port: {BACKEND_PORT}, protocol: TCP}}\nendpoints:\n- addresses: [\"{b1}\"]\n  nodeName: node2\n  hints: {{forZones: [{{name: zone-b}}]}}\n- addresses: [\"{b3}\"]\n  nodeName: node3\n  hints: {{forZones: [{{name: zone-a}}]}}\n"
    ));
    let tvip = ip("10.96.100.20");
    n.eventually("topology-aware routing picks zone-a", || {
        ProxyNode::shares(&n.client, tvip, 80, 10)
            .keys()
            .all(|k| k == "b3")
    });

    // Headless and service-proxy-name services are left alone.
    n.apply(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: other\n  namespace: default\n  labels: {service.kubernetes.io/service-proxy-name: someone-else}\nspec:\n  clusterIP: 10.96.100.17\n  ports:\n  - {port: 80, targetPort: 8080}\n",
    );
    n.apply(&slice_yaml(
        "other-1",
        "other",
        "TCP",
        &[(b1, NODE, true, true, false)],
    ));

    // Everything else kept working through all of that.
    let r = n.via_client(NODE_IP, 30080).expect("nodeport still works");
    assert!(r.starts_with("b1 "), "{r}");

    // show-rules prints per-service rules a learner can follow.
    let out = n
        .node
        .command(nodus_bin())
        .expect("cmd")
        .args([
            "proxy",
            "--show-rules",
            "--hostname-override",
            NODE,
            "--proxy-mode",
            mode,
        ])
        .arg("--kubeconfig")
        .arg(n.kubeconfig())
        .output()
        .expect("show-rules");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("default/web"), "{text}");
    assert!(
        !text.contains("default/other"),
        "service-proxy-name service shown: {text}"
    );
    match mode {
        "nftables" => {
            assert!(text.contains("numgen random mod 3"), "{text}");
            // The ClusterIP path without affinity: an interval element per endpoint (a
            // single endpoint owns the whole numgen range).
            assert!(
                text.contains("map service-endpoints-tcp: ") && text.contains(" . 0-65535 : "),
                "{text}"
            );
        }
        _ => assert!(text.contains("--probability 0.3333333333"), "{text}"),
    }

    // Metrics with upstream's names, healthz and livez.
    let (code, metrics) = n.node.http_get(10249, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_network_programming_duration_seconds",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    assert_eq!(
        n.node.http_get(10256, "/livez").map(|r| r.0).ok(),
        Some(200)
    );

    // A restart programs the same rules from scratch (full sync over existing state).
    let mut n = n;
    n.start_proxy(&[]);
    n.eventually("service works after a proxy restart", || {
        n.via_client(NODE_IP, 30080).is_ok()
    });
    let shares = ProxyNode::shares(&n.client, svip, 80, 5);
    assert_eq!(shares.len(), 1, "{shares:?}");

    // `--cleanup` removes everything the proxy made, in both modes, and nothing else.
    n.stop_proxy();
    n.node
        .run("iptables", &["-t", "nat", "-N", "KUBE-KUBELET-CANARY"])
        .expect("iptables");
    let out = n
        .node
        .run(
            nodus_bin().to_str().expect("utf-8 path"),
            &["proxy", "--cleanup"],
        )
        .expect("cleanup");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nft = n
        .node
        .run("nft", &["list", "table", "ip", "kube-proxy"])
        .expect("nft");
    assert!(!nft.status.success(), "table left behind");
    let saved = n.node.run("iptables-save", &[]).expect("iptables-save");
    let saved = String::from_utf8_lossy(&saved.stdout);
    assert!(
        !saved.contains("KUBE-SVC-") && !saved.contains("-j KUBE-SERVICES"),
        "{saved}"
    );
    assert!(
        saved.contains("KUBE-KUBELET-CANARY"),
        "someone else's chain removed: {saved}"
    );
}

#[test]
fn nftables_mode_serves_services() {
    if !have_root() {
        return;
    }
    suite("nftables");
}

#[test]
fn iptables_mode_serves_services() {
    if !have_root() {
        return;
    }
    suite("iptables");
}

#[test]
fn ipvs_mode_is_a_clear_error() {
    let out = std::process::Command::new(nodus_bin())
        .args([
            "proxy",
            "--proxy-mode",
            "ipvs",
            "--kubeconfig",
            "/nonexistent",
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("IPVS is absent from this kernel"), "{err}");
}

#[test]
fn unknown_config_field_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("kp.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nsyncPeriodd: 5s\n",
    )
    .expect("write");
    let out = std::process::Command::new(nodus_bin())
        .args(["proxy", "--config"])
        .arg(&cfg)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("syncPeriodd"), "{err}");
}
