//! `nodus up`: one command starts the cluster, prints where the kubeconfig is and what to
//! type next, and real kubectl works against it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn up_prints_the_kubeconfig_and_kubectl_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["up", "--no-node", "--bind-address", "127.0.0.1"])
        .args(["--secure-port", "0", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("nodus up starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut printed = Vec::new();
    let mut kubeconfig = None;
    for line in lines.by_ref() {
        let line = line.expect("line");
        printed.push(line.clone());
        if let Some(k) = line.strip_prefix("kubeconfig: ") {
            kubeconfig = Some(k.to_string());
        }
        if line.starts_with("next: ") {
            break;
        }
    }
    let kubeconfig = kubeconfig.unwrap_or_else(|| panic!("no kubeconfig line in {printed:?}"));
    assert_eq!(
        kubeconfig,
        dir.path()
            .join("control-plane/admin.kubeconfig")
            .display()
            .to_string()
    );
    assert!(
        printed
            .last()
            .is_some_and(|l| l.contains("kubectl get nodes")),
        "{printed:?}"
    );
    let mut out = None;
    for _ in 0..50 {
        let o = Command::new("kubectl")
            .args([
                "--kubeconfig",
                &kubeconfig,
                "get",
                "namespaces",
                "-o",
                "name",
            ])
            .output()
            .expect("kubectl runs");
        if o.status.success() {
            out = Some(String::from_utf8_lossy(&o.stdout).to_string());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // SAFETY: signalling the child we started, by its PID.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let status = child.wait().expect("nodus up exits");
    let out = out.expect("kubectl get namespaces succeeds");
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(out.contains(&format!("namespace/{ns}")), "{out}");
    }
    assert!(
        status.success(),
        "nodus up exits cleanly on SIGTERM: {status}"
    );
}

/// `nodus up --store etcd` without `--etcd-servers`: etcd runs as its child with its data
/// under `<data-dir>/etcd`, objects are there, and it stops with `nodus up`.
#[test]
fn up_store_etcd_runs_its_own_etcd_and_stops_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args([
            "up",
            "--no-node",
            "--store",
            "etcd",
            "--bind-address",
            "127.0.0.1",
        ])
        .args(["--secure-port", "0", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("nodus up starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut printed = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("line");
        let done = line.starts_with("next: ");
        printed.push(line);
        if done {
            break;
        }
    }
    let kubeconfig = dir.path().join("control-plane/admin.kubeconfig");
    let pid = child.id();
    // Any of its threads may have spawned etcd.
    let children: String = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let etcd_pid = children
        .split_whitespace()
        .find(|c| {
            std::fs::read_to_string(format!("/proc/{c}/cmdline")).is_ok_and(|cmd| {
                cmd.contains("etcd") && cmd.contains(&dir.path().display().to_string())
            })
        })
        .map(str::to_string);
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["create", "configmap", "in-etcd"])
        .output()
        .expect("kubectl runs");
    // SAFETY: signalling the child we started, by its PID.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    let status = child.wait().expect("nodus up exits");
    let etcd_pid = etcd_pid.unwrap_or_else(|| panic!("no etcd child of nodus up: {printed:?}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join("etcd/member-data/member").is_dir());
    assert!(
        status.success(),
        "nodus up exits cleanly on SIGTERM: {status}"
    );
    // Stopped and reaped by nodus up.
    assert!(
        !std::path::Path::new(&format!("/proc/{etcd_pid}")).exists(),
        "etcd ({etcd_pid}) still runs after nodus up stopped"
    );
}

mod common;

use common::cluster::{self, kubectl};
use serde_json::Value;

fn json_of(out: &(bool, String, String)) -> Option<Value> {
    if !out.0 {
        return None;
    }
    serde_json::from_str(&out.1).ok()
}

/// `nodus up` in a private network namespace: the control plane and a node in one process;
/// a pod created without a node is placed by the scheduler and run by the kubelet; the
/// node's Lease renews; `kubectl get nodes` shows the runtime as `nodus://…`; a Service's
/// ClusterIP reaches its pod through the EndpointSlice controller and kube-proxy; and the
/// lesson's lab steps 3–6: a mirror pod that comes back when deleted, QoS classes, crictl's
/// view, a memory limit read from the container's cgroup.
#[test]
fn up_runs_a_cluster_where_kubectl_run_works() {
    if !common::have_root() {
        return;
    }
    let netns = std::sync::Arc::new(testkit::Netns::new("nodus-up").expect("netns"));
    let cgroup = testkit::CgroupParent::new("nodus-up");
    cgroup.create();
    cluster::add_node_address(&netns);
    let dir = tempfile::Builder::new()
        .prefix("nodus-up-")
        .tempdir()
        .expect("tempdir");
    let d = dir.path();
    cluster::prepare_node_dir(d, "10.99.70.0/24", &d.join("up/node/runtime"));
    let mut cmd = netns
        .command(common::nodus_bin())
        .expect("command in netns");
    cmd.arg("up")
        .arg("--data-dir")
        .arg(d.join("up"))
        .arg("--")
        .arg("--runtime-config")
        .arg(d.join("runtime.toml"))
        .args(["--hostname-override", "up-node"])
        .arg("--pod-logs-dir")
        .arg(d.join("logs"))
        .args(["--cgroup-root", &cgroup.path()]);
    let log = d.join("up.log");
    let mut daemon = testkit::daemon::Daemon::spawn("nodus-up", cmd, &log, Duration::from_secs(10))
        .expect("spawn nodus up");
    let kubeconfig = d.join("up/control-plane/admin.kubeconfig");
    let k = |args: &[&str]| kubectl(&netns, &kubeconfig, d, args, None);
    let wait = |args: &[&str], what: &str, pred: &dyn Fn(&Value) -> bool| -> Value {
        for _ in 0..300 {
            if let Some(v) = json_of(&k(args)).filter(|v| pred(v)) {
                return v;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("timed out waiting for {what}\n{}", daemon_log(&log));
    };
    let node = wait(
        &["get", "node", "up-node", "-o", "json"],
        "node Ready",
        &|n| cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True"),
    );
    assert!(
        node.pointer("/status/nodeInfo/containerRuntimeVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with("nodus://")),
        "{node}"
    );
    let lease = wait(
        &[
            "get",
            "lease",
            "-n",
            "kube-node-lease",
            "up-node",
            "-o",
            "json",
        ],
        "lease",
        &|_| true,
    );
    let first = lease.pointer("/spec/renewTime").cloned();
    let (ok, out, err) = k(&[
        "run",
        "hello",
        "--image=busybox",
        "--restart=Never",
        "--image-pull-policy=IfNotPresent",
        "--",
        "sh",
        "-c",
        "echo hello from nodus up; sleep 3600",
    ]);
    assert!(ok, "kubectl run: {out}{err}");
    let pod = wait(
        &["get", "pod", "hello", "-o", "json"],
        "pod Running",
        &|p| p["status"]["phase"] == "Running",
    );
    assert_eq!(
        pod.pointer("/spec/nodeName").and_then(Value::as_str),
        Some("up-node")
    );
    let (ok, logs, err) = k(&["logs", "hello"]);
    assert!(
        ok && logs.contains("hello from nodus up"),
        "kubectl logs: {logs}{err}"
    );
    wait(
        &[
            "get",
            "lease",
            "-n",
            "kube-node-lease",
            "up-node",
            "-o",
            "json",
        ],
        "lease renewed",
        &|l| l.pointer("/spec/renewTime").cloned() != first,
    );
    // A Service in front of a pod: the EndpointSlice controller lists it once Ready, and
    // kube-proxy (inside `nodus up`'s node) programs the ClusterIP on the node.
    let (ok, out, err) = k(&[
        "run",
        "web",
        "--image=busybox",
        "--restart=Never",
        "--image-pull-policy=IfNotPresent",
        "--port=8080",
        "--expose=true",
        "--",
        "sh",
        "-c",
        "echo served by $(hostname) > /tmp/index.html; exec httpd -f -p 8080 -h /tmp",
    ]);
    assert!(ok, "kubectl run --expose: {out}{err}");
    let slice = wait(
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            "json",
        ],
        "a ready endpoint for web",
        &|l| {
            l["items"].as_array().is_some_and(|items| {
                items.iter().any(|s| {
                    s["endpoints"]
                        .as_array()
                        .is_some_and(|eps| eps.iter().any(|e| e["conditions"]["ready"] == true))
                })
            })
        },
    );
    assert!(
        slice.to_string().contains("\"nodeName\":\"up-node\""),
        "{slice}"
    );
    let svc = wait(&["get", "service", "web", "-o", "json"], "service", &|_| {
        true
    });
    let cluster_ip: std::net::Ipv4Addr = svc
        .pointer("/spec/clusterIP")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .expect("a ClusterIP");
    let mut body = String::new();
    for _ in 0..100 {
        if let Ok(mut conn) = netns.connect_tcp((cluster_ip, 8080).into()) {
            use std::io::{Read as _, Write as _};
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = write!(conn, "GET / HTTP/1.0\r\n\r\n");
            body.clear();
            let _ = conn.read_to_string(&mut body);
            if body.contains("served by web") {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        body.contains("served by web"),
        "ClusterIP {cluster_ip}:8080 answered {body:?}\n{}",
        daemon_log(&log)
    );
    // Cluster DNS: the node serves it and announces it, kube-dns (10.96.0.10) lists the
    // node, and a ClusterFirst pod's resolv.conf names it with the search path; service
    // names resolve from inside the pod, by full name and through the search path.
    wait(
        &[
            "get",
            "endpointslices",
            "-n",
            "kube-system",
            "-l",
            "kubernetes.io/service-name=kube-dns",
            "-o",
            "json",
        ],
        "the node as a ready kube-dns endpoint",
        &|l| {
            l.to_string().contains("\"ready\":true")
                && l.to_string().contains("\"nodeName\":\"up-node\"")
        },
    );
    let (ok, resolv, err) = k(&["exec", "hello", "--", "cat", "/etc/resolv.conf"]);
    assert!(ok, "{err}");
    for line in [
        "nameserver 10.96.0.10",
        "search default.svc.cluster.local svc.cluster.local cluster.local",
        "options ndots:5",
    ] {
        assert!(
            resolv.contains(line),
            "resolv.conf lacks {line:?}:\n{resolv}"
        );
    }
    for name in ["web.default.svc.cluster.local", "web", "kubernetes.default"] {
        let want = if name.starts_with("web") {
            cluster_ip.to_string()
        } else {
            "10.96.0.1".to_string()
        };
        let mut last = String::new();
        let found = (0..50).any(|_| {
            let (_, out, err) = k(&["exec", "hello", "--", "nslookup", name]);
            last = format!("{out}{err}");
            let hit = out
                .lines()
                .any(|l| l.starts_with("Address") && l.contains(&want));
            if !hit {
                std::thread::sleep(Duration::from_millis(300));
            }
            hit
        });
        assert!(
            found,
            "nslookup {name} in a pod: {last}\n{}",
            daemon_log(&log)
        );
    }
    // In-cluster access, as an operator would have it: the real kubectl, mounted from the
    // host into a pod, uses its in-cluster config (KUBERNETES_SERVICE_HOST/PORT from the
    // kubelet, the service account's bound token and ca.crt from the kube-api-access
    // volume), reaches the API server through the `kubernetes` Service (kube-proxy to the
    // advertised node address), verifies its certificate, and may do exactly what its Role
    // allows; the token dies with the pod.
    let host_kubectl =
        std::fs::canonicalize(which("kubectl").expect("kubectl on PATH")).expect("kubectl path");
    let overrides = serde_json::json!({"spec": {
        "serviceAccountName": "reader",
        "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "kubectl", "hostPath": {"path": host_kubectl, "type": "File"}}],
        "containers": [{"name": "api-client", "image": "busybox", "imagePullPolicy": "IfNotPresent",
            "command": ["sleep", "3600"], "env": [{"name": "HOME", "value": "/tmp"}],
            "volumeMounts": [{"name": "kubectl", "mountPath": "/usr/local/bin/kubectl", "readOnly": true}]}]
    }})
    .to_string();
    for args in [
        &["create", "serviceaccount", "reader"][..],
        &[
            "create",
            "role",
            "pod-reader",
            "--verb=get,list",
            "--resource=pods",
        ],
        &[
            "create",
            "rolebinding",
            "reader-reads-pods",
            "--role=pod-reader",
            "--serviceaccount=default:reader",
        ],
        &[
            "run",
            "api-client",
            "--image=busybox",
            "--restart=Never",
            "--overrides",
            &overrides,
        ],
    ] {
        let (ok, out, err) = k(args);
        assert!(ok, "kubectl {args:?}: {out}{err}");
    }
    wait(
        &["get", "pod", "api-client", "-o", "json"],
        "api-client Running",
        &|p| p["status"]["phase"] == "Running",
    );
    let in_pod = |script: &str| k(&["exec", "api-client", "--", "sh", "-c", script]);
    let (ok, out, err) = in_pod(
        "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT $KUBERNETES_PORT $WEB_SERVICE_HOST",
    );
    assert!(ok, "{out}{err}");
    assert_eq!(
        out.trim(),
        format!("10.96.0.1:443 tcp://10.96.0.1:443 {cluster_ip}"),
        "service variables"
    );
    let mut listed = in_pod("kubectl get pods -o name 2>&1");
    for _ in 0..50 {
        if listed.1.contains("pod/api-client") {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
        listed = in_pod("kubectl get pods -o name 2>&1");
    }
    assert!(
        listed.0 && listed.1.contains("pod/api-client"),
        "kubectl get pods from inside the pod: {listed:?}\n{}",
        daemon_log(&log)
    );
    let secrets = in_pod("kubectl get secrets 2>&1");
    assert!(
        !secrets.0
            && secrets.1.contains(
                "secrets is forbidden: User \"system:serviceaccount:default:reader\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\""
            ),
        "the Role grants no secrets: {secrets:?}"
    );
    let (ok, token, err) = in_pod("cat /var/run/secrets/kubernetes.io/serviceaccount/token");
    assert!(ok, "{err}");
    let as_pod = |t: &str| {
        kubectl(
            &netns,
            std::path::Path::new("/dev/null"),
            d,
            &[
                "--server",
                "https://127.0.0.1:6443",
                "--insecure-skip-tls-verify",
                "--token",
                t,
                "get",
                "pods",
                "-o",
                "name",
            ],
            None,
        )
    };
    let (ok, out, err) = as_pod(token.trim());
    assert!(ok && out.contains("pod/api-client"), "{out}{err}");
    let (ok, out, err) = k(&["delete", "pod", "api-client", "--timeout=60s"]);
    assert!(ok, "kubectl delete: {out}{err}");
    let (ok, out, err) = as_pod(token.trim());
    assert!(
        !ok && err.contains("Unauthorized"),
        "a token bound to a deleted pod must be refused: {out}{err}"
    );
    // The lesson's lab, steps 3–6, against `nodus up`.
    // 3. A static pod from the manifest directory appears as a mirror pod with the node's
    //    name; deleting the mirror brings it back (challenge 4).
    std::fs::write(
        d.join("up/manifests/node-agent.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: node-agent, namespace: kube-system}\nspec:\n  containers:\n  - name: agent\n    image: busybox\n    imagePullPolicy: IfNotPresent\n    command: [sleep, '3600']\n",
    )
    .expect("static manifest");
    let mirror = wait(
        &[
            "get",
            "pod",
            "-n",
            "kube-system",
            "node-agent-up-node",
            "-o",
            "json",
        ],
        "mirror pod Running",
        &|p| p["status"]["phase"] == "Running",
    );
    assert!(
        mirror
            .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
            .is_some(),
        "{mirror}"
    );
    let old_uid = mirror["metadata"]["uid"].clone();
    let (ok, out, err) = k(&[
        "delete",
        "pod",
        "-n",
        "kube-system",
        "node-agent-up-node",
        "--wait=false",
    ]);
    assert!(ok, "delete mirror: {out}{err}");
    wait(
        &[
            "get",
            "pod",
            "-n",
            "kube-system",
            "node-agent-up-node",
            "-o",
            "json",
        ],
        "mirror pod recreated",
        &|p| p["metadata"]["uid"] != old_uid && p["metadata"]["deletionTimestamp"].is_null(),
    );
    // 5. QoS classes from requests and limits.
    let (ok, out, err) = k(&[
        "run",
        "guaranteed",
        "--image=busybox",
        "--restart=Never",
        "--image-pull-policy=IfNotPresent",
        "--overrides",
        r#"{"spec":{"containers":[{"name":"guaranteed","image":"busybox","imagePullPolicy":"IfNotPresent","command":["sleep","3600"],"resources":{"requests":{"cpu":"100m","memory":"64Mi"},"limits":{"cpu":"100m","memory":"64Mi"}}}]}}"#,
    ]);
    assert!(ok, "kubectl run guaranteed: {out}{err}");
    let g = wait(
        &["get", "pod", "guaranteed", "-o", "json"],
        "guaranteed Running",
        &|p| p["status"]["phase"] == "Running",
    );
    assert_eq!(g["status"]["qosClass"], "Guaranteed");
    let hello = wait(&["get", "pod", "hello", "-o", "json"], "hello", &|_| true);
    assert_eq!(hello["status"]["qosClass"], "BestEffort");
    // 6. The memory limit, read from the container's own cgroup.
    let (ok, limit, err) = k(&[
        "exec",
        "guaranteed",
        "--",
        "sh",
        "-c",
        "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]);
    assert!(ok, "kubectl exec: {limit}{err}");
    assert_eq!(limit.trim(), "67108864");
    // 4. The runtime's own view, through crictl.
    let ps = common::up::crictl(&netns, d, &["ps"]);
    for name in ["guaranteed", "hello", "agent", "web"] {
        assert!(ps.contains(name), "crictl ps lacks {name}:\n{ps}");
    }
    let (ok, out, err) = k(&["delete", "pod", "guaranteed", "--timeout=60s"]);
    assert!(ok, "kubectl delete: {out}{err}");

    let (ok, out, err) = k(&["delete", "pod", "hello", "--timeout=60s"]);
    assert!(ok, "kubectl delete: {out}{err}\n{}", daemon_log(&log));
    daemon.stop();
    common::kill_runtime_leftovers(&d.join("up/node/run/runtime"), d);
    drop(cgroup);
}

fn daemon_log(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(150)..].join("\n")
}

fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}
