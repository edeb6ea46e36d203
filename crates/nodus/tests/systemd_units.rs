//! nodus under systemd, with the unit files the repository ships (`dist/systemd/`): each
//! unit is `Type=notify` and starts only when nodus says `READY=1`; its logs are in the
//! journal; a restart of the unit leaves the pods' containers running (the same process
//! before and after), and a stop ends cleanly.
//!
//! Runs where systemd is init (the VM lane's guest). The units are installed under
//! /run/systemd/system (gone at the next boot) with a drop-in that points ExecStart at the
//! binary under test, passes the test's directories through the unit's own `$NODUS_*_ARGS`
//! variable and runs the unit in the test's network namespace.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One test at a time: both start kubelets that own `kubepods.slice`.
static SERIAL: Mutex<()> = Mutex::new(());

const T: Duration = Duration::from_secs(240);

fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/systemd")
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn systemctl(args: &[&str]) -> (bool, String) {
    run(Command::new("systemctl").args(args))
}

fn show(unit: &str, prop: &str) -> String {
    systemctl(&["show", unit, "-p", prop, "--value"])
        .1
        .trim()
        .to_string()
}

fn journal(unit: &str) -> String {
    run(Command::new("journalctl").args(["-u", unit, "-o", "cat", "--no-pager"])).1
}

fn systemd_is_init() -> bool {
    if Path::new("/run/systemd/system").is_dir() {
        return true;
    }
    eprintln!("skipped: systemd is not the running init on this machine (no /run/systemd/system)");
    false
}

/// A repository unit installed for the test; removed (and stopped) when dropped.
struct Unit {
    name: &'static str,
}

impl Unit {
    /// Installs `dist/systemd/<name>` with ExecStart pointing at the binary under test,
    /// `args` in the unit's `$<var>` and the unit joined to `netns`.
    fn install(name: &'static str, var: &str, args: &[&Path], netns: &testkit::Netns) -> Unit {
        let text = std::fs::read_to_string(units_dir().join(name)).expect("unit file");
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("ExecStart");
        assert!(
            exec.contains(&format!("${var}")),
            "{name} passes its flags as ${var}: {exec}"
        );
        let bin = common::nodus_bin();
        let exec = exec.replace("/usr/local/bin/nodus", &bin.display().to_string());
        let args: Vec<String> = args.iter().map(|a| a.display().to_string()).collect();
        let dir = Path::new("/run/systemd/system");
        std::fs::write(dir.join(name), &text).unwrap();
        let drop_in = dir.join(format!("{name}.d"));
        std::fs::create_dir_all(&drop_in).unwrap();
        std::fs::write(
            drop_in.join("50-test.conf"),
            format!(
                "[Service]\nExecStart=\nExecStart={exec}\nEnvironment=\"{var}={}\"\nEnvironment=NODUS_LOG=info\nNetworkNamespacePath={}\n",
                args.join(" "),
                netns.path().display()
            ),
        )
        .unwrap();
        let (ok, out) = systemctl(&["daemon-reload"]);
        assert!(ok, "daemon-reload: {out}");
        Unit { name }
    }

    /// `systemctl <verb>`, which for a Type=notify unit returns once nodus sent READY=1.
    fn ctl(&self, verb: &str) {
        let (ok, out) = run(Command::new("timeout").arg(T.as_secs().to_string()).args([
            "systemctl",
            verb,
            self.name,
        ]));
        assert!(
            ok,
            "systemctl {verb} {}: {out}\n{}",
            self.name,
            journal(self.name)
        );
        if verb != "stop" {
            assert_eq!(
                show(self.name, "ActiveState"),
                "active",
                "{}",
                journal(self.name)
            );
        }
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        let _ = systemctl(&["stop", self.name]);
        let dir = Path::new("/run/systemd/system");
        let _ = std::fs::remove_dir_all(dir.join(format!("{}.d", self.name)));
        let _ = std::fs::remove_file(dir.join(self.name));
        let _ = systemctl(&["daemon-reload"]);
        let _ = systemctl(&["reset-failed", self.name]);
    }
}

/// Stops the kubelet's slices (and whatever is left in them) when a test ends.
struct StopSlices;

impl Drop for StopSlices {
    fn drop(&mut self) {
        let _ = systemctl(&["stop", "kubepods.slice"]);
    }
}

/// The pid of the process whose command line holds `marker` (the test pod's main process).
fn pid_of(marker: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        cmdline.starts_with("sleep ").then_some(())?;
        cmdline.contains(marker).then_some(pid)
    })
}

/// The ids of running containers, as `nodus crictl ps -q` lists them.
/// The running containers of the test's pods (each named `c` by [`pod`]; the control
/// plane's static pods under `nodus up` are not counted).
fn running(endpoint: &str) -> Vec<String> {
    let (ok, out) = run(Command::new(common::nodus_bin()).args([
        "crictl", "-r", endpoint, "ps", "--state", "Running", "--name", "^c$", "-q",
    ]));
    if !ok {
        return Vec::new();
    }
    out.lines().map(str::to_string).collect()
}

fn wait_for<V>(what: &str, log: &dyn Fn() -> String, mut f: impl FnMut() -> Option<V>) -> V {
    let deadline = Instant::now() + T;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out: {what}\n{}", log());
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn pod(name: &str, marker: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sleep\", \"{marker}\"]\n"
    )
}

/// Restarts `units` (in order) and checks the pod's container is the same process, still
/// running, and was not restarted by the kubelet that came back.
fn restart_keeps_the_pod(units: &[&Unit], endpoint: &str, marker: &str, log: &dyn Fn() -> String) {
    let before_pid = wait_for("the pod's process", log, || pid_of(marker));
    let before = wait_for("the pod running", log, || {
        Some(running(endpoint)).filter(|r| r.len() == 1)
    });
    let main_pids: Vec<String> = units.iter().map(|u| show(u.name, "MainPID")).collect();
    for u in units {
        u.ctl("restart");
    }
    for (u, old) in units.iter().zip(&main_pids) {
        assert_ne!(
            &show(u.name, "MainPID"),
            old,
            "{} was not restarted",
            u.name
        );
    }
    // Give the restarted kubelet time to resync the pod: it must adopt, not replace it.
    let kubelet = units.last().unwrap().name;
    wait_for("the restarted kubelet to start", log, || {
        (journal(kubelet).matches("kubelet started").count() >= 2).then_some(())
    });
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(running(endpoint), before, "{}", log());
    assert_eq!(
        pid_of(marker),
        Some(before_pid),
        "the container's process changed across the restart\n{}",
        log()
    );
}

#[test]
fn runtime_and_kubelet_units_start_notify_log_and_restart_with_pods_running() {
    if !systemd_is_init() || !common::have_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _slices = StopSlices;
    let netns = testkit::Netns::new("nodus-units").expect("netns");
    let dir = tempfile::Builder::new()
        .prefix("nodus-units-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    common::cluster::prepare_node_dir(d, "10.97.9.0/24", &d.join("runtime"));
    // The driver a systemd host wants (a warning says so otherwise); the kubelet follows
    // the runtime's RuntimeConfig answer.
    let mut config = std::fs::read_to_string(d.join("runtime.toml")).unwrap();
    config.push_str("systemd-cgroup = true\n");
    std::fs::write(d.join("runtime.toml"), config).unwrap();
    let socket = d.join("run/nodus.sock");
    let endpoint = format!("unix://{}", socket.display());
    std::fs::create_dir_all(d.join("manifests")).unwrap();

    let runtime = Unit::install(
        "nodus-runtime.service",
        "NODUS_RUNTIME_ARGS",
        &[
            "--listen".as_ref(),
            &socket,
            "--root-dir".as_ref(),
            &d.join("runtime"),
            "--state-dir".as_ref(),
            &d.join("run/runtime"),
            "--config".as_ref(),
            &d.join("runtime.toml"),
        ],
        &netns,
    );
    let kubelet = Unit::install(
        "nodus-kubelet.service",
        "NODUS_KUBELET_ARGS",
        &[
            "--container-runtime-endpoint".as_ref(),
            Path::new(&endpoint),
            "--root-dir".as_ref(),
            &d.join("kubelet"),
            "--pod-manifest-path".as_ref(),
            &d.join("manifests"),
            "--pod-logs-dir".as_ref(),
            &d.join("logs"),
            "--hostname-override".as_ref(),
            "units-node".as_ref(),
        ],
        &netns,
    );
    let log = || {
        format!(
            "--- runtime:\n{}\n--- kubelet:\n{}",
            journal(runtime.name),
            journal(kubelet.name)
        )
    };
    // Type=notify: `systemctl start` returns once the socket is bound.
    runtime.ctl("start");
    assert!(
        socket.exists(),
        "READY=1 came before the CRI socket\n{}",
        log()
    );
    kubelet.ctl("start");
    let marker = "86401";
    std::fs::write(d.join("manifests/web.yaml"), pod("web", marker)).unwrap();
    let pid = wait_for("the static pod's process", &log, || pid_of(marker));
    // systemd places the container in its own scope of the pod's slice.
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cgroup.contains("kubepods") && cgroup.contains("cri-nodus-"),
        "{cgroup}"
    );
    restart_keeps_the_pod(&[&runtime, &kubelet], &endpoint, marker, &log);

    // Logs are the units' own, in the journal.
    let rt_journal = journal(runtime.name);
    assert!(
        rt_journal.matches("nodus runtime serving the CRI").count() >= 2,
        "{rt_journal}"
    );
    assert!(journal(kubelet.name).contains("kubelet started"));

    // A clean stop: the pod goes first (the kubelet stops it), then both units end with
    // success rather than a timeout or a kill.
    std::fs::remove_file(d.join("manifests/web.yaml")).unwrap();
    wait_for("the pod removed", &log, || {
        running(&endpoint).is_empty().then_some(())
    });
    kubelet.ctl("stop");
    runtime.ctl("stop");
    for u in [&kubelet, &runtime] {
        assert_eq!(show(u.name, "Result"), "success", "{}", log());
        assert_eq!(show(u.name, "ActiveState"), "inactive");
    }
    assert!(!socket.exists(), "the runtime left its socket behind");
    // The kubelet's restarts never left the runtime unit: it ran the whole time.
    assert_eq!(show(runtime.name, "NRestarts"), "0");
    // systemd accepts the shipped files as they are.
    for name in [
        "nodus-runtime.service",
        "nodus-kubelet.service",
        "nodus-node.service",
        "nodus-up.service",
    ] {
        let (ok, out) = run(Command::new("systemd-analyze")
            .arg("verify")
            .arg(units_dir().join(name)));
        let complaints: Vec<&str> = out
            .lines()
            // verify checks that the ExecStart binary exists; /usr/local/bin/nodus is
            // where the README installs it, not where the test runs it from.
            .filter(|l| !l.contains("/usr/local/bin/nodus"))
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert!(ok || complaints.is_empty(), "{name}: {out}");
        assert!(complaints.is_empty(), "{name}: {out}");
    }
}

#[test]
fn up_unit_is_ready_with_the_whole_cluster_and_restarts_with_pods_running() {
    if !systemd_is_init() || !common::have_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _slices = StopSlices;
    let netns = testkit::Netns::new("nodus-up-unit").expect("netns");
    common::cluster::add_node_address(&netns);
    let dir = tempfile::Builder::new()
        .prefix("nodus-up-unit-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    common::cluster::prepare_node_dir(d, "10.97.10.0/24", &d.join("up/node/runtime"));
    let up = Unit::install(
        "nodus-up.service",
        "NODUS_UP_ARGS",
        // The default bootstrap: the control plane as static pods of the unit's kubelet, on
        // this cgroup v2 host with the systemd driver.
        &[
            "--data-dir".as_ref(),
            &d.join("up"),
            "--".as_ref(),
            "--runtime-config".as_ref(),
            &d.join("runtime.toml"),
            "--hostname-override".as_ref(),
            "up-unit".as_ref(),
            "--pod-logs-dir".as_ref(),
            &d.join("logs"),
        ],
        &netns,
    );
    let log = || journal(up.name);
    // READY=1 waits for the API server, the runtime and the kubelet.
    up.ctl("start");
    let journal_text = journal(up.name);
    for line in [
        "wrote static pod manifest",
        "nodus runtime serving the CRI",
        "kubelet started",
        "nodus is up: API server at",
    ] {
        assert!(journal_text.contains(line), "{line}:\n{journal_text}");
    }
    assert!(d.join("up/control-plane/admin.kubeconfig").exists());
    // The control plane runs as static pods of the unit's kubelet: their mirror pods.
    let kubeconfig = d.join("up/control-plane/admin.kubeconfig");
    wait_for("the control plane's mirror pods Running", &log, || {
        let (ok, out, _) = common::cluster::kubectl(
            &netns,
            &kubeconfig,
            &d.join("home"),
            &["get", "pods", "-n", "kube-system", "-o", "json"],
            None,
        );
        let list: serde_json::Value = serde_json::from_str(&out).ok()?;
        let running = |name: &str| {
            list["items"].as_array().is_some_and(|items| {
                items.iter().any(|p| {
                    p["metadata"]["name"] == format!("{name}-up-unit")
                        && p["status"]["phase"] == "Running"
                })
            })
        };
        (ok && [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ]
        .iter()
        .all(|c| running(c)))
        .then_some(())
    });
    let endpoint = format!("unix://{}", d.join("up/node/run/nodus.sock").display());
    let marker = "86402";
    std::fs::write(d.join("up/manifests/web.yaml"), pod("web", marker)).unwrap();
    restart_keeps_the_pod(&[&up], &endpoint, marker, &log);
    std::fs::remove_file(d.join("up/manifests/web.yaml")).unwrap();
    wait_for("the pod removed", &log, || {
        running(&endpoint).is_empty().then_some(())
    });
    up.ctl("stop");
    assert_eq!(show(up.name, "Result"), "success", "{}", log());
    // The control plane's containers outlive the node, as on a kubeadm node whose kubelet
    // stops: end them, so the suite's later tests do not share the machine with them.
    common::kill_runtime_leftovers(&d.join("up/node/run/runtime"), d);
}
