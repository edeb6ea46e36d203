//! The real kubectl against the discovery and OpenAPI routers, served over plain HTTP on
//! 127.0.0.1: `api-resources`, `api-versions` and `explain` must print what they print
//! against upstream's API server, with nothing on stderr.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use nodus_control_plane::apiserver::{discovery, openapi};

/// A test server on an ephemeral port, stopped when dropped.
struct Server {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    dir: tempfile::TempDir,
    /// Every request line the server saw, as `METHOD /path?query`.
    requests: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
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
                let app =
                    discovery::router()
                        .merge(openapi::router())
                        .layer(axum::middleware::from_fn(
                            move |req: axum::extract::Request, next: axum::middleware::Next| {
                                let seen = seen.clone();
                                async move {
                                    if let Ok(mut s) = seen.lock() {
                                        s.push(format!("{} {}", req.method(), req.uri()));
                                    }
                                    next.run(req).await
                                }
                            },
                        ));
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
            requests,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
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
    assert_eq!(
        row(&rows, "ingresses", "networking.k8s.io/v1"),
        [
            "ingresses",
            "ing",
            "networking.k8s.io/v1",
            "true",
            "Ingress"
        ]
    );
    assert_eq!(
        row(&rows, "networkpolicies", "networking.k8s.io/v1"),
        [
            "networkpolicies",
            "netpol",
            "networking.k8s.io/v1",
            "true",
            "NetworkPolicy"
        ]
    );
    assert_eq!(
        row(&rows, "apiservices", "apiregistration.k8s.io/v1"),
        [
            "apiservices",
            "",
            "apiregistration.k8s.io/v1",
            "false",
            "APIService"
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
        "apiregistration.k8s.io/v1",
        "flowcontrol.apiserver.k8s.io/v1",
        "networking.k8s.io/v1",
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
fn kubectl_caches_discovery_and_hashed_openapi_documents() {
    let server = Server::start();
    server.kubectl_ok(&["explain", "lease.spec"]);
    let first = server.requests();
    assert!(
        first.iter().any(|r| r.starts_with("GET /apis?")),
        "{first:?}"
    );
    let doc = |reqs: &[String]| {
        reqs.iter()
            .filter(|r| r.starts_with("GET /openapi/v3/apis/coordination.k8s.io/v1?hash="))
            .count()
    };
    assert_eq!(doc(&first), 1, "{first:?}");
    // The second run finds discovery and the immutable document in its disk cache.
    server.kubectl_ok(&["explain", "lease.spec.holderIdentity"]);
    let all = server.requests();
    let second = &all[first.len()..];
    assert_eq!(doc(second), 0, "refetched a hashed document: {second:?}");
    assert!(
        !second.iter().any(|r| r.starts_with("GET /apis?")),
        "{second:?}"
    );
    assert!(contains_file(&server.cache_dir()));
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

/// A raw HTTP/1.1 GET, so that tests can see status lines and headers kubectl hides.
fn http_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).expect("send request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read response");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    HttpResponse {
        status,
        headers,
        body: body.to_string(),
    }
}

struct HttpResponse {
    status: u16,
    headers: std::collections::BTreeMap<String, String>,
    body: String,
}

impl HttpResponse {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(String::as_str).unwrap_or("")
    }

    fn json(&self) -> serde_json::Value {
        // Bodies here are small and unchunked unless hyper chose chunked encoding.
        let body = if self.header("transfer-encoding") == "chunked" {
            dechunk(&self.body)
        } else {
            self.body.clone()
        };
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
    }
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 {
            break;
        }
        out.push_str(tail.get(..n).unwrap_or(tail));
        rest = tail.get(n + 2..).unwrap_or("");
    }
    out
}

const CLIENT_GO_DISCOVERY_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

#[test]
fn aggregated_discovery_is_negotiated_like_upstream() {
    let server = Server::start();
    let resp = http_get(
        server.addr,
        "/apis",
        &[("Accept", CLIENT_GO_DISCOVERY_ACCEPT)],
    );
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("content-type"),
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    let doc = resp.json();
    assert_eq!(doc["kind"], "APIGroupDiscoveryList");
    assert_eq!(doc["apiVersion"], "apidiscovery.k8s.io/v2");
    let apps = doc["items"]
        .as_array()
        .and_then(|items| items.iter().find(|g| g["metadata"]["name"] == "apps"))
        .cloned()
        .unwrap_or_default();
    let deploy = apps["versions"][0]["resources"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["resource"] == "deployments"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(deploy["scope"], "Namespaced");
    assert_eq!(deploy["responseKind"]["kind"], "Deployment");
    let scale = deploy["subresources"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["subresource"] == "scale"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(scale["responseKind"]["group"], "autoscaling");
    assert_eq!(scale["responseKind"]["kind"], "Scale");

    // A client revalidating with the ETag is told nothing changed.
    let etag = resp.header("etag").to_string();
    assert!(!etag.is_empty());
    let again = http_get(
        server.addr,
        "/apis",
        &[
            ("Accept", CLIENT_GO_DISCOVERY_ACCEPT),
            ("If-None-Match", &etag),
        ],
    );
    assert_eq!(again.status, 304);

    // Plain JSON gets the legacy documents.
    let legacy = http_get(server.addr, "/apis", &[("Accept", "application/json")]);
    assert_eq!(legacy.header("content-type"), "application/json");
    assert_eq!(legacy.json()["kind"], "APIGroupList");
    let core = http_get(server.addr, "/api/v1", &[]);
    let core = core.json();
    assert_eq!(core["kind"], "APIResourceList");
    assert_eq!(core["groupVersion"], "v1");
    let binding = core["resources"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "pods/binding"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(binding["kind"], "Binding");
    assert_eq!(binding["verbs"], serde_json::json!(["create"]));
}

#[test]
fn openapi_v3_serves_hashed_immutable_documents() {
    let server = Server::start();
    let index = http_get(server.addr, "/openapi/v3", &[]);
    assert_eq!(index.status, 200);
    assert_eq!(index.header("content-type"), "application/json");
    let index = index.json();
    let url = index["paths"]["apis/apps/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(url.starts_with("/openapi/v3/apis/apps/v1?hash="), "{index}");

    let doc = http_get(server.addr, &url, &[("Accept", "application/json")]);
    assert_eq!(doc.status, 200);
    assert_eq!(doc.header("cache-control"), "public, immutable");
    assert!(doc.header("expires").ends_with(" GMT"));
    let etag = doc.header("etag").to_string();
    let hash = url.rsplit('=').next().unwrap_or_default();
    assert_eq!(etag, format!("\"{hash}\""));
    let doc = doc.json();
    assert_eq!(doc["openapi"], "3.0.0");
    let deployment = &doc["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"];
    assert_eq!(
        deployment["x-kubernetes-group-version-kind"],
        serde_json::json!([{"group": "apps", "kind": "Deployment", "version": "v1"}])
    );

    let unchanged = http_get(server.addr, &url, &[("If-None-Match", &etag)]);
    assert_eq!(unchanged.status, 304);

    let stale = http_get(server.addr, "/openapi/v3/apis/apps/v1?hash=0123", &[]);
    assert_eq!(stale.status, 301);
    assert_eq!(stale.header("location"), url);

    let missing = http_get(server.addr, "/openapi/v3/apis/nope/v1", &[]);
    assert_eq!(missing.status, 404);

    let protobuf_only = http_get(
        server.addr,
        "/openapi/v3/api/v1",
        &[(
            "Accept",
            "application/com.github.proto-openapi.spec.v3@v1.0+protobuf",
        )],
    );
    assert_eq!(protobuf_only.status, 406);

    let v2 = http_get(
        server.addr,
        "/openapi/v2",
        &[("Accept", "application/json")],
    );
    assert_eq!(v2.status, 200);
    let v2 = v2.json();
    assert_eq!(v2["swagger"], "2.0");
    assert!(v2["definitions"]["io.k8s.api.core.v1.Pod"].is_object());
}

#[test]
fn client_side_validation_of_list_files_uses_the_protobuf_v2_document() {
    let server = Server::start();
    // kubectl cannot ask the server to validate a `kind: List`, so with the default
    // --validate=strict it validates the items itself against /openapi/v2 (protobuf).
    let manifest = server.dir.path().join("list.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: a\n  dataa: {}\n",
    )
    .expect("write manifest");
    let path = manifest.to_string_lossy().into_owned();
    let (_, stderr, ok) = server.kubectl(&["apply", "-f", &path]);
    assert!(!ok);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: error validating \"{path}\": error validating data: ValidationError(ConfigMap): unknown field \"dataa\" in io.k8s.api.core.v1.ConfigMap; if you choose to ignore these errors, turn validation off with --validate=false"
        )
    );
    let v2 = server
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("GET /openapi/v2"))
        .count();
    assert_eq!(v2, 1);
}

#[test]
fn explain_with_the_v2_document() {
    let server = Server::start();
    let out = server.kubectl_ok(&[
        "explain",
        "pods.spec.containers.image",
        "--output=plaintext-openapiv2",
    ]);
    assert!(out.contains("FIELD:    image <string>"), "{out}");
    assert!(out.contains("Container image name."), "{out}");
}

/// The whole control plane (HTTPS, auth, REST, discovery, OpenAPI) in a private thread.
struct ControlPlane {
    kubeconfig: PathBuf,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlPlane {
    fn start() -> ControlPlane {
        let dir = tempfile::tempdir().expect("temp dir");
        let data_dir = dir.path().join("data");
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let cfg = nodus_control_plane::ControlPlaneConfig::new(
                    data_dir,
                    std::net::IpAddr::from([127, 0, 0, 1]),
                    0,
                );
                match nodus_control_plane::start(cfg).await {
                    Ok(handle) => {
                        let _ = ready_tx.send(Ok((handle.kubeconfig.clone(), handle.addr)));
                        let _ = shutdown_rx.await;
                        handle.shutdown().await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                    }
                }
            });
        });
        let (kubeconfig, addr) = match ready_rx.recv() {
            Ok(Ok(k)) => k,
            Ok(Err(e)) => panic!("control plane did not start: {e}"),
            Err(e) => panic!("control plane thread died: {e}"),
        };
        ControlPlane {
            kubeconfig,
            addr,
            dir,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        }
    }

    fn kubectl(&self, args: &[&str]) -> (String, String, bool) {
        let out: Output = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
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

    fn write(&self, name: &str, content: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content).expect("write manifest");
        path.to_string_lossy().into_owned()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  labels:
    app: web
spec:
  containers:
  - name: c
    image: busybox
    env:
    - name: A
      value: \"1\"
";

#[test]
fn apply_is_validated_by_the_server_with_strict_field_validation() {
    let cp = ControlPlane::start();
    let bad = cp.write("bad.yaml", &POD.replace("    image:", "    imagee:"));
    let (stdout, stderr, ok) = cp.kubectl(&["apply", "-f", &bad]);
    assert!(!ok, "{stdout}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "Error from server (BadRequest): error when creating \"{bad}\": Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"spec.containers[0].imagee\""
        )
    );

    // Nothing was stored.
    let (_, stderr, ok) = cp.kubectl(&["get", "pod", "web"]);
    assert!(!ok);
    assert_eq!(
        stderr.trim_end(),
        "Error from server (NotFound): pods \"web\" not found"
    );
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: c
        image: busybox
        env:
        - name: A
          value: \"1\"
";

#[test]
fn apply_creates_then_patches_with_the_openapi_patch_strategies() {
    let cp = ControlPlane::start();
    let first = cp.write("deploy.yaml", DEPLOYMENT);
    let out = cp.kubectl_ok(&["apply", "-f", &first]);
    assert_eq!(out.trim_end(), "deployment.apps/web created");

    // Someone else adds an env var the manifest does not know about.
    cp.kubectl_ok(&[
        "patch",
        "deployment",
        "web",
        "--type=strategic",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"c","env":[{"name":"X","value":"x"}]}]}}}}"#,
    ]);

    // kubectl computes a three-way strategic merge patch from the OpenAPI schema's patch
    // strategies: env merges by name, so X survives; an atomic list would drop it.
    let second = cp.write(
        "deploy2.yaml",
        &DEPLOYMENT.replace(
            "          value: \"1\"\n",
            "          value: \"1\"\n        - name: B\n          value: \"2\"\n",
        ),
    );
    let out = cp.kubectl_ok(&["apply", "-f", &second]);
    assert_eq!(out.trim_end(), "deployment.apps/web configured");
    let names = cp.kubectl_ok(&[
        "get",
        "deploy",
        "web",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].env[*].name}",
    ]);
    let mut names: Vec<&str> = names.split_whitespace().collect();
    names.sort_unstable();
    assert_eq!(names, ["A", "B", "X"]);
}

#[test]
fn short_names_and_explain_work_against_the_real_server() {
    let cp = ControlPlane::start();
    let out = cp.kubectl_ok(&["get", "ns", "-o", "name"]);
    assert!(out.lines().any(|l| l == "namespace/kube-system"), "{out}");
    let out = cp.kubectl_ok(&["get", "pc", "-o", "name"]);
    assert!(
        out.lines()
            .any(|l| l == "priorityclass.scheduling.k8s.io/system-node-critical"),
        "{out}"
    );
    let out = cp.kubectl_ok(&["explain", "pod.spec.containers.image"]);
    assert!(out.contains("Container image name."), "{out}");
    let out = cp.kubectl_ok(&["api-resources", "--api-group=apps", "-o", "name"]);
    assert!(out.lines().any(|l| l == "deployments.apps"), "{out}");
    // Over HTTPS kubectl speaks HTTP/2: the address comes from `:authority`, not Host.
    let out = cp.kubectl_ok(&["get", "--raw", "/api"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    assert_eq!(
        v["serverAddressByClientCIDRs"][0]["serverAddress"],
        cp.addr.to_string()
    );
}

#[test]
fn run_create_and_edit_flows_print_no_warnings() {
    let cp = ControlPlane::start();
    let out = cp.kubectl_ok(&["run", "p", "--image=busybox"]);
    assert_eq!(out.trim_end(), "pod/p created");
    let cm = cp.write(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  a: b\n",
    );
    let out = cp.kubectl_ok(&["create", "-f", &cm]);
    assert_eq!(out.trim_end(), "configmap/cm created");

    // kubectl edit runs $KUBE_EDITOR on a temp file, then patches what changed.
    let editor = cp.write(
        "editor.sh",
        "#!/bin/sh\nsed -i 's/^  a: b$/  a: c/' \"$1\"\n",
    );
    let mut perms = std::fs::metadata(&editor).expect("editor").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&editor, perms).expect("chmod editor");
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .arg("--cache-dir")
        .arg(cp.dir.path().join("cache"))
        .args(["edit", "configmap", "cm"])
        .env_remove("KUBECONFIG")
        .env("HOME", cp.dir.path())
        .env("KUBE_EDITOR", &editor)
        .output()
        .expect("run kubectl edit");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr, "");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        "configmap/cm edited"
    );
    let a = cp.kubectl_ok(&["get", "cm", "cm", "-o", "jsonpath={.data.a}"]);
    assert_eq!(a, "c");

    let out = cp.kubectl_ok(&["label", "po", "p", "tier=x"]);
    assert_eq!(out.trim_end(), "pod/p labeled");
    let out = cp.kubectl_ok(&["get", "po,cm", "-o", "name"]);
    for name in ["pod/p", "configmap/cm"] {
        assert!(out.lines().any(|l| l == name), "{name} missing: {out}");
    }
}

/// kubectl 1.32's typed clients (`kubectl create configmap|deployment|namespace|...`,
/// `scale`) send protobuf request bodies for built-in kinds, whatever discovery says.
#[test]
fn create_generators_send_protobuf_bodies() {
    let cp = ControlPlane::start();
    let out = cp.kubectl_ok(&["create", "configmap", "cm", "--from-literal=a=b"]);
    assert_eq!(out.trim_end(), "configmap/cm created");
    let out = cp.kubectl_ok(&["create", "deployment", "d", "--image=busybox"]);
    assert_eq!(out.trim_end(), "deployment.apps/d created");
    let out = cp.kubectl_ok(&["create", "namespace", "n1"]);
    assert_eq!(out.trim_end(), "namespace/n1 created");
}

#[test]
fn explain_knows_every_catalogue_kind() {
    let server = Server::start();
    for r in nodus_k8s::catalog::all() {
        let api_version = if r.group.is_empty() {
            r.version.to_string()
        } else {
            format!("{}/{}", r.group, r.version)
        };
        let flag = format!("--api-version={api_version}");
        let out = server.kubectl_ok(&["explain", r.plural, &flag]);
        assert!(
            out.contains(&format!("KIND:       {}", r.kind)),
            "{api_version} {}: {out}",
            r.plural
        );
        assert!(out.contains(&format!("VERSION:    {}", r.version)), "{out}");
        assert!(out.contains("FIELDS:"), "{api_version} {}: {out}", r.plural);
    }
}
