//! A cluster under test: `nodus control-plane` inside a test node's network namespace (so
//! its 127.0.0.1 is the node's), node credentials from its CA, and kubectl run inside the
//! namespace against it, as a user would.

use super::nodus_bin;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::Netns;
use testkit::daemon::Daemon;

pub const API_PORT: u16 = 6443;

/// The node's own address in its namespace: an interface carrying the default route,
/// so the kubelet finds its InternalIP the way it does on a real machine.
pub const NODE_IP: &str = "10.250.0.2";

/// Gives the namespace an uplink-like interface with [`NODE_IP`] and a default route.
pub fn add_node_address(netns: &Netns) {
    netns.add_uplink().expect("uplink in netns");
}

/// Links `a` and `b` with a veth pair: `a` gets `a_ip`/24, `b` gets `b_ip`/24 and its
/// default route through `a_ip` (so a node there finds its InternalIP as on a machine).
pub fn link_namespaces(a: &Netns, a_ip: &str, b: &Netns, b_ip: &str) {
    link_namespaces_via(a, "peer0", a_ip, b, b_ip);
}

/// [`link_namespaces`] with `a`'s end of the pair named `a_if`, so one namespace (the
/// control plane's) can link to several nodes, each on a /24 of its own.
pub fn link_namespaces_via(a: &Netns, a_if: &str, a_ip: &str, b: &Netns, b_ip: &str) {
    let run = |ns: &Netns, args: &[&str]| {
        let out = ns.run("ip", args).expect("ip in netns");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        a,
        &[
            "link",
            "add",
            a_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            b.name(),
        ],
    );
    run(a, &["addr", "add", &format!("{a_ip}/24"), "dev", a_if]);
    run(a, &["link", "set", a_if, "up"]);
    run(b, &["addr", "add", &format!("{b_ip}/24"), "dev", "eth0"]);
    run(b, &["link", "set", "eth0", "up"]);
    run(b, &["route", "add", "default", "via", a_ip, "dev", "eth0"]);
}

pub struct ControlPlane {
    daemon: Option<Daemon>,
    netns: Arc<Netns>,
    pub dir: tempfile::TempDir,
    starts: usize,
    extra: Vec<String>,
    /// The address the API server listens on and its kubeconfigs name.
    bind: std::net::IpAddr,
}

impl ControlPlane {
    /// Starts the control plane in `netns` on 127.0.0.1:[`API_PORT`].
    pub fn start(netns: Arc<Netns>) -> ControlPlane {
        Self::start_with(netns, &[])
    }

    /// [`ControlPlane::start`] with extra `nodus control-plane` flags (shorter grace periods).
    pub fn start_with(netns: Arc<Netns>, extra: &[&str]) -> ControlPlane {
        Self::start_bound(netns, [127, 0, 0, 1].into(), extra)
    }

    /// [`ControlPlane::start_with`] listening on `bind`, an address of `netns` that other
    /// namespaces reach (nodes joining from elsewhere).
    pub fn start_bound(netns: Arc<Netns>, bind: std::net::IpAddr, extra: &[&str]) -> ControlPlane {
        let dir = tempfile::Builder::new()
            .prefix("nodus-cp-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        let mut cp = ControlPlane {
            daemon: None,
            netns,
            dir,
            starts: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            bind,
        };
        cp.spawn();
        cp
    }

    /// A second control plane of the same cluster in `netns`, listening on `bind` with
    /// `extra` flags: it starts from a copy of this one's PKI, as kubeadm's
    /// `join --control-plane` copies it (same CA, same service-account key).
    pub fn start_peer(&self, bind: std::net::IpAddr, extra: &[&str]) -> ControlPlane {
        let dir = tempfile::Builder::new()
            .prefix("nodus-cp-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        let pki = dir.path().join("data").join("pki");
        std::fs::create_dir_all(&pki).expect("pki dir");
        for f in std::fs::read_dir(self.data_dir().join("pki")).expect("pki") {
            let f = f.expect("entry").path();
            std::fs::copy(&f, pki.join(f.file_name().expect("name"))).expect("copy pki");
        }
        let mut cp = ControlPlane {
            daemon: None,
            netns: Arc::clone(&self.netns),
            dir,
            starts: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            bind,
        };
        cp.spawn();
        cp
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let mut cmd = self.netns.command(nodus_bin()).expect("command in netns");
        cmd.arg("control-plane")
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--bind-address")
            .arg(self.bind.to_string())
            .arg("--secure-port")
            .arg(API_PORT.to_string())
            .args(&self.extra);
        let log = self
            .dir
            .path()
            .join(format!("control-plane-{}.log", self.starts));
        let mut d = Daemon::spawn("nodus-control-plane", cmd, &log, Duration::from_secs(5))
            .expect("spawn control plane");
        let kubeconfig = self.admin_kubeconfig();
        let ns = Arc::clone(&self.netns);
        let addr = std::net::SocketAddr::new(self.bind, API_PORT);
        d.wait_ready(Duration::from_secs(60), || {
            kubeconfig.exists() && ns.connect_tcp(addr).is_ok()
        })
        .expect("control plane did not come up");
        self.daemon = Some(d);
    }

    /// Stops the API server (SIGTERM); its store stays on disk.
    pub fn stop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
    }

    /// The control plane dies at once (SIGKILL), as on a crash: nothing is flushed or
    /// handed over; its store stays on disk for [`ControlPlane::start_again`].
    pub fn kill(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let pid = nix::unistd::Pid::from_raw(d.pid() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
                .unwrap_or_else(|e| panic!("kill -9 {pid}: {e}"));
            // Reaps it (it is gone already, so no signal is sent).
            d.stop();
        }
    }

    /// Starts it again on the same store.
    pub fn start_again(&mut self) {
        assert!(self.daemon.is_none(), "still running");
        self.spawn();
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.data_dir().join("admin.kubeconfig")
    }

    pub fn url(&self) -> String {
        format!("https://{}:{API_PORT}", self.bind)
    }

    /// A kubeconfig for `system:node:<node>`.
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        nodus_control_plane::pki::issue_node_kubeconfig(&self.data_dir(), node, &self.url())
            .expect("issue node kubeconfig")
    }

    pub fn log(&self) -> String {
        self.daemon
            .as_ref()
            .map(|d| d.log_tail(60))
            .unwrap_or_default()
    }

    /// `kubectl ARGS…` as the admin, inside the namespace: (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        kubectl(
            &self.netns,
            &self.admin_kubeconfig(),
            &self.dir.path().join("home"),
            args,
            None,
        )
    }

    /// `kubectl ARGS…` as the admin with `stdin` fed in: (success, stdout, stderr).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> (bool, String, String) {
        kubectl(
            &self.netns,
            &self.admin_kubeconfig(),
            &self.dir.path().join("home"),
            args,
            Some(stdin),
        )
    }

    /// `kubectl apply -f -` with `yaml`.
    pub fn apply(&self, yaml: &str) {
        let (ok, out, err) = kubectl(
            &self.netns,
            &self.admin_kubeconfig(),
            &self.dir.path().join("home"),
            &["apply", "-f", "-"],
            Some(yaml),
        );
        assert!(ok, "kubectl apply failed: {out}{err}\n{yaml}");
    }

    /// `kubectl get ARGS… -o json`, parsed; None when kubectl fails (e.g. NotFound).
    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        let mut all: Vec<&str> = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let (ok, out, _) = self.kubectl(&all);
        if !ok {
            return None;
        }
        serde_json::from_str(&out).ok()
    }

    /// Polls `get_json(args)` until `pred` holds; panics with the last object, `what` and
    /// `context()` (logs) otherwise.
    pub fn wait_json(
        &self,
        args: &[&str],
        timeout: Duration,
        what: &str,
        context: &dyn Fn() -> String,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.get_json(args);
            if let Some(v) = &v
                && pred(v)
            {
                return v.clone();
            }
            if Instant::now() > deadline {
                panic!(
                    "{what}: not within {timeout:?}\nlast: {}\n{}\ncontrol plane log:\n{}",
                    serde_json::to_string_pretty(&v).unwrap_or_default(),
                    context(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl ControlPlane {
    /// Polls the events about `name` in `namespace` until `done` holds (it may assert what
    /// must never be seen on the way); panics with the last events, `what` and `context()`
    /// otherwise.
    pub fn wait_events(
        &self,
        (namespace, name): (&str, &str),
        timeout: Duration,
        what: &str,
        context: &dyn Fn() -> String,
        done: impl Fn(&[SeenEvent]) -> bool,
    ) -> Vec<SeenEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            let ev = events_of(self, namespace, name);
            if done(&ev) {
                return ev;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {timeout:?}\nevents: {ev:#?}\n{}",
                context()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
    }
}

fn kubectl_bin() -> &'static str {
    if Path::new("/usr/bin/kubectl").exists() {
        "/usr/bin/kubectl"
    } else {
        "kubectl"
    }
}

/// Runs kubectl in `netns` with `kubeconfig`, feeding `stdin` when given.
pub fn kubectl(
    netns: &Netns,
    kubeconfig: &Path,
    home: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String, String) {
    use std::io::Write as _;
    let mut cmd = netns.command(kubectl_bin()).expect("kubectl in netns");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "20s"])
        .args(args)
        .env("HOME", home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn kubectl");
    if let Some(mut si) = child.stdin.take()
        && let Some(text) = stdin
    {
        si.write_all(text.as_bytes()).expect("write kubectl stdin");
    }
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The condition `type_` of an object's status.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// An Event about one object, as `kubectl get events` shows it.
#[derive(Debug)]
pub struct SeenEvent {
    pub reason: String,
    pub message: String,
    pub count: i64,
}

/// The events about object `name` in `namespace`.
pub fn events_of(cp: &ControlPlane, namespace: &str, name: &str) -> Vec<SeenEvent> {
    cp.get_json(&["events", "-n", namespace])
        .and_then(|v| v["items"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == name)
        .map(|e| SeenEvent {
            reason: e["reason"].as_str().unwrap_or_default().to_string(),
            message: e["message"].as_str().unwrap_or_default().to_string(),
            count: e["count"].as_i64().unwrap_or(0),
        })
        .collect()
}

/// The events about object `name` in `namespace`, as (reason, message) pairs.
pub fn events_for(cp: &ControlPlane, namespace: &str, name: &str) -> Vec<(String, String)> {
    events_of(cp, namespace, name)
        .into_iter()
        .map(|e| (e.reason, e.message))
        .collect()
}

/// A node's files in `d`: a CNI bridge network on `subnet` (net.d/), a runtime config
/// using it (runtime.toml), and busybox imported into the runtime store at `runtime_root`.
pub fn prepare_node_dir(d: &Path, subnet: &str, runtime_root: &Path) {
    prepare_node_dir_with(d, Some(subnet), runtime_root)
}

/// [`prepare_node_dir`]; with no `subnet` net.d/ stays empty, so the runtime writes its
/// default network from the node's podCIDR (host-local's state under `d/ipam`).
pub fn prepare_node_dir_with(d: &Path, subnet: Option<&str>, runtime_root: &Path) {
    std::fs::create_dir_all(d.join("net.d")).expect("net.d");
    if let Some(subnet) = subnet {
        std::fs::write(
            d.join("net.d/10-test.conflist"),
            super::node::conflist(&d.join("ipam"), subnet),
        )
        .expect("conflist");
    }
    std::fs::write(
        d.join("runtime.toml"),
        format!(
            "cni-conf-dir = \"{}\"\ncni-bin-dirs = [\"/usr/lib/cni\", \"/opt/cni/bin\"]\ndefault-network-ipam-data-dir = \"{}\"\n{}",
            d.join("net.d").display(),
            d.join("ipam").display(),
            testkit::runtime_config::private_nri(d, "")
        ),
    )
    .expect("runtime.toml");
    // Also as `busybox:stable`, whose default pull policy (IfNotPresent) lets commands
    // such as `kubectl create job --image=busybox:stable` run without a registry.
    for tag in ["latest", "stable"] {
        let archive = d.join(format!("busybox-{tag}.tar"));
        testkit::image::busybox()
            .write_oci_archive(&archive, &format!("docker.io/library/busybox:{tag}"))
            .expect("busybox archive");
        let out = std::process::Command::new(nodus_bin())
            .args(["runtime", "import"])
            .arg(&archive)
            .arg("--root-dir")
            .arg(runtime_root)
            .output()
            .expect("nodus runtime import");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

pub struct NodeProcess {
    daemon: Option<Daemon>,
    pub dir: tempfile::TempDir,
}

/// How a test node is set up beyond its name and namespace.
#[derive(Default)]
pub struct NodeOptions<'a> {
    /// A CNI bridge conflist on this subnet; `None`: the runtime's default network from the
    /// node's podCIDR.
    pub subnet: Option<&'a str>,
    /// More `nodus node` flags (`--flannel-backend vxlan`).
    pub extra: &'a [&'a str],
}

impl NodeProcess {
    pub fn start(
        netns: &Arc<Netns>,
        cp: &ControlPlane,
        name: &str,
        subnet: &str,
        cgroup_root: &str,
    ) -> NodeProcess {
        let cp_dir = cp.data_dir();
        Self::start_with_credentials(
            netns,
            &["--control-plane-data-dir".as_ref(), cp_dir.as_os_str()],
            name,
            subnet,
            cgroup_root,
        )
    }

    /// `nodus node` in `netns` joining with `credentials` (its flags naming how: a token
    /// and the CA hash, or the control plane's data dir); returns once its healthz answers.
    pub fn start_with_credentials(
        netns: &Arc<Netns>,
        credentials: &[&std::ffi::OsStr],
        name: &str,
        subnet: &str,
        cgroup_root: &str,
    ) -> NodeProcess {
        let opts = NodeOptions {
            subnet: Some(subnet),
            ..Default::default()
        };
        Self::start_full(netns, credentials, name, cgroup_root, &opts)
    }

    /// [`NodeProcess::start`] with [`NodeOptions`].
    pub fn start_opts(
        netns: &Arc<Netns>,
        cp: &ControlPlane,
        name: &str,
        cgroup_root: &str,
        opts: &NodeOptions<'_>,
    ) -> NodeProcess {
        let cp_dir = cp.data_dir();
        Self::start_full(
            netns,
            &["--control-plane-data-dir".as_ref(), cp_dir.as_os_str()],
            name,
            cgroup_root,
            opts,
        )
    }

    fn start_full(
        netns: &Arc<Netns>,
        credentials: &[&std::ffi::OsStr],
        name: &str,
        cgroup_root: &str,
        opts: &NodeOptions<'_>,
    ) -> NodeProcess {
        let dir = tempfile::Builder::new()
            .prefix("nodus-nodeproc-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        prepare_node_dir_with(d, opts.subnet, &d.join("data/runtime"));
        let mut cmd = netns.command(nodus_bin()).expect("command in netns");
        cmd.arg("node")
            .arg("--data-dir")
            .arg(d.join("data"))
            .args(credentials)
            .arg("--runtime-config")
            .arg(d.join("runtime.toml"))
            .args(["--hostname-override", name])
            .arg("--root-dir")
            .arg(d.join("kubelet"))
            .arg("--pod-logs-dir")
            .arg(d.join("logs"))
            .args(["--cgroup-root", cgroup_root])
            .args(["--eviction-hard", super::EVICTION_HARD_DISK_OFF])
            .args(opts.extra)
            .env("NODUS_LOG", "nodus_kubelet=debug,info");
        let log = d.join("node.log");
        let mut daemon = Daemon::spawn("nodus-node", cmd, &log, Duration::from_secs(10))
            .expect("spawn nodus node");
        let ns = Arc::clone(netns);
        daemon
            .wait_ready(Duration::from_secs(90), || {
                ns.http_get(10248, "/healthz").is_ok_and(|(c, _)| c == 200)
            })
            .expect("nodus node did not come up");
        NodeProcess {
            daemon: Some(daemon),
            dir,
        }
    }

    pub fn log(&self) -> String {
        self.daemon
            .as_ref()
            .map(|d| d.log_tail(150))
            .unwrap_or_default()
    }
}

impl NodeProcess {
    /// The node's process dies at once (SIGKILL to its PID), as on a crash or power loss:
    /// its containers keep running, nothing is cleaned up or reported. Reaping and the
    /// cleanup stay with drop.
    pub fn kill(&self) {
        if let Some(d) = &self.daemon {
            let pid = nix::unistd::Pid::from_raw(d.pid() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
                .unwrap_or_else(|e| panic!("kill -9 {pid}: {e}"));
        }
    }

    /// Stops the node's process (its Lease stops being renewed); cleanup stays with drop.
    pub fn stop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
        super::kill_runtime_leftovers(&self.dir.path().join("data/run/runtime"), self.dir.path());
    }
}
