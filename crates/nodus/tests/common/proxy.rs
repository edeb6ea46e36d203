//! A test node for `nodus proxy`: a "node" network namespace running `nodus control-plane`
//! and `nodus proxy`, a bridge with backend "pods" (each its own namespace, serving TCP and
//! UDP from a thread that entered it), and a "client" namespace outside the cluster on a
//! veth link. Everything lives in namespaces the test created; dropped in reverse order.
#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::Netns;
use testkit::daemon::Daemon;

pub const NODE: &str = "node1";
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
pub const BRIDGE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The port every backend serves TCP and UDP on.
pub const BACKEND_PORT: u16 = 8080;

/// Whether root-only tests can run (never a silent skip with NODUS_TEST_REQUIRE_ROOT=1).
pub fn have_root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        if std::env::var_os("NODUS_TEST_REQUIRE_ROOT").is_some() {
            panic!("this test needs root and NODUS_TEST_REQUIRE_ROOT is set");
        }
        eprintln!("skipping: needs root");
    }
    root
}

fn sh(ns: Option<&Netns>, args: &[&str]) {
    let out = match ns {
        Some(ns) => ns.run(args[0], &args[1..]).expect("run in netns"),
        None => std::process::Command::new(args[0])
            .args(&args[1..])
            .output()
            .expect("run"),
    };
    assert!(
        out.status.success(),
        "{:?}: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A backend pod: its namespace and address on the bridge.
pub struct Backend {
    pub name: String,
    pub ip: Ipv4Addr,
    pub ns: Arc<Netns>,
}

/// Runs `f` on a new thread inside `ns`.
fn in_netns<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let file = std::fs::File::open(ns.path()).expect("open netns");
    std::thread::spawn(move || {
        // SAFETY: setns on this thread only, with a valid namespace fd.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns");
        f()
    })
}

/// Serves "<name> <peer ip>\n" on TCP and UDP port [`BACKEND_PORT`] inside `ns`, forever.
fn serve(ns: &Netns, name: String) {
    let (tx, rx) = std::sync::mpsc::channel();
    let n2 = name.clone();
    in_netns(ns, move || {
        let l = TcpListener::bind(("0.0.0.0", BACKEND_PORT)).expect("bind tcp");
        let u = UdpSocket::bind(("0.0.0.0", BACKEND_PORT)).expect("bind udp");
        tx.send(()).expect("ready");
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((_, peer)) = u.recv_from(&mut buf) {
                let _ = u.send_to(format!("{n2} {}\n", peer.ip()).as_bytes(), peer);
            }
        });
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let peer = s
                .peer_addr()
                .map(|p| p.ip().to_string())
                .unwrap_or_default();
            let _ = s.write_all(format!("{name} {peer}\n").as_bytes());
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("backend up");
}

/// The whole test topology.
pub struct ProxyNode {
    pub dir: tempfile::TempDir,
    pub node: Arc<Netns>,
    pub client: Arc<Netns>,
    pub backends: Vec<Backend>,
    pub api_port: u16,
    control_plane: Option<Daemon>,
    proxy: Option<Daemon>,
    pub mode: String,
}

impl ProxyNode {
    /// Starts the control plane, `n` backends and the proxy in `mode`.
    pub fn start(mode: &str, n: usize) -> ProxyNode {
        let dir = tempfile::Builder::new()
            .prefix("nodus-proxy-")
            .tempdir()
            .expect("tempdir");
        let node = Arc::new(Netns::new("pxnode").expect("node netns"));
        let client = Arc::new(Netns::new("pxcli").expect("client netns"));
        let nn = node.name().to_string();
        sh(
            Some(&node),
            &["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
        );
        // A real node has an uplink and a default route; without one, packets to a VIP
        // that is not DNATed would fail routing before the proxy's reject rules see them.
        sh(
            Some(&node),
            &[
                "ip", "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1",
            ],
        );
        sh(
            Some(&node),
            &["ip", "addr", "add", "172.31.255.1/30", "dev", "uplink0"],
        );
        sh(Some(&node), &["ip", "link", "set", "uplink0", "up"]);
        sh(Some(&node), &["ip", "link", "set", "uplink1", "up"]);
        sh(
            Some(&node),
            &["ip", "route", "add", "default", "via", "172.31.255.2"],
        );
        sh(Some(&node), &["ip", "link", "add", "br0", "type", "bridge"]);
        sh(
            Some(&node),
            &["ip", "addr", "add", "10.244.0.1/24", "dev", "br0"],
        );
        sh(Some(&node), &["ip", "link", "set", "br0", "up"]);
        // The client's link: ext0 on the node, cl0 in the client.
        sh(
            Some(&node),
            &[
                "ip", "link", "add", "ext0", "type", "veth", "peer", "name", "cl0",
            ],
        );
        sh(
            Some(&node),
            &["ip", "link", "set", "cl0", "netns", client.name()],
        );
        sh(
            Some(&node),
            &["ip", "addr", "add", "192.168.50.1/24", "dev", "ext0"],
        );
        sh(Some(&node), &["ip", "link", "set", "ext0", "up"]);
        sh(
            Some(&client),
            &["ip", "addr", "add", "192.168.50.2/24", "dev", "cl0"],
        );
        sh(Some(&client), &["ip", "link", "set", "cl0", "up"]);
        sh(
            Some(&client),
            &["ip", "route", "add", "default", "via", "192.168.50.1"],
        );
        let mut backends = Vec::new();
        for i in 0..n {
            let ns = Arc::new(Netns::new("pxb").expect("backend netns"));
            let ip = Ipv4Addr::new(10, 244, 0, 11 + i as u8);
            let host = format!("vb{i}");
            sh(
                Some(&node),
                &[
                    "ip", "link", "add", &host, "type", "veth", "peer", "name", "eth0",
                ],
            );
            sh(
                Some(&node),
                &["ip", "link", "set", "eth0", "netns", ns.name()],
            );
            sh(Some(&node), &["ip", "link", "set", &host, "master", "br0"]);
            sh(Some(&node), &["ip", "link", "set", &host, "up"]);
            // As the CNI bridge plugin's hairpinMode: with br_netfilter loaded, a pod's
            // packet DNATed back to itself is bridged out of the port it came in on.
            sh(
                Some(&node),
                &["bridge", "link", "set", "dev", &host, "hairpin", "on"],
            );
            sh(
                Some(&ns),
                &["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"],
            );
            sh(Some(&ns), &["ip", "link", "set", "eth0", "up"]);
            sh(
                Some(&ns),
                &["ip", "route", "add", "default", "via", "10.244.0.1"],
            );
            let name = format!("b{}", i + 1);
            serve(&ns, name.clone());
            backends.push(Backend { name, ip, ns });
        }
        let _ = nn;
        let api_port = testkit::port::free_port();
        let mut cmd = node.command(super::nodus_bin()).expect("cmd");
        cmd.args(["control-plane", "--data-dir"])
            .arg(dir.path().join("cp"))
            .args(["--bind-address", "127.0.0.1", "--secure-port"])
            .arg(api_port.to_string());
        let cp = Daemon::spawn(
            "nodus-control-plane",
            cmd,
            &dir.path().join("control-plane.log"),
            Duration::from_secs(5),
        )
        .expect("spawn control plane");
        let mut pn = ProxyNode {
            dir,
            node,
            client,
            backends,
            api_port,
            control_plane: Some(cp),
            proxy: None,
            mode: mode.to_string(),
        };
        let kc = pn.kubeconfig();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if kc.exists() && pn.kubectl(&["get", "namespaces"], None).is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "control plane did not come up: {}",
                pn.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        pn.start_proxy(&[]);
        pn
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("cp").join("admin.kubeconfig")
    }

    /// Starts (or restarts) `nodus proxy` with the suite's flags plus `extra`.
    pub fn start_proxy(&mut self, extra: &[&str]) {
        self.proxy = None;
        let mut cmd = self.node.command(super::nodus_bin()).expect("cmd");
        cmd.arg("proxy")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["--proxy-mode", &self.mode])
            .args(["--hostname-override", NODE])
            .args(["--cluster-cidr", "10.244.0.0/16"])
            .args(["--min-sync-period", "100ms"])
            // Frequent full resyncs, so the suite also exercises them between partial ones.
            .args(["--sync-period", "2s"])
            .args(extra)
            .env("NODUS_LOG", "info,nodus_proxy=debug");
        let d = Daemon::spawn(
            "nodus-proxy",
            cmd,
            &self.dir.path().join("proxy.log"),
            Duration::from_secs(5),
        )
        .expect("spawn proxy");
        self.proxy = Some(d);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.node.http_get(10256, "/healthz").map(|r| r.0).ok() != Some(200) {
            assert!(
                Instant::now() < deadline,
                "proxy healthz never answered: {}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the proxy (SIGTERM); its rules stay, as upstream's do.
    pub fn stop_proxy(&mut self) {
        self.proxy = None;
    }

    pub fn logs(&self) -> String {
        let p = std::fs::read_to_string(self.dir.path().join("proxy.log")).unwrap_or_default();
        let c =
            std::fs::read_to_string(self.dir.path().join("control-plane.log")).unwrap_or_default();
        let tail = |s: &str| {
            s.lines()
                .rev()
                .take(60)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        };
        let run = |prog: &str, args: &[&str]| {
            self.node
                .run(prog, args)
                .map(|o| {
                    format!(
                        "{}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    )
                })
                .unwrap_or_default()
        };
        let rules = if self.mode == "nftables" {
            run("nft", &["list", "ruleset"])
        } else {
            run("iptables-save", &[])
        };
        format!(
            "--- proxy.log ---\n{}\n--- control-plane.log ---\n{}\n--- rules ---\n{rules}\n--- conntrack ---\n{}",
            tail(&p),
            tail(&c),
            run("conntrack", &["-L"])
        )
    }

    /// kubectl in the node namespace; `stdin` is fed to it.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let mut cmd = self.node.command("kubectl").map_err(|e| e.to_string())?;
        cmd.arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .env("HOME", self.dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        if let Some(mut si) = child.stdin.take()
            && let Some(text) = stdin
        {
            si.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    pub fn apply(&self, yaml: &str) {
        if let Err(e) = self.kubectl(&["apply", "-f", "-"], Some(yaml)) {
            panic!("kubectl apply failed: {e}\n{yaml}");
        }
    }

    pub fn delete(&self, args: &[&str]) {
        let mut a = vec!["delete"];
        a.extend_from_slice(args);
        if let Err(e) = self.kubectl(&a, None) {
            panic!("kubectl delete failed: {e}");
        }
    }

    pub fn backend(&self, name: &str) -> &Backend {
        self.backends
            .iter()
            .find(|b| b.name == name)
            .expect("backend exists")
    }

    /// One TCP request from `ns`: Ok("<backend> <peer>") or the connect error.
    pub fn tcp(ns: &Netns, ip: Ipv4Addr, port: u16) -> std::io::Result<String> {
        let mut s = ns.connect_tcp(SocketAddr::from((ip, port)))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out.trim().to_string())
    }

    /// Whether a TCP connection from the client to `ip:port` opens within 2 s.
    pub fn client_connects(&self, ip: Ipv4Addr, port: u16) -> bool {
        let addr = SocketAddr::from((ip, port));
        in_netns(&self.client, move || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
        })
        .join()
        .unwrap_or(false)
    }

    pub fn via_client(&self, ip: Ipv4Addr, port: u16) -> std::io::Result<String> {
        Self::tcp(&self.client, ip, port)
    }

    /// Who answers `n` connections from `ns`: backend name → count.
    pub fn shares(
        ns: &Netns,
        ip: Ipv4Addr,
        port: u16,
        n: usize,
    ) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for _ in 0..n {
            let who = Self::tcp(ns, ip, port)
                .map(|s| s.split_whitespace().next().unwrap_or("").to_string())
                .unwrap_or_else(|e| format!("error:{:?}", e.kind()));
            *m.entry(who).or_default() += 1;
        }
        m
    }

    /// Waits until `cond` holds (the proxy applies changes asynchronously).
    pub fn eventually(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cond() {
            if Instant::now() > deadline {
                panic!("{what}: never happened\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A UDP socket in `ns`, kept so later datagrams reuse the same 5-tuple.
pub struct UdpClient {
    sock: UdpSocket,
}

impl UdpClient {
    pub fn new(ns: &Netns) -> UdpClient {
        let file = std::fs::File::open(ns.path()).expect("open netns");
        let sock = std::thread::spawn(move || {
            // SAFETY: setns on this short-lived thread only.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns");
            UdpSocket::bind(("0.0.0.0", 0)).expect("bind udp")
        })
        .join()
        .expect("udp thread");
        sock.set_read_timeout(Some(Duration::from_millis(700)))
            .expect("timeout");
        UdpClient { sock }
    }

    /// Sends one datagram and returns the reply's backend name, if any.
    pub fn ask(&self, ip: Ipv4Addr, port: u16) -> Option<String> {
        self.sock.send_to(b"hi", (ip, port)).ok()?;
        let mut buf = [0u8; 512];
        let (n, _) = self.sock.recv_from(&mut buf).ok()?;
        String::from_utf8_lossy(&buf[..n])
            .split_whitespace()
            .next()
            .map(str::to_string)
    }
}

/// A selector-less Service (its EndpointSlices are written by the test).
pub fn service_yaml(name: &str, ip: &str, extra_spec: &str, ports: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  clusterIP: {ip}\n  ports:\n{ports}{extra_spec}"
    )
}

/// An EndpointSlice for `service` with `(ip, node, ready, serving, terminating)` endpoints.
pub fn slice_yaml(
    name: &str,
    service: &str,
    protocol: &str,
    endpoints: &[(Ipv4Addr, &str, bool, bool, bool)],
) -> String {
    let mut eps = String::new();
    for (ip, node, ready, serving, terminating) in endpoints {
        eps.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  nodeName: {node}\n  conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}\n"
        ));
    }
    let eps = if endpoints.is_empty() {
        "endpoints: []\n".to_string()
    } else {
        format!("endpoints:\n{eps}")
    };
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: default\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: IPv4\nports:\n- {{name: \"\", port: {BACKEND_PORT}, protocol: {protocol}}}\n{eps}"
    )
}

impl Drop for ProxyNode {
    fn drop(&mut self) {
        self.proxy = None;
        self.control_plane = None;
    }
}
