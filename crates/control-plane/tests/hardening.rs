//! What an attacker probe found, checked as a user would see it: file modes of the store,
//! keys and tokens; idle and slow connections against :6443; the watch history's size.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use nodus_control_plane::apiserver::state::ApiConfig;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The tests that measure the process (sockets, memory) run one at a time.
static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

fn chmod(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// Every secret-bearing file under `dir` and the dirs holding them.
fn secrets(dir: &Path) -> (Vec<std::path::PathBuf>, Vec<std::path::PathBuf>) {
    let mut files = vec![
        dir.join("store.redb"),
        dir.join("admin.kubeconfig"),
        dir.join("tokens.csv"),
        dir.join("nodes/n1.kubeconfig"),
    ];
    let dirs = vec![dir.to_path_buf(), dir.join("pki"), dir.join("nodes")];
    for e in std::fs::read_dir(dir.join("pki")).unwrap() {
        files.push(e.unwrap().path());
    }
    (files, dirs)
}

fn assert_private(dir: &Path) {
    let (files, dirs) = secrets(dir);
    assert!(files.iter().any(|f| f.ends_with("pki/ca.key")));
    assert!(files.iter().any(|f| f.ends_with("pki/apiserver.key")));
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    for d in &dirs {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_keys_kubeconfigs_and_tokens_are_root_only_also_after_a_loose_install() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cp");
    std::fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o755);
    std::fs::write(dir.join("tokens.csv"), "t0k3n,alice,1\n").unwrap();
    chmod(&dir.join("tokens.csv"), 0o644);
    let handle = common::start_in(&dir, ApiConfig::default()).await;
    nodus_control_plane::pki::issue_node_kubeconfig(&dir, "n1", &handle.url).unwrap();
    assert_private(&dir);
    handle.shutdown().await;

    // An install from before: everything readable by all.
    let (files, dirs) = secrets(&dir);
    for f in &files {
        chmod(f, 0o644);
    }
    for d in &dirs {
        chmod(d, 0o755);
    }
    let handle = common::start_in(&dir, ApiConfig::default()).await;
    assert_private(&dir);
    let out = common::kubectl_with(&handle.kubeconfig, &["get", "--raw", "/readyz"], None).await;
    assert_eq!(out.ok(), "ok");
    handle.shutdown().await;
}

fn raise_nofile() {
    let n = nodus_serving::rlimit::raise_nofile_limit().expect("raise RLIMIT_NOFILE");
    assert!(
        n >= 12_000,
        "the test needs 12000 open files, the hard limit is {n}"
    );
}

/// Reads until the peer closes the connection; false if it is still open after `bound`.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(s: &mut S, bound: Duration) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(bound, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_sockets_leave_readyz_answering_and_are_closed() {
    let _one = EXCLUSIVE.lock().await;
    raise_nofile();
    let c = common::start().await;
    let addr = c.handle.addr;
    let mut idle = Vec::with_capacity(10_000);
    for _ in 0..10_000 {
        idle.push(
            tokio::net::TcpStream::connect(addr)
                .await
                .expect("connect an idle socket"),
        );
    }
    let out = c.kubectl(&["get", "--raw", "/readyz"]).await;
    assert_eq!(out.ok(), "ok");
    let client = c.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("while-flooded", "x"))
        .await
        .expect("a write while 10000 sockets are open");
    // The silent sockets are closed by the server (the handshake timeout, or sooner when
    // newer handshakes push them out), none is left hanging.
    for s in idle.iter_mut().step_by(97) {
        assert!(
            closed_within(s, Duration::from_secs(60)).await,
            "an idle socket was still open after 60 s"
        );
    }
    drop(idle);
    c.handle.shutdown().await;
}

async fn tls_connect(
    c: &common::Cluster,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(c.dir.path().join("pki/ca.crt")).unwrap();
    for cert in rustls_pemfile::certs(&mut ca.as_slice()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(c.handle.addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .expect("TLS handshake")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_half_a_header_is_cut_off() {
    let c = common::start().await;
    // A whole request on the same kind of connection is answered.
    let mut whole = tls_connect(&c).await;
    whole
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    whole.read_to_string(&mut answer).await.ok();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let mut slow = tls_connect(&c).await;
    slow.write_all(b"GET /readyz HTTP/1.1\r\nHost: local")
        .await
        .unwrap();
    slow.flush().await.unwrap();
    assert!(
        closed_within(&mut slow, Duration::from_secs(60)).await,
        "a half-sent header kept its connection for 60 s"
    );
    c.handle.shutdown().await;
}

fn cm(name: &str, data: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"blob": data}})).unwrap()
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Updates of a 100 KB ConfigMap; with the watch history bounded to 4 MiB here (64 MiB by
/// default) the count stays small enough for a test (bench/hardening.sh runs 3,000).
const UPDATES: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_updates_keep_memory_and_the_store_file_bounded() {
    let _one = EXCLUSIVE.lock().await;
    let api = ApiConfig {
        watch_history: nodus_control_plane::storage::HistoryLimit {
            events: 50_000,
            bytes: 4 << 20,
        },
        ..ApiConfig::default()
    };
    let c = common::start_with(api).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client().await, "default");
    let first = cms
        .create(&PostParams::default(), &cm("big", "start"))
        .await
        .expect("create");
    let first_rv = first.metadata.resource_version.clone().unwrap();
    let rss_before = rss_bytes();
    let store = c.dir.path().join("store.redb");
    let blob: String = "0123456789abcdef".repeat(100 * 1024 / 16);
    for i in 0..UPDATES {
        let body = cm("big", &format!("{i}{blob}"));
        cms.replace("big", &PostParams::default(), &body)
            .await
            .unwrap_or_else(|e| panic!("update {i}: {e}"));
    }
    let rss_after = rss_bytes();
    let file = std::fs::metadata(&store).unwrap().len();
    eprintln!(
        "RSS {} MiB -> {} MiB, store.redb {} MiB",
        rss_before >> 20,
        rss_after >> 20,
        file >> 20
    );
    // Without the byte bound the history alone holds 400 × 2 versions × 100 KB (80 MB) in
    // memory and in the file, which grew to ~105 MiB.
    assert!(
        rss_after.saturating_sub(rss_before) < 200 << 20,
        "RSS grew from {} MiB to {} MiB",
        rss_before >> 20,
        rss_after >> 20
    );
    assert!(file < 48 << 20, "store.redb is {} MiB", file >> 20);

    // The first versions were compacted away: a watch from there gets 410 Gone.
    let mut old = cms
        .watch(&WatchParams::default(), &first_rv)
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(10), old.next())
        .await
        .expect("an answer in time");
    match ev {
        Some(Ok(WatchEvent::Error(e))) => {
            assert_eq!(e.code, 410);
            assert!(
                e.message
                    .starts_with(&format!("too old resource version: {first_rv} (")),
                "{}",
                e.message
            );
        }
        Some(Err(kube::Error::Api(e))) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    // A recent version is still watchable.
    let latest = cms.get("big").await.unwrap();
    let rv: u64 = latest.metadata.resource_version.unwrap().parse().unwrap();
    let mut recent = cms
        .watch(&WatchParams::default(), &(rv - 1).to_string())
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(10), recent.next())
        .await
        .expect("an event in time");
    assert!(matches!(ev, Some(Ok(WatchEvent::Modified(_)))), "{ev:?}");
    c.handle.shutdown().await;
}
