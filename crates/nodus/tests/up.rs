//! `nodus up`: one command starts the cluster, prints where the kubeconfig is and what to
//! type next, and real kubectl works against it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn up_prints_the_kubeconfig_and_kubectl_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["up", "--no-node", "--secure-port", "0", "--data-dir"])
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
