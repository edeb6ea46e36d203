//! Cluster DNS against a real API server: Services and EndpointSlices created through the
//! API, `nodus_dns::run_until` serving them on 127.0.0.1, queried over UDP and TCP the way
//! a stub resolver does (and with busybox nslookup where the host has it).

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use nodus_dns::DnsConfig;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

async fn start_cluster(dir: &Path) -> nodus_control_plane::ServerHandle {
    let cfg = nodus_control_plane::ControlPlaneConfig::new(dir, "127.0.0.1".parse().unwrap(), 0);
    nodus_control_plane::start(cfg)
        .await
        .expect("control plane starts")
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig parses");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("kube config");
    kube::Client::try_from(cfg).expect("kube client")
}

/// A port free on 127.0.0.1 for both UDP and TCP.
async fn free_port() -> u16 {
    loop {
        let u = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = u.local_addr().unwrap().port();
        if TcpListener::bind(("127.0.0.1", port)).await.is_ok() {
            return port;
        }
    }
}

/// Starts the DNS server and waits until it serves; it stops when the returned sender is
/// dropped.
async fn start_dns(
    kubeconfig: &Path,
    resolv_conf: &Path,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port().await));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let config = DnsConfig {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        listen: vec![addr],
        cluster_domain: "cluster.local".into(),
        resolv_conf: resolv_conf.to_path_buf(),
        ttl: 5,
    };
    // Queries only once the server is bound and has listed: before that a query races the
    // bind (ECONNREFUSED) or gets SERVFAIL.
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        nodus_dns::run_until_bound(config, Some(bound_tx), async {
            let _ = rx.await;
        })
        .await
        .expect("dns server runs");
    });
    tokio::time::timeout(std::time::Duration::from_secs(30), bound_rx)
        .await
        .expect("the DNS server bound and listed within 30 s")
        .expect("the DNS server started");
    (addr, tx)
}

fn query(name: &str, t: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    m
}

/// One UDP exchange, as a stub resolver: a 10 s bound, then the test fails.
async fn udp_raw(server: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    s.connect(server).await.unwrap();
    s.send(bytes).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(Duration::from_secs(10), s.recv(&mut buf))
        .await
        .expect("an answer within 10 s")
        .expect("recv");
    buf.truncate(n);
    buf
}

async fn ask(server: SocketAddr, name: &str, t: RecordType) -> Message {
    let q = query(name, t);
    let r = Message::from_vec(&udp_raw(server, &q.to_vec().unwrap()).await).expect("a DNS message");
    assert_eq!(r.metadata.id, q.metadata.id);
    r
}

async fn ask_tcp(server: SocketAddr, name: &str, t: RecordType) -> Message {
    let q = query(name, t).to_vec().unwrap();
    let mut s = TcpStream::connect(server).await.unwrap();
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    s.write_all(&framed).await.unwrap();
    let read = async {
        let n = s.read_u16().await.unwrap() as usize;
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf).await.unwrap();
        buf
    };
    let buf = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("an answer within 10 s");
    Message::from_vec(&buf).unwrap()
}

/// Answers as `name TYPE data` lines.
fn lines(rs: &[Record]) -> Vec<String> {
    rs.iter()
        .map(|r| format!("{} {} {}", r.name, r.record_type(), r.data))
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Polls until `f` holds, for up to 30 s.
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..300 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A stand-in upstream resolver: every A query gets 192.0.2.7, except `big.example.`,
/// which is truncated over UDP and answered with 40 addresses over TCP.
struct Upstream {
    addr: SocketAddr,
    tcp_queries: Arc<Mutex<Vec<String>>>,
}

fn upstream_answer(req: &Message, udp: bool) -> Message {
    let mut m = Message::response(req.metadata.id, req.metadata.op_code);
    m.metadata.recursion_available = true;
    m.queries = req.queries.clone();
    let q = &req.queries[0];
    if q.name().to_ascii() == "big.example." {
        if udp {
            m.metadata.truncation = true;
        } else {
            for i in 0..40u8 {
                m.answers.push(Record::from_rdata(
                    q.name().clone(),
                    60,
                    RData::A(A(Ipv4Addr::new(198, 51, 100, i))),
                ));
            }
        }
    } else if q.query_type() == RecordType::A {
        m.answers.push(Record::from_rdata(
            q.name().clone(),
            60,
            RData::A(A(Ipv4Addr::new(192, 0, 2, 7))),
        ));
    }
    m
}

async fn start_upstream() -> Upstream {
    let port = free_port().await;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let udp = UdpSocket::bind(addr).await.unwrap();
    let tcp = TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65535];
        loop {
            let Ok((n, peer)) = udp.recv_from(&mut buf).await else {
                continue;
            };
            if let Ok(req) = Message::from_vec(&buf[..n]) {
                let out = upstream_answer(&req, true).to_vec().unwrap();
                let _ = udp.send_to(&out, peer).await;
            }
        }
    });
    let tcp_queries = Arc::new(Mutex::new(Vec::new()));
    let seen = tcp_queries.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = tcp.accept().await else {
                continue;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Ok(n) = s.read_u16().await {
                    let mut buf = vec![0u8; n as usize];
                    if s.read_exact(&mut buf).await.is_err() {
                        return;
                    }
                    let req = Message::from_vec(&buf).unwrap();
                    seen.lock().unwrap().push(req.queries[0].name().to_ascii());
                    let out = upstream_answer(&req, false).to_vec().unwrap();
                    let mut framed = (out.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&out);
                    if s.write_all(&framed).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Upstream { addr, tcp_queries }
}

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

fn soa_in_authority(m: &Message) -> bool {
    m.authorities
        .iter()
        .any(|r| r.record_type() == RecordType::SOA)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_dns_answers_from_the_api_and_follows_updates() {
    let dir = tempfile::tempdir().unwrap();
    let cp = start_cluster(dir.path()).await;
    let kube = client(&cp.kubeconfig).await;
    let services: Api<Service> = Api::namespaced(kube.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(kube.clone(), "default");
    let pp = PostParams::default();

    let web = services
        .create(
            &pp,
            &obj(serde_json::json!({
                "metadata": {"name": "web"},
                "spec": {"ports": [
                    {"name": "http", "port": 80, "protocol": "TCP"},
                    {"name": "dns", "port": 53, "protocol": "UDP"}
                ]}
            })),
        )
        .await
        .expect("create web");
    let web_ip = web.spec.unwrap().cluster_ip.expect("a ClusterIP");
    services
        .create(
            &pp,
            &obj(serde_json::json!({
                "metadata": {"name": "db"},
                "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}
            })),
        )
        .await
        .expect("create db");
    slices
        .create(
            &pp,
            &obj(serde_json::json!({
                "metadata": {"name": "db-1", "labels": {"kubernetes.io/service-name": "db"}},
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["10.1.0.1"], "hostname": "db-0", "conditions": {"ready": true}},
                    {"addresses": ["10.1.0.2"], "conditions": {"ready": true}},
                    {"addresses": ["10.1.0.3"], "hostname": "db-2", "conditions": {"ready": false}}
                ],
                "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]
            })),
        )
        .await
        .expect("create db slice");
    services
        .create(
            &pp,
            &obj(serde_json::json!({
                "metadata": {"name": "ext"},
                "spec": {"type": "ExternalName", "externalName": "www.example"}
            })),
        )
        .await
        .expect("create ext");

    let upstream = start_upstream().await;
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {}\n", upstream.addr)).unwrap();
    let (dns, _stop) = start_dns(&cp.kubeconfig, &resolv).await;

    // ClusterIP service: its ClusterIP, authoritative, TTL 5.
    eventually("web's A record", || async {
        ask(dns, "web.default.svc.cluster.local.", RecordType::A)
            .await
            .answers
            .len()
            == 1
    })
    .await;
    let r = ask(dns, "web.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert!(r.metadata.authoritative);
    assert_eq!(
        lines(&r.answers),
        vec![format!("web.default.svc.cluster.local. A {web_ip}")]
    );
    assert_eq!(r.answers[0].ttl, 5);

    // Named ports: SRV to the service name, its address as additional record.
    let r = ask(
        dns,
        "_http._tcp.web.default.svc.cluster.local.",
        RecordType::SRV,
    )
    .await;
    assert_eq!(
        lines(&r.answers),
        vec![
            "_http._tcp.web.default.svc.cluster.local. SRV 0 100 80 web.default.svc.cluster.local."
        ]
    );
    assert_eq!(
        lines(&r.additionals),
        vec![format!("web.default.svc.cluster.local. A {web_ip}")]
    );

    // Headless: the ready endpoints only, hostnames, SRV per endpoint.
    eventually("db's endpoints", || async {
        ask(dns, "db.default.svc.cluster.local.", RecordType::A)
            .await
            .answers
            .len()
            == 2
    })
    .await;
    let r = ask(dns, "db.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(
        sorted(lines(&r.answers)),
        vec![
            "db.default.svc.cluster.local. A 10.1.0.1",
            "db.default.svc.cluster.local. A 10.1.0.2"
        ]
    );
    let r = ask(dns, "db-0.db.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(
        lines(&r.answers),
        vec!["db-0.db.default.svc.cluster.local. A 10.1.0.1"]
    );
    let r = ask(dns, "db-2.db.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(
        r.metadata.response_code,
        ResponseCode::NXDomain,
        "not ready"
    );
    let r = ask(
        dns,
        "_pg._tcp.db.default.svc.cluster.local.",
        RecordType::SRV,
    )
    .await;
    assert_eq!(
        sorted(lines(&r.answers)),
        vec![
            "_pg._tcp.db.default.svc.cluster.local. SRV 0 50 5432 10-1-0-2.db.default.svc.cluster.local.",
            "_pg._tcp.db.default.svc.cluster.local. SRV 0 50 5432 db-0.db.default.svc.cluster.local.",
        ]
    );
    assert_eq!(
        sorted(lines(&r.additionals)),
        vec![
            "10-1-0-2.db.default.svc.cluster.local. A 10.1.0.2",
            "db-0.db.default.svc.cluster.local. A 10.1.0.1",
        ]
    );

    // PTR for the ClusterIP and an endpoint.
    let o: Vec<&str> = web_ip.split('.').collect();
    let rev = format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0]);
    let r = ask(dns, &rev, RecordType::PTR).await;
    assert_eq!(
        lines(&r.answers),
        vec![format!("{rev} PTR web.default.svc.cluster.local.")]
    );
    let r = ask(dns, "1.0.1.10.in-addr.arpa.", RecordType::PTR).await;
    assert_eq!(
        lines(&r.answers),
        vec!["1.0.1.10.in-addr.arpa. PTR db-0.db.default.svc.cluster.local."]
    );

    // ExternalName: the CNAME, and the target resolved through the upstream.
    eventually("ext's CNAME", || async {
        !ask(dns, "ext.default.svc.cluster.local.", RecordType::CNAME)
            .await
            .answers
            .is_empty()
    })
    .await;
    let r = ask(dns, "ext.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(
        lines(&r.answers),
        vec![
            "ext.default.svc.cluster.local. CNAME www.example.",
            "www.example. A 192.0.2.7"
        ]
    );

    // Pods insecure.
    let r = ask(dns, "10-244-0-5.default.pod.cluster.local.", RecordType::A).await;
    assert_eq!(
        lines(&r.answers),
        vec!["10-244-0-5.default.pod.cluster.local. A 10.244.0.5"]
    );

    // NXDOMAIN vs NODATA, both with the SOA.
    let r = ask(dns, "nope.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
    assert!(soa_in_authority(&r));
    let r = ask(dns, "web.default.svc.cluster.local.", RecordType::AAAA).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert!(r.answers.is_empty() && soa_in_authority(&r));

    let r = ask(dns, "dns-version.cluster.local.", RecordType::TXT).await;
    assert_eq!(
        lines(&r.answers),
        vec!["dns-version.cluster.local. TXT 1.1.0"]
    );

    // Outside the zone: forwarded. A truncated upstream answer is fetched over TCP, then
    // truncated again for our UDP client (512 bytes), which retries over TCP.
    let r = ask(dns, "www.example.", RecordType::A).await;
    assert_eq!(lines(&r.answers), vec!["www.example. A 192.0.2.7"]);
    let r = ask(dns, "big.example.", RecordType::A).await;
    assert!(r.metadata.truncation, "too big for 512 bytes");
    assert!(
        upstream
            .tcp_queries
            .lock()
            .unwrap()
            .contains(&"big.example.".to_string()),
        "the forwarder retried over TCP"
    );
    let r = ask_tcp(dns, "big.example.", RecordType::A).await;
    assert_eq!(r.answers.len(), 40);
    assert!(!r.metadata.truncation);

    // Garbage: FORMERR with the ID, and the server keeps serving.
    let garbage = [0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0xff, 0xff];
    let r = Message::from_vec(&udp_raw(dns, &garbage).await).unwrap();
    assert_eq!(r.metadata.id, 0x1234);
    assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
    let r = ask_tcp(dns, "web.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(r.answers.len(), 1, "still serving, over TCP too");

    // What a user's tool prints.
    if Path::new("/usr/bin/busybox").exists() {
        let out = tokio::process::Command::new("/usr/bin/busybox")
            .args([
                "nslookup",
                "web.default.svc.cluster.local",
                &dns.to_string(),
            ])
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!("Address: {web_ip}")),
            "busybox nslookup: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Updates: a deleted service disappears after the watch.
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete web");
    eventually("web to be gone", || async {
        ask(dns, "web.default.svc.cluster.local.", RecordType::A)
            .await
            .metadata
            .response_code
            == ResponseCode::NXDomain
    })
    .await;
    let r = ask(dns, &rev, RecordType::PTR).await;
    assert!(
        !lines(&r.answers).iter().any(|l| l.contains("web.default")),
        "no PTR left for the deleted service"
    );
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_upstreams_give_servfail() {
    let dir = tempfile::tempdir().unwrap();
    let cp = start_cluster(dir.path()).await;
    // One upstream refuses (nothing listens), one swallows queries (a 2 s try each).
    let closed = free_port().await;
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        format!(
            "nameserver 127.0.0.1:{closed}\nnameserver {}\n",
            silent.local_addr().unwrap()
        ),
    )
    .unwrap();
    let (dns, _stop) = start_dns(&cp.kubeconfig, &resolv).await;
    eventually("the server to listen", || async {
        TcpStream::connect(dns).await.is_ok()
    })
    .await;
    let r = ask(dns, "www.example.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    assert!(r.answers.is_empty());
    let r = ask_tcp(dns, "www.example.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    // The cluster zone does not depend on upstreams.
    let r = ask(dns, "dns-version.cluster.local.", RecordType::TXT).await;
    assert_eq!(r.answers.len(), 1);
    drop(silent);
    cp.shutdown().await;
}

#[tokio::test]
async fn invalid_configuration_is_refused_with_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 127.0.0.1\n").unwrap();
    let base = DnsConfig {
        kubeconfig: Some(dir.path().join("none.kubeconfig")),
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        cluster_domain: "cluster.local".into(),
        resolv_conf: resolv.clone(),
        ttl: 5,
    };
    let missing = dir.path().join("missing.conf");
    let cases = [
        (
            DnsConfig {
                ttl: 3601,
                ..base.clone()
            },
            "--ttl 3601: must be between 0 and 3600".to_string(),
        ),
        (
            DnsConfig {
                listen: vec![],
                ..base.clone()
            },
            "--listen: at least one address is required".to_string(),
        ),
        (
            DnsConfig {
                resolv_conf: missing.clone(),
                ..base.clone()
            },
            format!("reading {}", missing.display()),
        ),
        (
            base.clone(),
            format!(
                "kubeconfig {}",
                dir.path().join("none.kubeconfig").display()
            ),
        ),
    ];
    for (config, want) in cases {
        let err = nodus_dns::run_until(config, async {})
            .await
            .expect_err("refused");
        assert!(err.to_string().starts_with(&want), "{err} (want {want})");
    }
}
