//! `nodus crictl` pod and container commands against a real `nodus runtime` test node (its
//! own network namespace and cgroup parent, CNI bridge, busybox imported from an OCI
//! archive): runp → create → start → ps → logs → inspect → stats → stop → rm → stopp → rmp,
//! with crictl's columns and JSON, and the event stream.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SUBNET: &str = "10.98.0.0/24";

/// A test node: netns, CNI config, runtime with busybox imported.
fn node() -> BareNode {
    BareNode::new(SUBNET)
}

fn crictl_cmd(endpoint: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(nodus_bin());
    cmd.arg("crictl")
        .arg("--runtime-endpoint")
        .arg(endpoint)
        .args(args);
    cmd
}

fn crictl(endpoint: &str, args: &[&str]) -> (bool, String, String) {
    let out = crictl_cmd(endpoint, args)
        .output()
        .expect("run nodus crictl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(endpoint: &str, args: &[&str]) -> String {
    let (success, out, err) = crictl(endpoint, args);
    assert!(success, "crictl {args:?} failed: {err}\nstdout: {out}");
    out
}

/// Cells of a crictl table line: columns are separated by at least three spaces (and
/// no cell holds two spaces in a row).
fn cells(line: &str) -> Vec<String> {
    line.split("  ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn table(out: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = out.lines();
    let header = cells(lines.next().unwrap_or_default());
    (header, lines.map(cells).collect())
}

/// A child process (killed on drop if still running) whose output is collected.
struct Bg(Option<Child>);

impl Bg {
    fn spawn(endpoint: &str, args: &[&str]) -> Bg {
        let child = crictl_cmd(endpoint, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nodus crictl");
        Bg(Some(child))
    }

    /// Waits for the process to exit by itself; returns (success, stdout, stderr).
    fn wait(&mut self, timeout: Duration) -> (bool, String, String) {
        let mut child = self.0.take().expect("child");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let out = child.wait_with_output().unwrap();
                return (
                    status.success(),
                    String::from_utf8_lossy(&out.stdout).into_owned(),
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "process did not exit within {timeout:?}; stdout: {} stderr: {}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Removes every pod (and so container) on drop, so a failed assertion leaves no
/// containers behind in the test's cgroup.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = crictl_cmd(&self.0, &["rmp", "-f", "-a"]).output();
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn crictl_pod_and_container_lifecycle() {
    if !have_root() {
        return;
    }
    let n = node();
    let ep = n.rt.endpoint();
    let _cleanup = Cleanup(ep.clone());
    // Container events for the whole lifecycle: created, started, stopped, deleted.
    let mut events = Bg::spawn(&ep, &["events", "--count", "4"]);
    // Start the lifecycle only once the daemon has the subscriber, or early events are lost.
    for _ in 0..200 {
        if n.rt.log().contains("event subscriber connected") {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(
        n.rt.log().contains("event subscriber connected"),
        "events never subscribed"
    );

    let logs = n.dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    // crictl's own config format: the Go field names (snake_case).
    let pod_cfg = write(
        n.dir.path(),
        "pod.json",
        &serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "uid-web", "attempt": 0},
            "hostname": "web",
            "log_directory": logs,
            "labels": {"app": "web"},
            "linux": {"cgroup_parent": n.cgroup.path()}
        })
        .to_string(),
    );
    // The container config in YAML.
    let ctr_cfg = write(
        n.dir.path(),
        "container.yaml",
        "metadata:\n  name: main\nimage:\n  image: docker.io/library/busybox:latest\n\
         command:\n- sh\n- -c\n\
         - trap 'exit 0' TERM; echo hello; echo oops >&2; while :; do sleep 0.2; done\n\
         log_path: main.log\n\
         labels:\n  io.kubernetes.pod.name: web\n  io.kubernetes.pod.namespace: default\n",
    );
    let pod = ok(&ep, &["runp", pod_cfg.to_str().unwrap()])
        .trim()
        .to_string();
    assert!(
        pod.len() >= 13 && pod.chars().all(|c| c.is_ascii_hexdigit()),
        "runp prints the pod id: {pod:?}"
    );
    let (header, rows) = table(&ok(&ep, &["pods"]));
    assert_eq!(
        header,
        [
            "POD ID",
            "CREATED",
            "STATE",
            "NAME",
            "NAMESPACE",
            "ATTEMPT",
            "RUNTIME"
        ]
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][0], pod[..13]);
    assert!(rows[0][1].ends_with(" ago"), "{rows:?}");
    assert_eq!(rows[0][2..], ["Ready", "web", "default", "0", "(default)"]);
    assert_eq!(ok(&ep, &["pods", "-q"]).trim(), pod);
    assert_eq!(ok(&ep, &["pods", "--name", "^w.b$", "-q"]).trim(), pod);
    assert_eq!(
        ok(&ep, &["pods", "--namespace", "kube-system", "-q"]).trim(),
        ""
    );
    assert_eq!(ok(&ep, &["pods", "--label", "app=web", "-q"]).trim(), pod);
    let inspectp: Value = serde_json::from_str(&ok(&ep, &["inspectp", &pod])).unwrap();
    assert_eq!(inspectp["status"]["state"], "SANDBOX_READY", "{inspectp}");
    assert!(
        inspectp["status"]["network"]["ip"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.98.0.")),
        "{inspectp}"
    );
    assert!(
        inspectp["status"]["createdAt"]
            .as_str()
            .is_some_and(|t| t.contains('T')),
        "createdAt as RFC 3339: {inspectp}"
    );

    let ctr = ok(
        &ep,
        &[
            "create",
            &pod,
            ctr_cfg.to_str().unwrap(),
            pod_cfg.to_str().unwrap(),
        ],
    )
    .trim()
    .to_string();
    assert!(ctr.len() >= 13, "create prints the container id: {ctr:?}");
    let (_, rows) = table(&ok(&ep, &["ps", "-a"]));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][3], "Created", "{rows:?}");
    assert_eq!(ok(&ep, &["ps", "-q"]).trim(), "", "ps shows running only");

    assert_eq!(ok(&ep, &["start", &ctr]).trim(), ctr);
    let (header, rows) = table(&ok(&ep, &["ps"]));
    assert_eq!(
        header,
        [
            "CONTAINER",
            "IMAGE",
            "CREATED",
            "STATE",
            "NAME",
            "ATTEMPT",
            "POD ID",
            "POD",
            "NAMESPACE"
        ]
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row[0], ctr[..13]);
    assert!(!row[1].is_empty());
    assert!(row[2].ends_with(" ago"), "{row:?}");
    assert_eq!(
        row[3..],
        ["Running", "main", "0", &pod[..13], "web", "default"]
    );
    let (_, rows) = table(&ok(&ep, &["ps", "--no-trunc"]));
    assert_eq!(
        (rows[0][0].as_str(), rows[0][6].as_str()),
        (ctr.as_str(), pod.as_str())
    );
    assert_eq!(ok(&ep, &["ps", "-q", "--name", "ma"]).trim(), ctr);
    assert_eq!(ok(&ep, &["ps", "-q", "--name", "^x"]).trim(), "");
    assert_eq!(ok(&ep, &["ps", "-q", "--pod", &pod]).trim(), ctr);
    assert_eq!(ok(&ep, &["ps", "-q", "--namespace", "^def"]).trim(), ctr);
    let ps: Value = serde_json::from_str(&ok(&ep, &["ps", "-o", "json"])).unwrap();
    assert_eq!(ps["containers"][0]["id"], ctr.as_str(), "{ps}");
    assert_eq!(ps["containers"][0]["state"], "CONTAINER_RUNNING");
    assert!(
        ps["containers"][0]["createdAt"].is_string(),
        "int64 as a string"
    );
    let yaml = ok(&ep, &["ps", "-o", "yaml"]);
    assert!(yaml.starts_with("containers:\n- "), "{yaml}");
    assert!(yaml.contains("state: CONTAINER_RUNNING"), "{yaml}");

    // Logs: stdout and stderr lines to the matching streams.
    let (mut out, mut err) = (String::new(), String::new());
    for _ in 0..100 {
        let (success, o, e) = crictl(&ep, &["logs", &ctr]);
        assert!(success, "{e}");
        (out, err) = (o, e);
        if out.contains("hello") && err.contains("oops") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(out, "hello\n");
    assert_eq!(err, "oops\n");
    let ts = ok(&ep, &["logs", "--timestamps", "--stream", "stdout", &ctr]);
    let (stamp, line) = ts.trim_end().split_once(' ').unwrap();
    assert_eq!(line, "hello");
    assert!(
        stamp.len() >= 30 && stamp.as_bytes()[10] == b'T' && stamp.as_bytes()[19] == b'.',
        "RFC 3339 with nine fractional digits: {stamp}"
    );
    let (success, out, err) = crictl(&ep, &["logs", "--since", "1h", &ctr]);
    assert!(
        success && out == "hello\n" && err == "oops\n",
        "{out} {err}"
    );
    let (_, out, err) = crictl(&ep, &["logs", "--since", "2999-01-01T00:00:00Z", &ctr]);
    assert_eq!((out.as_str(), err.as_str()), ("", ""));
    // Followed until the container exits.
    let mut follow = Bg::spawn(&ep, &["logs", "-f", &ctr]);

    let inspect: Value = serde_json::from_str(&ok(&ep, &["inspect", &ctr])).unwrap();
    assert_eq!(inspect["status"]["state"], "CONTAINER_RUNNING", "{inspect}");
    assert_eq!(inspect["status"]["id"], ctr.as_str());
    assert_eq!(inspect["status"]["metadata"]["name"], "main");
    assert_eq!(inspect["status"]["finishedAt"], "0001-01-01T00:00:00Z");
    assert!(
        inspect["status"]["logPath"]
            .as_str()
            .is_some_and(|p| p.ends_with("main.log")),
        "{inspect}"
    );
    let table_view = ok(&ep, &["inspect", "-o", "table", &ctr]);
    assert!(
        table_view.contains("State: CONTAINER_RUNNING\n") && table_view.contains("Name: main\n"),
        "{table_view}"
    );

    // Stats: the runtime may report zeros; the commands run and print their header.
    let stats = ok(&ep, &["stats", "-a"]);
    assert_eq!(
        cells(stats.lines().next().unwrap_or_default()),
        ["CONTAINER", "NAME", "CPU %", "MEM", "DISK", "INODES"],
        "{stats}"
    );
    let statsp = ok(&ep, &["statsp"]);
    assert_eq!(
        cells(statsp.lines().next().unwrap_or_default()),
        ["POD", "POD ID", "CPU %", "MEM"],
        "{statsp}"
    );
    let stats_json: Value = serde_json::from_str(&ok(&ep, &["stats", "-o", "json"])).unwrap();
    assert!(stats_json["stats"].is_array(), "{stats_json}");

    // rm refuses a running container.
    let (success, _, err) = crictl(&ep, &["rm", &ctr]);
    assert!(
        !success && err.contains("is running, please stop it first"),
        "{err}"
    );

    assert_eq!(ok(&ep, &["stop", "-t", "5", &ctr]).trim(), ctr);
    let (_, rows) = table(&ok(&ep, &["ps"]));
    assert!(rows.is_empty(), "{rows:?}");
    let (_, rows) = table(&ok(&ep, &["ps", "-a"]));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][3], "Exited", "{rows:?}");
    assert_eq!(ok(&ep, &["ps", "-q", "--state", "exited"]).trim(), ctr);
    let inspect: Value = serde_json::from_str(&ok(&ep, &["inspect", &ctr])).unwrap();
    assert_eq!(inspect["status"]["state"], "CONTAINER_EXITED");
    assert_ne!(inspect["status"]["finishedAt"], "0001-01-01T00:00:00Z");

    let (success, out, err) = follow.wait(Duration::from_secs(10));
    assert!(success, "logs -f: {err}");
    assert_eq!(out, "hello\n", "logs -f: {err}");

    let log_file = logs.join("main.log");
    assert!(log_file.exists());
    assert_eq!(ok(&ep, &["rm", &ctr]).trim(), ctr);
    assert!(!log_file.exists(), "crictl rm removes the container's log");
    let (_, rows) = table(&ok(&ep, &["ps", "-a"]));
    assert!(rows.is_empty(), "{rows:?}");
    let (success, _, err) = crictl(&ep, &["inspect", &ctr]);
    assert!(!success && err.contains("code = NotFound"), "{err}");

    assert_eq!(
        ok(&ep, &["stopp", &pod]).trim(),
        format!("Stopped sandbox {pod}")
    );
    let (_, rows) = table(&ok(&ep, &["pods"]));
    assert_eq!(rows[0][2], "NotReady", "{rows:?}");
    assert_eq!(
        ok(&ep, &["rmp", &pod]).trim(),
        format!("Removed sandbox {pod}")
    );
    let (header, rows) = table(&ok(&ep, &["pods"]));
    assert_eq!(header.len(), 7);
    assert!(rows.is_empty(), "{rows:?}");

    let (success, out, err) = events.wait(Duration::from_secs(10));
    assert!(success, "events: {err}");
    let evs: Vec<Value> = serde_json::Deserializer::from_str(&out)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("events output is JSON documents: {e}: {out}"));
    let kinds: Vec<&str> = evs
        .iter()
        .filter(|e| e["containerId"] == ctr.as_str())
        .map(|e| e["containerEventType"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        kinds,
        [
            "CONTAINER_CREATED_EVENT",
            "CONTAINER_STARTED_EVENT",
            "CONTAINER_STOPPED_EVENT",
            "CONTAINER_DELETED_EVENT"
        ],
        "{out}"
    );

    // --all and --force: a second pod (config in YAML, camelCase names) with a running
    // container that ignores SIGTERM.
    let pod2_cfg = write(
        n.dir.path(),
        "pod2.yaml",
        &format!(
            "metadata:\n  name: db\n  namespace: default\nlogDirectory: {}\n\
             linux:\n  cgroupParent: {}\n",
            logs.display(),
            n.cgroup.path()
        ),
    );
    let ctr2_cfg = write(
        n.dir.path(),
        "c2.json",
        r#"{"metadata": {"name": "sleeper"}, "image": {"image": "busybox"},
            "command": ["sleep", "3600"], "logPath": "sleeper.log"}"#,
    );
    let pod2 = ok(&ep, &["runp", pod2_cfg.to_str().unwrap()])
        .trim()
        .to_string();
    let ctr2 = ok(
        &ep,
        &[
            "create",
            &pod2,
            ctr2_cfg.to_str().unwrap(),
            pod2_cfg.to_str().unwrap(),
        ],
    )
    .trim()
    .to_string();
    ok(&ep, &["start", &ctr2]);
    let (success, _, err) = crictl(&ep, &["rmp", "-a"]);
    assert!(
        !success && err.contains("is running, please stop it first"),
        "{err}"
    );
    assert_eq!(ok(&ep, &["stop", "-a"]).trim(), ctr2);
    assert_eq!(
        ok(&ep, &["stop", "-a"]).trim(),
        "No running containers found."
    );
    assert_eq!(ok(&ep, &["rm", "-a"]).trim(), ctr2);
    assert_eq!(
        ok(&ep, &["rmp", "-a", "-f"]),
        format!("Stopped sandbox {pod2}\nRemoved sandbox {pod2}\n")
    );
    assert_eq!(ok(&ep, &["pods", "-q"]).trim(), "");

    // Usage errors.
    let (success, _, err) = crictl(&ep, &["ps", "--state", "sleeping"]);
    assert!(
        !success && err.contains("--state should be one of"),
        "{err}"
    );
    let (success, _, _) = crictl(&ep, &["ps", "--no-such-flag"]);
    assert!(!success, "unknown flags are errors");
    let (success, _, err) = crictl(&ep, &["pods", "--name", "("]);
    assert!(
        !success && err.contains("invalid regular expression"),
        "{err}"
    );
    let (success, _, err) = crictl(&ep, &["runp", "/nonexistent/pod.json"]);
    assert!(!success && err.contains("not found"), "{err}");
}
