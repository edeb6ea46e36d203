//! `nodus control-plane` as a real process: a kill -9 in the middle of a burst of writes
//! leaves the store readable and consistent, and the restarted server keeps every object.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodus_control_plane::storage::{EmbeddedStore, Store};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn kubectl() -> &'static str {
    if Path::new("/usr/bin/kubectl").exists() {
        "/usr/bin/kubectl"
    } else {
        "kubectl"
    }
}

/// Starts the control plane and waits for its "listening" line.
fn start(dir: &Path, port: u16) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["control-plane", "--data-dir"])
        .arg(dir)
        .args(["--secure-port", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("nodus control-plane starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert!(line.contains("API server at"), "startup line: {line:?}");
    child
}

struct Killer(Child);
impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn count_configmaps(kubeconfig: &Path, home: &Path) -> Option<usize> {
    let out = Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "configmaps", "-n", "default", "-o", "name"])
        .env("HOME", home)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("configmap/burst-"))
            .count(),
    )
}

#[test]
fn kill_during_writes_leaves_a_consistent_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let port = free_port();
    let server = Killer(start(dir.path(), port));
    let kubeconfig = dir.path().join("admin.kubeconfig");

    let mut docs = String::new();
    for i in 0..2000 {
        docs.push_str(&format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: burst-{i}, namespace: default}}\ndata: {{n: \"{i}\"}}\n"
        ));
    }
    let mut writer = Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["create", "-f", "-"])
        .env("HOME", &home)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl");
    {
        use std::io::Write;
        let mut stdin = writer.stdin.take().expect("stdin");
        stdin.write_all(docs.as_bytes()).expect("write");
    }
    // Kill the server once the burst is well under way.
    let started = Instant::now();
    loop {
        let n = count_configmaps(&kubeconfig, &home).unwrap_or(0);
        if n >= 50 || started.elapsed() > Duration::from_secs(120) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = server.0.id() as i32;
    // SAFETY: kill(2) on the PID of a child this test spawned and still owns.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    drop(server);
    let _ = writer.wait();

    // The file opens and is consistent: every object parses, revisions are unique and not
    // beyond the store's revision.
    let (stored, revision) = {
        let store =
            EmbeddedStore::open(&dir.path().join("store.redb")).expect("store opens after kill -9");
        let (items, rev) = store.list("/core/configmaps/default/").expect("list");
        let mut revs: Vec<u64> = items.iter().map(|s| s.revision).collect();
        revs.sort_unstable();
        revs.dedup();
        assert_eq!(revs.len(), items.len(), "one revision per write");
        assert!(
            revs.iter().all(|r| *r <= rev),
            "no object beyond the store revision {rev}"
        );
        for s in &items {
            assert!(
                s.object.pointer("/metadata/name").is_some(),
                "object {} is whole",
                s.key
            );
        }
        let burst = items.iter().filter(|s| s.key.contains("/burst-")).count();
        (burst, rev)
    };
    assert!(
        stored >= 50,
        "writes before the kill were durable ({stored})"
    );

    let server = Killer(start(dir.path(), port));
    assert_eq!(
        count_configmaps(&kubeconfig, &home),
        Some(stored),
        "the restarted server serves the same objects"
    );
    let out = Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "create",
            "-f",
            "-",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .env("HOME", &home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            if let Some(mut i) = c.stdin.take() {
                i.write_all(b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: after-crash}\n")?;
            }
            c.wait_with_output()
        })
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rv: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("rv");
    assert!(
        rv > revision,
        "resourceVersion {rv} continues after {revision}"
    );

    // SIGTERM stops it cleanly: exit status 0.
    let mut server = server;
    // SAFETY: kill(2) on the PID of a child this test spawned and still owns.
    unsafe {
        libc::kill(server.0.id() as i32, libc::SIGTERM);
    }
    let mut status = None;
    for _ in 0..600 {
        if let Ok(Some(s)) = server.0.try_wait() {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = status.expect("the control plane exits after SIGTERM");
    assert!(status.success(), "exit status after SIGTERM: {status}");
}
