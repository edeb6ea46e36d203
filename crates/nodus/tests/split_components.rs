//! kubeadm's split of the control plane as host processes on free 127.0.0.1 ports:
//! `nodus kube-apiserver` alone holds the objects (its embedded store, a file no other
//! process may open), and `nodus kube-controller-manager` and `nodus kube-scheduler` run
//! apart with nothing but a kubeconfig each (kubeadm's controller-manager.conf and
//! scheduler.conf: users `system:kube-controller-manager` and `system:kube-scheduler`,
//! authorized by their bootstrap ClusterRoles), reaching every object through the REST API.
//! Driven by the real kubectl: both Leases are held, a Deployment's pods are made by the
//! manager (admitted once, by the server), bound by the scheduler (pods/binding) with its
//! event, scaled down by a graceful delete, garbage-collected with their Deployment; a
//! namespace is emptied and finalized. Flags that mix the two ways to reach the objects
//! fail with a message naming them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::etcd::{free_port, kubectl};
use serde_json::Value;

/// A process started here, killed by PID and reaped on drop.
struct Proc {
    child: Child,
    args: Vec<String>,
    log: PathBuf,
}

impl Proc {
    fn start(args: &[&str], log: PathBuf) -> Proc {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Proc {
            child: Proc::spawn(&args, &log),
            args,
            log,
        }
    }

    fn spawn(args: &[String], log: &Path) -> Child {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        Command::new(env!("CARGO_BIN_EXE_nodus"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("nodus starts")
    }

    /// SIGKILL, then the same command again.
    fn kill_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Proc::spawn(&self.args, &self.log);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Cluster {
    dir: tempfile::TempDir,
    procs: Vec<(&'static str, Proc)>,
}

impl Cluster {
    fn kc(&self) -> PathBuf {
        self.dir.path().join("cp/admin.kubeconfig")
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|(n, p)| format!("--- {n}:\n{}\n", p.log()))
            .collect()
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        kubectl(&self.kc(), &self.home(), args, stdin)
    }

    fn get(&self, args: &[&str]) -> Option<Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let (ok, out, _) = self.kubectl(&all, None);
        ok.then(|| serde_json::from_str(&out).ok()).flatten()
    }

    /// Polls `kubectl get ARGS -o json` until `pred` holds; panics with the last value and
    /// every component's log.
    fn wait(&self, args: &[&str], what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let got = self.get(args);
            if let Some(v) = &got
                && pred(v)
            {
                return v.clone();
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what}: {got:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// The API server on the embedded store, then the two components with their own
/// kubeconfigs.
fn split_cluster() -> Cluster {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("home")).expect("home");
    let data = dir.path().join("cp");
    let port = free_port();
    let data_s = data.display().to_string();
    let apiserver = Proc::start(
        &[
            "kube-apiserver",
            "--data-dir",
            &data_s,
            "--secure-port",
            &port.to_string(),
        ],
        dir.path().join("apiserver.log"),
    );
    let mut cluster = Cluster {
        dir,
        procs: vec![("kube-apiserver", apiserver)],
    };
    let started = Instant::now();
    while !cluster.kc().exists() || !cluster.kubectl(&["get", "ns", "default"], None).0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the API server did not answer:\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let url = format!("https://127.0.0.1:{port}");
    for (role, file, user) in [
        (
            "kube-controller-manager",
            "controller-manager.conf",
            "system:kube-controller-manager",
        ),
        ("kube-scheduler", "scheduler.conf", "system:kube-scheduler"),
    ] {
        let kubeconfig =
            nodus_control_plane::pki::issue_user_kubeconfig(&data, file, user, &[], &url)
                .expect("kubeconfig");
        let proc = Proc::start(
            &[
                role,
                "--data-dir",
                &data_s,
                "--kubeconfig",
                &kubeconfig.display().to_string(),
                "--secure-port",
                &free_port().to_string(),
                // The Node below has no kubelet: it stays Ready for the test.
                "--node-monitor-grace-period=10m",
                "--node-startup-grace-period=10m",
            ],
            cluster.dir.path().join(format!("{role}.log")),
        );
        cluster.procs.push((role, proc));
    }
    cluster
}

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().cloned().unwrap_or_default()
}

#[test]
fn controller_manager_and_scheduler_reach_the_objects_only_through_the_api_server() {
    let mut c = split_cluster();
    for lease in ["kube-controller-manager", "kube-scheduler"] {
        c.wait(
            &["lease", "-n", "kube-system", lease],
            &format!("the {lease} Lease held"),
            |l| {
                l["spec"]["holderIdentity"]
                    .as_str()
                    .is_some_and(|h| !h.is_empty())
            },
        );
    }

    let (ok, _, err) = c.kubectl(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\nstatus:\n  allocatable: {cpu: '4', memory: 4Gi, pods: '20'}\n  conditions:\n  - {type: Ready, status: 'True', reason: KubeletReady, message: kubelet is posting ready status}\n",
        ),
    );
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(
        &[
            "create",
            "deployment",
            "web",
            "--image=busybox",
            "--replicas=2",
        ],
        None,
    );
    assert!(ok, "{err}");
    let pods = c.wait(&["pods", "-l", "app=web"], "two pods bound to n1", |v| {
        let p = items(v);
        p.len() == 2 && p.iter().all(|p| p["spec"]["nodeName"] == "n1")
    });
    for p in items(&pods) {
        let name = p["metadata"]["name"].as_str().unwrap_or("");
        // Admitted by the server once: one projected service-account token volume.
        let tokens = p["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| {
                v["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("kube-api-access-"))
            })
            .count();
        assert_eq!(tokens, 1, "{p}");
        assert_eq!(
            p["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet",
            "{p}"
        );
        let scheduled = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "PodScheduled")
            .cloned()
            .unwrap_or_default();
        assert_eq!(scheduled["status"], "True", "{p}");
        let want = format!("Successfully assigned default/{name} to n1");
        c.wait(
            &[
                "events",
                "--field-selector",
                &format!("involvedObject.name={name}"),
            ],
            &format!("the Scheduled event of {name}"),
            |v| {
                items(v)
                    .iter()
                    .any(|e| e["reason"] == "Scheduled" && e["message"] == want.as_str())
            },
        );
    }
    c.wait(&["deployment", "web"], "the Deployment available", |d| {
        d["status"]["replicas"] == 2 && d["status"]["observedGeneration"] == 1
    });

    // Scale down: the ReplicaSet controller's delete is the API's graceful one (a bound
    // pod is marked, its kubelet would finish it).
    let (ok, _, err) = c.kubectl(&["scale", "deployment", "web", "--replicas=1"], None);
    assert!(ok, "{err}");
    c.wait(&["pods", "-l", "app=web"], "one pod terminating", |v| {
        let p = items(v);
        p.iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_string())
            .count()
            == 1
            && p.iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .count()
                == 1
    });

    // A namespace gets its default ServiceAccount, and is emptied and finalized when
    // deleted (namespaces/finalize).
    let (ok, _, err) = c.kubectl(&["create", "namespace", "scratch"], None);
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(&["create", "configmap", "x", "-n", "scratch"], None);
    assert!(ok, "{err}");
    c.wait(
        &["serviceaccount", "default", "-n", "scratch"],
        "the default ServiceAccount",
        |_| true,
    );
    let (ok, _, err) = c.kubectl(&["delete", "namespace", "scratch", "--wait=false"], None);
    assert!(ok, "{err}");
    let started = Instant::now();
    loop {
        let (ok, _, err) = c.kubectl(&["get", "namespace", "scratch"], None);
        if !ok && err.contains("NotFound") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "namespace scratch not finalized: {:?}\n{}",
            c.get(&["namespace", "scratch"]),
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // Garbage collection: the Deployment's ReplicaSet goes with it.
    let (ok, _, err) = c.kubectl(&["delete", "deployment", "web"], None);
    assert!(ok, "{err}");
    c.wait(
        &["replicasets", "-l", "app=web"],
        "the ReplicaSet collected",
        |v| items(v).is_empty(),
    );

    // The API server killed and started again: both components resume their watches (or
    // list again) and go on working.
    c.procs[0].1.kill_and_restart();
    let started = Instant::now();
    while !c.kubectl(&["get", "ns", "default"], None).0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the API server did not come back:\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (ok, _, err) = c.kubectl(
        &[
            "create",
            "deployment",
            "after",
            "--image=busybox",
            "--replicas=1",
        ],
        None,
    );
    assert!(ok, "{err}");
    c.wait(
        &["pods", "-l", "app=after"],
        "a pod of the next Deployment bound",
        |v| {
            let p = items(v);
            p.len() == 1 && p[0]["spec"]["nodeName"] == "n1"
        },
    );

    // Neither component opened the store: the API server's embedded file is its alone.
    for (name, p) in &c.procs[1..] {
        assert!(
            p.log()
                .contains("reaching the objects through the API server"),
            "{name}:\n{}",
            p.log()
        );
    }
}

fn fails_with(args: &[&str], want: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(args)
        .output()
        .expect("nodus runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
}

#[test]
fn the_two_ways_to_reach_the_objects_do_not_mix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    let kc = Path::new(&d).join("x.conf").display().to_string();
    fails_with(
        &[
            "kube-controller-manager",
            "--data-dir",
            &d,
            "--kubeconfig",
            &kc,
            "--etcd-servers",
            "http://127.0.0.1:1",
        ],
        "the objects are reached through the API server or in etcd, not both",
    );
    fails_with(
        &["kube-apiserver", "--data-dir", &d, "--kubeconfig", &kc],
        "kube-apiserver keeps the objects itself",
    );
    fails_with(
        &["kube-scheduler", "--data-dir", &d, "--secure-port=0"],
        "give --kubeconfig",
    );
}
