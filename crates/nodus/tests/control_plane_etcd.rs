//! `nodus control-plane --etcd-servers` against a real etcd member (Debian's, started on
//! free 127.0.0.1 ports in a temp dir and stopped by PID), driven by the real kubectl:
//! objects land under upstream's `/registry/...` keys, lists and watches work, a stale
//! write is a Conflict, a watch from a compacted revision is 410 Gone, etcd going away
//! gives 503 and the server recovers when it is back; an unreachable --etcd-servers
//! fails at start naming it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use nodus_control_plane::storage::EtcdServer;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

struct Killer(Child);
impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn control_plane(dir: &Path, port: u16, etcd: &str) -> Killer {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["control-plane", "--data-dir"])
        .arg(dir)
        .args(["--secure-port", &port.to_string()])
        .args(["--etcd-servers", etcd, "--request-timeout", "10s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("nodus control-plane starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert!(line.contains("API server at"), "startup line: {line:?}");
    Killer(child)
}

/// kubectl as the admin: (success, stdout, stderr).
fn kubectl(
    kubeconfig: &Path,
    home: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String, String) {
    let mut c = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=30s")
        .args(args)
        .env("HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    if let Some(mut i) = c.stdin.take() {
        let _ = i.write_all(stdin.unwrap_or("").as_bytes());
    }
    let out = c.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A request to etcd's own JSON gateway (`/v3/...`), as etcdctl would make it.
fn etcd_http(port: u16, path: &str, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("etcd");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn kubectl_against_etcd_create_list_watch_conflict_gone_and_outage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let etcd_dir = dir.path().join("etcd");
    let mut etcd = EtcdServer::start(&etcd_dir).expect("etcd starts");
    let (client_port, peer_port) = (etcd.client_port, etcd.peer_port);
    let cp_dir = dir.path().join("cp");
    let _server = control_plane(&cp_dir, free_port(), &etcd.url());
    let kc = cp_dir.join("admin.kubeconfig");
    let k = |args: &[&str]| kubectl(&kc, &home, args, None);

    // Create: the object is in etcd under upstream's key, without a resourceVersion.
    let (ok, rv1, err) = k(&[
        "create",
        "configmap",
        "a",
        "--from-literal=k=v1",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    assert!(ok, "{err}");
    let rv1: u64 = rv1.trim().parse().expect("resourceVersion");
    let raw = etcd_http(
        client_port,
        "/v3/kv/range",
        &format!("{{\"key\":\"{}\"}}", b64("/registry/configmaps/default/a")),
    );
    let value = raw
        .split("\"value\":\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .unwrap_or_else(|| panic!("no /registry/configmaps/default/a in etcd: {raw}"));
    let value = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(value)
            .expect("base64"),
    )
    .expect("utf8");
    assert!(value.contains("\"v1\""), "{value}");
    assert!(!value.contains("resourceVersion"), "{value}");
    assert!(
        raw.contains(&format!("\"mod_revision\":\"{rv1}\"")),
        "resourceVersion {rv1} is etcd's mod_revision: {raw}"
    );

    // List.
    let (ok, out, err) = k(&["create", "configmap", "b", "--from-literal=k=v"]);
    assert!(ok, "{err}");
    let (ok, out2, err) = k(&["get", "configmaps", "-o", "name"]);
    assert!(ok, "{out} {err}");
    assert!(
        out2.contains("configmap/a") && out2.contains("configmap/b"),
        "{out2}"
    );

    // A write carrying the old resourceVersion after another write: 409 Conflict.
    let (ok, _, err) = k(&["patch", "configmap", "a", "-p", r#"{"data":{"k":"v2"}}"#]);
    assert!(ok, "{err}");
    let stale = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: a, namespace: default, resourceVersion: \"{rv1}\"}}\ndata: {{k: v3}}\n"
    );
    let (ok, _, err) = kubectl(&kc, &home, &["replace", "-f", "-"], Some(&stale));
    assert!(!ok);
    assert!(
        err.contains(r#"Operation cannot be fulfilled on configmaps "a": the object has been modified; please apply your changes to the latest version and try again"#),
        "{err}"
    );

    // Watch from the first write: the later ones, in order, with their kinds.
    let (ok, out, err) = k(&[
        "get",
        "--raw",
        &format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv1}&timeoutSeconds=2"
        ),
    ]);
    assert!(ok, "{err}");
    let kinds: Vec<String> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap_or(""),
                e["object"]["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        // Controllers' own ConfigMaps (kube-root-ca.crt) may come and go meanwhile.
        .filter(|e| e.ends_with(" a") || e.ends_with(" b"))
        .collect();
    assert_eq!(kinds, ["ADDED b", "MODIFIED a"], "{out}");

    // etcd compacts past rv1 (as upstream's compactor would): a watch from rv1 is 410 Gone.
    let (ok, now, _) = k(&[
        "get",
        "configmap",
        "b",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    assert!(ok);
    let now: u64 = now.trim().parse().expect("rv");
    let compacted = etcd_http(
        client_port,
        "/v3/kv/compaction",
        &format!("{{\"revision\":\"{now}\",\"physical\":true}}"),
    );
    assert!(compacted.contains("200 OK"), "{compacted}");
    let (ok, out, err) = k(&[
        "get",
        "--raw",
        &format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv1}&timeoutSeconds=2"
        ),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("\"code\":410") && out.contains("too old resource version"),
        "{out}"
    );

    // etcd goes away: requests fail with 503 (not hang), and succeed again once it is back.
    etcd.stop();
    let started = Instant::now();
    let (ok, _, err) = k(&["get", "configmaps"]);
    assert!(!ok);
    assert!(
        err.contains("ServiceUnavailable") || err.contains("Timeout"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "bounded: {:?}",
        started.elapsed()
    );
    drop(etcd);
    let _etcd = EtcdServer::start_on(&etcd_dir, client_port, peer_port).expect("etcd restarts");
    let started = Instant::now();
    loop {
        let (ok, out, err) = k(&["get", "configmaps", "-o", "name"]);
        if ok && out.contains("configmap/a") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the API server did not recover after etcd came back: {err}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, _, err) = k(&["create", "configmap", "after-outage"]);
    assert!(ok, "{err}");
}

#[test]
fn an_unreachable_etcd_fails_at_start_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["control-plane", "--data-dir"])
        .arg(dir.path())
        .args([
            "--secure-port",
            &free_port().to_string(),
            "--etcd-servers",
            &url,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("nodus control-plane");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&url), "{err}");
}
