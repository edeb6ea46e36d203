//! `nodus control-plane --etcd-servers` against a real etcd member (Debian's, started on
//! free 127.0.0.1 ports in a temp dir and stopped by PID), driven by the real kubectl:
//! objects land under upstream's `/registry/...` keys, lists and watches work, a stale
//! write is a Conflict, a watch from a compacted revision is 410 Gone, etcd going away
//! gives 503 and the server recovers when it is back; an unreachable --etcd-servers
//! fails at start naming it.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::etcd::{b64, control_plane, etcd_http, free_port, kubectl};
use nodus_control_plane::storage::EtcdServer;

#[test]
fn kubectl_against_etcd_create_list_watch_conflict_gone_and_outage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let etcd_dir = dir.path().join("etcd");
    let mut etcd = EtcdServer::start(&etcd_dir).expect("etcd starts");
    let (client_port, peer_port) = (etcd.client_port, etcd.peer_port);
    let cp_dir = dir.path().join("cp");
    let _server = control_plane(&cp_dir, free_port(), &etcd.url(), &[]);
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

    // The create is in upstream's etcd request metrics.
    let (ok, metrics, err) = k(&["get", "--raw", "/metrics"]);
    assert!(ok, "{err}");
    for line in [
        "etcd_requests_total{operation=\"create\",type=\"configmaps\"}",
        "etcd_request_duration_seconds_count{operation=\"create\",type=\"configmaps\"}",
        "etcd_request_duration_seconds_bucket{operation=\"get\",type=\"namespaces\",le=\"0.005\"}",
    ] {
        assert!(metrics.contains(line), "{line} missing from /metrics");
    }

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
