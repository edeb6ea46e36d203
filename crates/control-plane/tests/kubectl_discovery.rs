//! The real kubectl against the discovery and OpenAPI routers, served over plain HTTP on
//! 127.0.0.1: `api-resources`, `api-versions` and `explain` must print what they print
//! against upstream's API server, with nothing on stderr.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nodus_control_plane::apiserver::{discovery, openapi};

/// A test server on an ephemeral port, stopped when dropped.
struct Server {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind 127.0.0.1:0");
                addr_tx
                    .send(listener.local_addr().expect("local addr"))
                    .expect("send addr");
                let app = discovery::router().merge(openapi::router());
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = shutdown_rx.await;
                    })
                    .await
                    .expect("serve");
            });
        });
        let addr = addr_rx.recv().expect("server address");
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: t\n  context:\n    cluster: t\n    user: t\nusers:\n- name: t\n  user: {{}}\ncurrent-context: t\n"
        );
        let mut f = std::fs::File::create(dir.path().join("kubeconfig")).expect("kubeconfig");
        f.write_all(kubeconfig.as_bytes())
            .expect("write kubeconfig");
        Server {
            addr,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
            dir,
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn cache_dir(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// Runs kubectl with its own kubeconfig and cache dir; returns (stdout, stderr, success).
    fn kubectl(&self, args: &[&str]) -> (String, String, bool) {
        let out: Output = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg("--cache-dir")
            .arg(self.cache_dir())
            .args(args)
            .env_remove("KUBECONFIG")
            .env("HOME", self.dir.path())
            .output()
            .expect("run kubectl (is it installed?)");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            out.status.success(),
        )
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        let (stdout, stderr, ok) = self.kubectl(args);
        assert!(ok, "kubectl {args:?} failed:\n{stderr}\n{stdout}");
        assert_eq!(stderr, "", "kubectl {args:?} printed on stderr");
        stdout
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Splits kubectl's column output into rows of cells, keyed by the header's column starts.
fn table(out: &str) -> Vec<Vec<String>> {
    let mut lines = out.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let mut starts = Vec::new();
    let mut prev_space = true;
    for (i, c) in header.char_indices() {
        if c != ' ' && prev_space {
            starts.push(i);
        }
        prev_space = c == ' ';
    }
    std::iter::once(header)
        .chain(lines)
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(n, &s)| {
                    let end = starts.get(n + 1).copied().unwrap_or(line.len());
                    line.get(s..end.min(line.len()))
                        .unwrap_or("")
                        .trim()
                        .to_string()
                })
                .collect()
        })
        .collect()
}

fn row<'a>(rows: &'a [Vec<String>], name: &str, api_version: &str) -> &'a [String] {
    rows.iter()
        .find(|r| {
            r.first().map(String::as_str) == Some(name)
                && r.get(2).map(String::as_str) == Some(api_version)
        })
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("no row {name} {api_version} in {rows:?}"))
}

#[test]
fn api_resources_lists_the_catalogue_with_upstream_columns() {
    let server = Server::start();
    let out = server.kubectl_ok(&["api-resources"]);
    let rows = table(&out);
    assert_eq!(
        rows[0],
        ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"],
        "{out}"
    );
    assert_eq!(
        row(&rows, "pods", "v1"),
        ["pods", "po", "v1", "true", "Pod"]
    );
    assert_eq!(
        row(&rows, "nodes", "v1"),
        ["nodes", "no", "v1", "false", "Node"]
    );
    assert_eq!(
        row(&rows, "deployments", "apps/v1"),
        ["deployments", "deploy", "apps/v1", "true", "Deployment"]
    );
    assert_eq!(
        row(&rows, "leases", "coordination.k8s.io/v1"),
        ["leases", "", "coordination.k8s.io/v1", "true", "Lease"]
    );
    assert_eq!(
        row(&rows, "priorityclasses", "scheduling.k8s.io/v1"),
        [
            "priorityclasses",
            "pc",
            "scheduling.k8s.io/v1",
            "false",
            "PriorityClass"
        ]
    );
    // Every catalogue resource appears, and subresources do not.
    for r in nodus_k8s::catalog::all() {
        let api_version = if r.group.is_empty() {
            r.version.to_string()
        } else {
            format!("{}/{}", r.group, r.version)
        };
        row(&rows, r.plural, &api_version);
    }
    assert!(!out.contains("pods/status"), "{out}");

    // The same through the legacy, per-group-version documents and the disk cache.
    let cached = server.kubectl_ok(&["api-resources"]);
    assert_eq!(cached, out);

    let wide = server.kubectl_ok(&["api-resources", "--api-group=apps", "-o", "wide"]);
    let rows = table(&wide);
    let deploy = row(&rows, "deployments", "apps/v1");
    assert_eq!(
        deploy[5],
        "create,delete,deletecollection,get,list,patch,update,watch"
    );
    assert_eq!(deploy[6], "all");
}

#[test]
fn api_resources_filters_by_verb_and_scope() {
    let server = Server::start();
    let out = server.kubectl_ok(&["api-resources", "--namespaced=false", "-o", "name"]);
    let names: Vec<&str> = out.lines().collect();
    assert!(names.contains(&"nodes"), "{out}");
    assert!(names.contains(&"namespaces"), "{out}");
    assert!(
        names.contains(&"priorityclasses.scheduling.k8s.io"),
        "{out}"
    );
    assert!(!names.contains(&"pods"), "{out}");
    let out = server.kubectl_ok(&["api-resources", "--verbs=create", "-o", "name"]);
    assert!(out.lines().any(|l| l == "bindings"), "{out}");
}

#[test]
fn api_versions_lists_every_group_version() {
    let server = Server::start();
    let out = server.kubectl_ok(&["api-versions"]);
    let versions: Vec<&str> = out.lines().collect();
    for expected in [
        "v1",
        "apps/v1",
        "coordination.k8s.io/v1",
        "discovery.k8s.io/v1",
        "events.k8s.io/v1",
        "node.k8s.io/v1",
        "policy/v1",
        "scheduling.k8s.io/v1",
    ] {
        assert!(versions.contains(&expected), "{expected} missing: {out}");
    }
}

#[test]
fn explain_prints_upstream_descriptions() {
    let server = Server::start();
    let out = server.kubectl_ok(&["explain", "pod.spec.containers.image"]);
    assert!(out.contains("KIND:       Pod"), "{out}");
    assert!(out.contains("VERSION:    v1"), "{out}");
    assert!(out.contains("FIELD: image <string>"), "{out}");
    assert!(out.contains("Container image name."), "{out}");

    let out = server.kubectl_ok(&["explain", "pod.spec.containers"]);
    assert!(out.contains("FIELD: containers <[]Container>"), "{out}");
    assert!(out.contains("image\t<string>"), "{out}");
    assert!(out.contains("name\t<string> -required-"), "{out}");

    let out = server.kubectl_ok(&["explain", "deployment", "--api-version=apps/v1"]);
    assert!(out.contains("KIND:       Deployment"), "{out}");
    assert!(out.contains("GROUP:      apps"), "{out}");
    assert!(out.contains("spec\t<DeploymentSpec>"), "{out}");

    let out = server.kubectl_ok(&["explain", "svc.spec.ports.targetPort"]);
    assert!(out.contains("FIELD: targetPort <IntOrString>"), "{out}");

    let (_, stderr, ok) = server.kubectl(&["explain", "pod.spec.nope"]);
    assert!(!ok);
    assert!(
        stderr.contains("field \"nope\" does not exist"),
        "unexpected error: {stderr}"
    );
}

#[test]
fn openapi_v3_documents_are_cached_by_hash() {
    let server = Server::start();
    // kubectl fills its disk cache from the index, then reuses the hashed documents.
    server.kubectl_ok(&["explain", "lease.spec"]);
    server.kubectl_ok(&["explain", "lease.spec.holderIdentity"]);
    let cache = server.cache_dir();
    assert!(
        contains_file(&cache),
        "kubectl wrote no cache under {cache:?}"
    );
}

fn contains_file(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                let p = e.path();
                if p.is_dir() { contains_file(&p) } else { true }
            })
        })
        .unwrap_or(false)
}

#[test]
fn discovery_answers_unknown_groups_with_not_found() {
    let server = Server::start();
    let (_, stderr, ok) = server.kubectl(&["get", "--raw", "/apis/nope.example.com/v1"]);
    assert!(!ok);
    assert!(
        stderr.contains("the server could not find the requested resource"),
        "{stderr}"
    );
    let out = server.kubectl_ok(&["get", "--raw", "/api"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    assert_eq!(v["kind"], "APIVersions");
    assert_eq!(v["versions"][0], "v1");
    assert_eq!(
        v["serverAddressByClientCIDRs"][0]["serverAddress"],
        server.addr.to_string()
    );
}
