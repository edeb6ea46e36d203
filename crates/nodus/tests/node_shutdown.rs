//! Graceful node shutdown on a real systemd host: `systemctl poweroff` with three pods of
//! different priorities. It needs logind and powers the machine off, so it runs only in
//! the VM lane, in two halves (both `#[ignore]`d under plain `cargo test`):
//!
//! - `graceful_shutdown_1_arm` runs in the guest (scripts/vm-suite.sh, last): it starts
//!   `nodus runtime` and `nodus kubelet` as systemd units with
//!   `shutdownGracePeriodByPodPriority`, checks that the kubelet raised logind's
//!   InhibitDelayMaxSec and holds the delay lock, and leaves the three pods running; the
//!   guest then powers off.
//! - `graceful_shutdown_2_verify` runs on the host after the guest stopped
//!   (scripts/vm-test.sh): the pods' preStop hooks and SIGTERM handlers wrote the guest's
//!   uptime into the shared directory, and the kubelet's log is there too.
//!
//! The directory is `NODUS_VM_SHUTDOWN_DIR`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The KubeletConfiguration's type header.
const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
/// Each priority group's budget, in seconds.
const GROUP_SECONDS: i64 = 10;
/// How long each preStop hook takes.
const HOOK_SECONDS: u64 = 3;
/// The pods, lowest priority first: the order they must stop in.
const PODS: [(&str, i32); 3] = [("low", 0), ("mid", 1000), ("high", 100_000)];

fn shared_dir() -> PathBuf {
    PathBuf::from(
        std::env::var("NODUS_VM_SHUTDOWN_DIR")
            .expect("NODUS_VM_SHUTDOWN_DIR: run through scripts/vm-test.sh"),
    )
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn manifest(name: &str, priority: i32, hooks: &Path) -> String {
    // No quotes inside: the stamp goes inside the trap's single-quoted action.
    let stamp =
        |what: &str| format!("read up idle < /proc/uptime; echo $up > /hooks/{name}.{what}");
    let main = format!(
        "trap '{}; exit 0' TERM; while true; do sleep 1; done",
        stamp("term")
    );
    let pre_stop = format!("{}; sleep {HOOK_SECONDS}", stamp("prestop"));
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": true,
            "priority": priority,
            "terminationGracePeriodSeconds": 60,
            "volumes": [{"name": "hooks", "hostPath": {"path": hooks}}],
            "containers": [{
                "name": "c",
                "image": "docker.io/library/busybox:latest",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", main],
                "volumeMounts": [{"name": "hooks", "mountPath": "/hooks"}],
                "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", pre_stop]}}},
            }],
        },
    })
    .to_string()
}

#[test]
#[ignore = "powers the host off: run in the VM lane by scripts/vm-suite.sh"]
fn graceful_shutdown_1_arm() {
    assert!(
        Path::new("/run/systemd/system").exists(),
        "graceful shutdown needs a systemd host"
    );
    let shared = shared_dir();
    let hooks = shared.join("hooks");
    let manifests = shared.join("manifests");
    std::fs::create_dir_all(&hooks).unwrap();
    std::fs::create_dir_all(&manifests).unwrap();
    // Runtime state lives on the guest's own disk; only what the host reads is shared.
    let local = Path::new("/var/lib/nodus-shutdown-test");
    let (rt_root, rt_state, kubelet_root) = (
        local.join("runtime"),
        Path::new("/run/nodus-shutdown-test").to_path_buf(),
        local.join("kubelet"),
    );
    for d in [&rt_root, &rt_state, &kubelet_root] {
        std::fs::create_dir_all(d).unwrap();
    }
    let archive = local.join("busybox.tar");
    testkit::image::busybox()
        .write_oci_archive(&archive, "docker.io/library/busybox:latest")
        .unwrap();
    let nodus = common::nodus_bin();
    run(Command::new(&nodus)
        .args(["runtime", "import"])
        .arg(&archive)
        .arg("--root-dir")
        .arg(&rt_root));
    let socket = rt_state.join("nodus.sock");
    let log = shared.join("kubelet.log");
    // Units, not children: they must outlive this test and see the shutdown. Ordered
    // after the shared directory's mount, so they stop before it goes.
    let unit = |name: &str, args: &[&std::ffi::OsStr]| {
        run(Command::new("systemd-run")
            .arg(format!("--unit={name}"))
            .arg(format!("--property=RequiresMountsFor={}", shared.display()))
            .arg(format!(
                "--property=StandardOutput=append:{}",
                log.display()
            ))
            .arg(format!("--property=StandardError=append:{}", log.display()))
            .arg("--setenv=NODUS_LOG=info")
            .arg(&nodus)
            .args(args));
    };
    unit(
        "nodus-shutdown-runtime",
        &[
            "runtime".as_ref(),
            "--listen".as_ref(),
            socket.as_os_str(),
            "--root-dir".as_ref(),
            rt_root.as_os_str(),
            "--state-dir".as_ref(),
            rt_state.as_os_str(),
        ],
    );
    let config = local.join("kubelet.yaml");
    let groups: Vec<String> = PODS
        .iter()
        .map(|(_, p)| format!("- priority: {p}\n  shutdownGracePeriodSeconds: {GROUP_SECONDS}"))
        .collect();
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodByPodPriority:\n{}\n",
            groups.join("\n")
        ),
    )
    .unwrap();
    for (name, priority) in PODS {
        std::fs::write(
            manifests.join(format!("{name}.json")),
            manifest(name, priority, &hooks),
        )
        .unwrap();
    }
    let endpoint = format!("unix://{}", socket.display());
    let deadline = Instant::now() + Duration::from_secs(120);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the runtime never listened");
        std::thread::sleep(Duration::from_millis(200));
    }
    unit(
        "nodus-shutdown-kubelet",
        &[
            "kubelet".as_ref(),
            "--container-runtime-endpoint".as_ref(),
            endpoint.as_ref(),
            "--root-dir".as_ref(),
            kubelet_root.as_os_str(),
            "--pod-manifest-path".as_ref(),
            manifests.as_os_str(),
            "--config".as_ref(),
            config.as_os_str(),
            "--hostname-override".as_ref(),
            "shutdown-test".as_ref(),
        ],
    );

    // The kubelet raised logind's limit to the sum of the budgets and holds the lock.
    let want = format!("t {}", GROUP_SECONDS * 3 * 1_000_000);
    loop {
        let delay = run(Command::new("busctl").args([
            "get-property",
            "org.freedesktop.login1",
            "/org/freedesktop/login1",
            "org.freedesktop.login1.Manager",
            "InhibitDelayMaxUSec",
        ]));
        let locks = run(Command::new("systemd-inhibit").arg("--list"));
        if delay.trim() == want && locks.contains("kubelet") && locks.contains("delay") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "InhibitDelayMaxUSec {delay:?} (want {want:?}), locks:\n{locks}\nkubelet log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let drop_in = std::fs::read_to_string("/etc/systemd/logind.conf.d/99-kubelet.conf").unwrap();
    assert!(drop_in.contains("InhibitDelayMaxSec=30"), "{drop_in}");

    // All three pods run.
    loop {
        let ps = run(Command::new(&nodus)
            .args(["crictl", "-r", &endpoint, "ps", "--state", "Running", "-q"]));
        if ps.lines().count() == PODS.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pods not running: {ps}\nkubelet log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    std::fs::write(shared.join("armed"), "").unwrap();
}

fn stamp(hooks: &Path, pod: &str, what: &str) -> f64 {
    let p = hooks.join(format!("{pod}.{what}"));
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}: the pod was not stopped gracefully", p.display()))
        .trim()
        .parse()
        .unwrap()
}

#[test]
#[ignore = "reads what the VM lane's guest left behind: run by scripts/vm-test.sh"]
fn graceful_shutdown_2_verify() {
    let shared = shared_dir();
    assert!(
        shared.join("armed").exists(),
        "the guest never armed the test"
    );
    let hooks = shared.join("hooks");
    let log = std::fs::read_to_string(shared.join("kubelet.log")).unwrap_or_default();
    assert!(
        log.contains("Shutdown manager detected shutdown event"),
        "the kubelet never saw PrepareForShutdown:\n{log}"
    );
    // Every pod ran its preStop hook, then got SIGTERM, lowest priority first; a group
    // starts once the one before it has stopped (its hook took HOOK_SECONDS), well within
    // its budget.
    let mut last_term = 0.0;
    for (pod, _) in PODS {
        let (pre, term) = (stamp(&hooks, pod, "prestop"), stamp(&hooks, pod, "term"));
        assert!(
            term >= pre + HOOK_SECONDS as f64 - 0.5,
            "{pod}: preStop {pre}, TERM {term}"
        );
        assert!(
            pre >= last_term,
            "{pod} started stopping at {pre}, before the previous group ended at {last_term}\n{log}"
        );
        assert!(
            term - pre < GROUP_SECONDS as f64,
            "{pod} took {}s, over its group's {GROUP_SECONDS}s",
            term - pre
        );
        last_term = term;
    }
    for (pod, _) in PODS {
        assert!(
            log.lines().any(
                |l| l.contains("Shutdown manager killing pod with gracePeriod")
                    && l.contains(&format!("{pod}-shutdown-test"))
                    && l.contains(&format!("grace={GROUP_SECONDS}"))
            ),
            "no kill of {pod} with its group's grace period in the kubelet log:\n{log}"
        );
    }
    assert!(
        log.contains("Shutdown manager completed processing shutdown event"),
        "{log}"
    );
}

#[test]
fn invalid_shutdown_settings_are_refused_with_upstreams_text() {
    if !common::have_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kubelet.yaml");
    let refused = |body: &str| {
        std::fs::write(&config, format!("{HEADER}{body}")).unwrap();
        let out = Command::new(common::nodus_bin())
            .arg("kubelet")
            .args(["--container-runtime-endpoint", "unix:///nonexistent.sock"])
            .args(["--healthz-port", "0", "--root-dir"])
            .arg(dir.path())
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = refused("shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n");
    assert!(
        e.contains("shutdownGracePeriodCriticalPods (20s) must be >= 0 and <= shutdownGracePeriod"),
        "{e}"
    );
    let e = refused(
        "shutdownGracePeriod: 10s\nshutdownGracePeriodByPodPriority:\n- priority: 1\n  shutdownGracePeriodSeconds: 5\n",
    );
    assert!(
        e.contains("Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod"),
        "{e}"
    );
}

/// On a host without logind (this one, without systemd) the kubelet says graceful
/// shutdown is unavailable and runs its pods anyway, as upstream does.
#[test]
fn without_logind_the_node_runs_on_and_says_so() {
    if !common::have_root() || Path::new("/run/systemd/system").exists() {
        // With systemd the lock is taken for real: graceful_shutdown_1_arm covers that.
        return;
    }
    let node = common::BareNode::new("10.88.31.0/24");
    node.cgroup.create();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kubelet.yaml");
    std::fs::write(
        &config,
        format!("{HEADER}shutdownGracePeriod: 20s\nshutdownGracePeriodCriticalPods: 5s\n"),
    )
    .unwrap();
    let k = common::kubelet::Kubelet::start(
        node.netns.clone(),
        &node.rt.endpoint(),
        &node.cgroup.path(),
        &["--config", config.to_str().unwrap()],
    );
    k.write_manifest(
        "p.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [sleep, \"3600\"]\n",
    );
    let name = format!("p-{}", common::kubelet::NODE_NAME);
    k.wait_pod(&name, Duration::from_secs(60), "running", |p| {
        common::kubelet::is_running(p, "c")
    });
    let log = k.log();
    assert!(
        log.contains("Unable to watch the node for shutdown events"),
        "{log}"
    );
}
