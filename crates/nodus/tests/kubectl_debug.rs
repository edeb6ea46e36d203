//! Ephemeral containers end to end, through `nodus up` and the real kubectl: `kubectl debug
//! --target` adds a debugger to a running pod through the `pods/ephemeralcontainers`
//! subresource (a strategic merge patch), the kubelet starts it in the pod's sandbox in the
//! process namespace of the target container, so `ps` shows the app's `sleep`; the pod's
//! status lists it; `kubectl logs -c`, `kubectl debug -i` (attach) and `kubectl debug -it`
//! (attach with a TTY, kubectl under a pseudo-terminal) reach it; and the
//! changes upstream forbids get upstream's 422 texts.

mod common;

use common::up::Up;
use serde_json::Value;

const POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox:stable
    command: ["sleep", "3600"]
"#;

fn ephemeral_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["status"]["ephemeralContainerStatuses"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)
}

/// `kubectl replace --raw` of the pod's ephemeralcontainers subresource (a PUT) with `pod`.
fn put_ephemeral(up: &Up, pod: &Value) -> (bool, String, String) {
    let kubeconfig = up.d().join("up/control-plane/admin.kubeconfig");
    common::cluster::kubectl(
        &up.netns,
        &kubeconfig,
        up.d(),
        &[
            "replace",
            "--raw",
            "/api/v1/namespaces/default/pods/web/ephemeralcontainers",
            "-f",
            "-",
        ],
        Some(&pod.to_string()),
    )
}

#[test]
fn kubectl_debug_shares_the_target_containers_processes() {
    if !common::have_root() {
        return;
    }
    let up = Up::start("nodus-debug", "10.99.95.0/24", "debug-node");
    up.apply(POD);
    up.running("web");

    // Discovery lists the subresource as upstream does (kind Pod; get, patch, update).
    let (ok, out, err) = up.k(&["get", "--raw", "/api/v1"]);
    assert!(ok, "{err}");
    let v1: Value = serde_json::from_str(&out).expect("discovery JSON");
    let sub = v1["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == "pods/ephemeralcontainers")
        .unwrap_or_else(|| panic!("pods/ephemeralcontainers not in discovery: {out}"));
    assert_eq!(sub["kind"], "Pod", "{sub}");
    let mut verbs: Vec<&str> = sub["verbs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    verbs.sort_unstable();
    assert_eq!(verbs, ["get", "patch", "update"], "{sub}");

    // The debugger joins app's process namespace: its `ps` sees app's `sleep 3600`.
    let (ok, out, err) = up.k(&[
        "debug",
        "web",
        "--image=busybox:stable",
        "--target=app",
        "-c",
        "debugger",
        "--",
        "ps",
    ]);
    assert!(ok, "kubectl debug: {out}{err}\n{}", up.log());
    let pod = up.wait(
        &["get", "pod", "web", "-o", "json"],
        "the debugger terminated",
        |p| {
            ephemeral_status(p, "debugger")
                .is_some_and(|s| s["state"]["terminated"]["exitCode"] == 0)
        },
    );
    let spec = &pod["spec"]["ephemeralContainers"][0];
    assert_eq!(spec["name"], "debugger", "{spec}");
    assert_eq!(spec["targetContainerName"], "app", "{spec}");
    let st = ephemeral_status(&pod, "debugger").expect("status");
    assert_eq!(st["restartCount"], 0, "{st}");
    assert!(
        st["containerID"]
            .as_str()
            .is_some_and(|id| id.contains("://")),
        "{st}"
    );
    let (ok, logs, err) = up.k(&["logs", "web", "-c", "debugger"]);
    assert!(ok, "kubectl logs -c debugger: {err}");
    assert!(
        logs.lines().any(|l| l.trim_end().ends_with("sleep 3600")),
        "the debugger's ps does not show app's process:\n{logs}"
    );
    // The app container was not disturbed.
    assert_eq!(pod["status"]["phase"], "Running", "{}", pod["status"]);
    assert_eq!(
        pod["status"]["containerStatuses"][0]["restartCount"], 0,
        "{}",
        pod["status"]
    );

    // Interactive: `kubectl debug -i` waits for the container and attaches to it.
    let kubeconfig = up.d().join("up/control-plane/admin.kubeconfig");
    let (ok, out, err) = common::cluster::kubectl(
        &up.netns,
        &kubeconfig,
        up.d(),
        &[
            "debug",
            "-i",
            "web",
            "--image=busybox:stable",
            "--target=app",
            "-c",
            "shell",
            "--",
            "sh",
            "-c",
            "ps; echo debug-done",
        ],
        Some(""),
    );
    assert!(ok, "kubectl debug -i: {out}{err}\n{}", up.log());
    assert!(
        out.contains("sleep 3600") && out.contains("debug-done"),
        "kubectl debug -i output:\n{out}{err}"
    );

    // Attach for real: the debugger blocks reading its stdin, which only an attached
    // kubectl can feed (a fallback to the log would never see the line).
    let mut cmd = up.netns.command("timeout").expect("timeout in netns");
    cmd.arg("60")
        .arg("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "debug",
            "-i",
            "web",
            "--image=busybox:stable",
            "--target=app",
            "-c",
            "reader",
            "--",
            "sh",
            "-c",
            "read line; echo got $line",
        ])
        .env("HOME", up.d())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn kubectl debug -i");
    // As a user at a terminal does: type the line and keep stdin open until the answer is
    // back. (Closing stdin at once races the echo against the end of the attach session.)
    let mut stdin = child.stdin.take().expect("stdin");
    {
        use std::io::Write as _;
        stdin.write_all(b"hello-from-stdin\n").expect("write stdin");
    }
    let mut stdout_pipe = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        use std::io::Read as _;
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout_pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&seen).into_owned()
    });
    // kubectl ends when the debugger exits after its echo; `timeout 60` bounds it.
    let status = child.wait().expect("kubectl debug -i");
    drop(stdin);
    let stdout = reader.join().expect("stdout reader");
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read as _;
        let _ = e.read_to_string(&mut stderr);
    }
    assert!(
        status.success() && stdout.contains("got hello-from-stdin"),
        "kubectl debug -i with stdin: {status}\n{stdout}{stderr}\n{}",
        up.log()
    );

    // `kubectl debug -it` at a terminal: kubectl runs under a pseudo-terminal (`script`),
    // the debugger gets a TTY of its own, a typed command runs and its output comes back.
    let mut cmd = up.netns.command("timeout").expect("timeout in netns");
    cmd.arg("90")
        .args(["script", "-qfec"])
        .arg(format!(
            "kubectl --kubeconfig {} debug -it web --image=busybox:stable --target=app -c term -- sh",
            kubeconfig.display()
        ))
        .arg("/dev/null")
        .env("HOME", up.d())
        .env("TERM", "dumb")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn kubectl debug -it under script");
    let mut stdin = child.stdin.take().expect("stdin");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut stdout_pipe = child.stdout.take().expect("stdout");
    let reader = {
        let seen = std::sync::Arc::clone(&seen);
        std::thread::spawn(move || {
            use std::io::Read as _;
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let wait_for = |needle: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if seen.lock().unwrap().contains(needle) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        false
    };
    // kubectl says so once it is attached; what is typed before may go nowhere.
    let attached = wait_for("If you don't see a command prompt, try pressing enter.");
    {
        use std::io::Write as _;
        // The shell's results, not the terminal's echo of the typed line, carry `42`.
        stdin
            .write_all(b"tty; [ -t 0 ] && echo stdin-is-a-tty-$((6*7)); echo typed-$((40+2))\n")
            .expect("type a command");
    }
    let answered = attached && wait_for("typed-42");
    {
        use std::io::Write as _;
        let _ = stdin.write_all(b"exit\n");
    }
    let status = child.wait().expect("kubectl debug -it");
    drop(stdin);
    let _ = reader.join();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read as _;
        let _ = e.read_to_string(&mut stderr);
    }
    let out = seen.lock().unwrap().clone();
    assert!(
        answered && status.success(),
        "kubectl debug -it: attached {attached}, {status}\n{out}{stderr}\n{}",
        up.log()
    );
    assert!(out.contains("stdin-is-a-tty-42"), "no TTY inside:\n{out}");
    assert!(
        out.lines().any(|l| l.trim().starts_with("/dev/pts/")),
        "`tty` does not name a pseudo-terminal:\n{out}"
    );

    // A target that is not a container of the pod: refused by the API server.
    let (ok, out, err) = up.k(&[
        "debug",
        "web",
        "--image=busybox:stable",
        "--target=nope",
        "-c",
        "lost",
        "--",
        "true",
    ]);
    assert!(!ok, "{out}");
    assert!(
        err.contains(r#"spec.ephemeralContainers[4].targetContainerName: Not found: "nope""#),
        "{err}"
    );

    // Once added, an ephemeral container can be neither changed nor removed.
    let (ok, out, err) = up.k(&["get", "pod", "web", "-o", "json"]);
    assert!(ok, "{err}");
    let mut current: Value = serde_json::from_str(&out).expect("pod JSON");
    // Unconditional updates (pods allow them, as upstream): the kubelet's status writes
    // would otherwise turn these into 409 Conflicts before validation is reached.
    current["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("resourceVersion");
    let mut changed = current.clone();
    changed["spec"]["ephemeralContainers"][0]["image"] = "busybox:latest".into();
    let (ok, out, err) = put_ephemeral(&up, &changed);
    assert!(!ok, "{out}");
    assert!(
        err.contains(r#"Pod "web" is invalid: spec.ephemeralContainers: Forbidden: existing ephemeral containers "debugger" may not be changed"#),
        "{err}"
    );
    let mut removed = current.clone();
    removed["spec"]["ephemeralContainers"]
        .as_array_mut()
        .expect("list")
        .remove(0);
    let (ok, out, err) = put_ephemeral(&up, &removed);
    assert!(!ok, "{out}");
    assert!(
        err.contains(r#"spec.ephemeralContainers: Forbidden: existing ephemeral containers "debugger" may not be removed"#),
        "{err}"
    );
    // Ports (and probes, lifecycle, resources) are not for ephemeral containers.
    let mut ports = current.clone();
    ports["spec"]["ephemeralContainers"]
        .as_array_mut()
        .expect("list")
        .push(serde_json::json!({"name": "srv", "image": "busybox:stable",
            "ports": [{"containerPort": 80}]}));
    let (ok, out, err) = put_ephemeral(&up, &ports);
    assert!(!ok, "{out}");
    assert!(
        err.contains(
            "spec.ephemeralContainers[4].ports: Forbidden: cannot be set for an Ephemeral Container"
        ),
        "{err}"
    );
    // The pod itself cannot change its ephemeral containers, nor be created with one.
    let (ok, out, err) = up.k(&[
        "patch",
        "pod",
        "web",
        "--type=json",
        "-p",
        r#"[{"op": "add", "path": "/spec/ephemeralContainers/-", "value": {"name": "sneaky", "image": "busybox:stable"}}]"#,
    ]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("spec: Forbidden: pod updates may not change fields other than"),
        "{err}"
    );
    let err = up.create_fails(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: born-with-one\nspec:\n  containers:\n  - {name: app, image: busybox:stable}\n  ephemeralContainers:\n  - {name: dbg, image: busybox:stable}\n",
    );
    assert!(
        err.contains("spec.ephemeralContainers: Forbidden: cannot be set on create"),
        "{err}"
    );
    // None of this disturbed the debugger that ran: still there, still not restarted.
    let pod = up.wait(&["get", "pod", "web", "-o", "json"], "pod", |_| true);
    let names: Vec<&str> = pod["spec"]["ephemeralContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["debugger", "shell", "reader", "term"],
        "{}",
        pod["spec"]
    );
    assert_eq!(
        ephemeral_status(&pod, "debugger").map(|s| s["restartCount"].clone()),
        Some(0.into())
    );
}
