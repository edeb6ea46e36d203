//! The workload controllers under load, on one node (`nodus control-plane` + the nodus
//! kubelet on nodus's runtime), driven by the real kubectl:
//!
//! 1. a baseline: 100 bare pods (`kubectl apply` of a List, scheduled) to all Ready — the
//!    same API server, scheduler and kubelet work without any controller;
//! 2. a 100-replica Deployment from `kubectl apply` to all pods Ready (1 and 2 run twice);
//! 3. a rolling update of it to a new image (`kubectl set image`) until the rollout is
//!    complete;
//! 4. a Job of 500 completions with parallelism 50 until it is Complete.
//!
//! For each: wall time, the control plane's CPU time over the phase, its RSS. The
//! controllers run inside the control-plane process, so their own CPU is read as the
//! Deployment phase's control-plane CPU minus the baseline's, per created pod, averaged over
//! the two rounds. Beside them the floor: the CPU time of the processes every pod needs
//! (`runc run --detach` + the CNI ADD), timed alone just before each phase once the machine
//! is quiet (bench/src/floor.rs), spread over the machine's cores; and for the phases that
//! start every pod at once, the burst floor: the same parts for all those pods at once with
//! nothing of nodus running, which is what they cost as a burst on this machine.

use anyhow::{Context, Result, bail};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt as _, watcher};
use nodus_bench::cluster::{self, NODE, cpu_ms};
use nodus_bench::targets::{Masq, nodus_with_masq, pct, rss_kib};
use nodus_bench::treecpu::TreeCpu;
use serde_json::Value;
use std::os::fd::AsFd as _;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use testkit::Netns;

const REPLICAS: usize = 100;
const JOB_COMPLETIONS: usize = 500;
const JOB_PARALLELISM: usize = 50;
/// How many times the bare pods and the Deployment each run (see `run_phases`).
const CONTROLLER_ROUNDS: usize = 2;
/// The second image the rolling update moves to: busybox imported under another tag.
const NEW_IMAGE: &str = "docker.io/library/busybox:1.36";

struct Kubectl {
    netns: Arc<Netns>,
    kubeconfig: std::path::PathBuf,
}

impl Kubectl {
    fn cmd(&self, args: &[&str]) -> Result<Command> {
        let mut c = self.netns.command("kubectl")?;
        c.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        Ok(c)
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        use std::io::Write as _;
        let mut c = self.cmd(args)?;
        c.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().context("kubectl")?;
        if let Some(s) = stdin
            && let Some(mut i) = child.stdin.take()
        {
            i.write_all(s.as_bytes())?;
        }
        drop(child.stdin.take());
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn json(&self, args: &[&str]) -> Result<Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.run(&a, None)?)?)
    }
}

/// What each phase reads: the control plane's process, the kubelet's process, the
/// runtime's whole tree (the daemon, its shims, runc and the CNI plugins it ran) and the
/// pods' cgroups (where runc's init runs until it execs the container's program).
struct Meters {
    cp_pid: u32,
    kubelet_pid: u32,
    /// The runtime daemon's own process (its threads, not the shims and plugins it starts).
    runtime_pid: u32,
    runtime: TreeCpu,
    containers: TreeCpu,
    /// What the phases wait for.
    watched: Watched,
    /// The kubelet's network namespace, where its read-only port answers.
    kubelet_netns: std::sync::Arc<testkit::netns::Netns>,
}

/// Every CRI call the kubelet has made so far (the sum of its
/// `kubelet_runtime_operations_total`), read from its /metrics.
fn cri_calls(m: &Meters) -> f64 {
    let Ok((200, body)) = m
        .kubelet_netns
        .http_get(nodus_bench::cluster::READ_ONLY_PORT, "/metrics")
    else {
        return f64::NAN;
    };
    body.lines()
        .filter(|l| l.starts_with("kubelet_runtime_operations_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// CPU counters at one moment, in milliseconds (the machine's as jiffies: total, idle).
#[derive(Clone, Copy)]
struct Counters {
    cp: f64,
    kubelet: f64,
    runtime: f64,
    runtime_daemon: f64,
    containers: f64,
    host: (u64, u64),
}

impl Counters {
    fn read(m: &Meters) -> Counters {
        Counters {
            cp: cpu_ms(m.cp_pid),
            kubelet: cpu_ms(m.kubelet_pid),
            runtime: m.runtime.ms(),
            runtime_daemon: cpu_ms(m.runtime_pid),
            containers: m.containers.ms(),
            host: host_cpu(),
        }
    }

    /// How busy the machine's cores were between `self` and `later`, in percent.
    fn host_busy(&self, later: &Counters) -> f64 {
        100.0 * busy_between(self.host, later.host)
    }
}

/// The share (0..1) of the machine's CPU time that was busy between two `host_cpu` readings.
fn busy_between(a: (u64, u64), b: (u64, u64)) -> f64 {
    let total = b.0.saturating_sub(a.0).max(1);
    1.0 - b.1.saturating_sub(a.1) as f64 / total as f64
}

/// The machine's CPU time from /proc/stat's first line, in jiffies: (all, idle + iowait).
fn host_cpu() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (v.iter().sum(), idle)
}

/// Waits until the machine's cores were less than 10 % busy over two half-second windows in
/// a row (at most a minute, then says so and goes on).
fn wait_quiet(what: &str) {
    let t0 = Instant::now();
    let mut quiet = 0;
    while quiet < 2 {
        if t0.elapsed() > Duration::from_secs(60) {
            eprintln!("{what}: the machine did not go quiet within 60 s; going on");
            return;
        }
        let a = host_cpu();
        std::thread::sleep(Duration::from_millis(500));
        quiet = if busy_between(a, host_cpu()) < 0.10 {
            quiet + 1
        } else {
            0
        };
    }
}

/// One measured phase.
struct Phase {
    what: String,
    wall: Duration,
    cp_cpu_ms: f64,
    kubelet_cpu_ms: f64,
    /// CRI calls the kubelet made over the phase.
    cri_calls: f64,
    runtime_cpu_ms: f64,
    runtime_daemon_cpu_ms: f64,
    containers_cpu_ms: f64,
    /// How busy the machine's cores were over the phase, with everything that ran on them.
    host_busy_pct: f64,
    cp_rss_max_kib: u64,
    pods: usize,
    /// The floor's per-pod CPU (ms), timed on the idle node just before the phase.
    floor_ms: f64,
    /// The floor's parts for all the phase's pods at once, timed just before it (phases
    /// that start every pod at once only).
    burst: Option<nodus_bench::floor::Burst>,
}

/// Checks `done` at every change the watches see (and every 200 ms) until it holds; samples
/// the control plane's RSS on each check.
fn measure(
    what: &str,
    pods: usize,
    at_once: bool,
    m: &Meters,
    start: impl FnOnce() -> Result<()>,
    mut done: impl FnMut() -> Result<bool>,
    timeout: Duration,
) -> Result<Phase> {
    // Timed right before the phase, on the idle node: the machine's speed drifts over a
    // run (the floor moved by a quarter between runs minutes apart), and a ratio is only
    // meaningful when both of its sides ran under the same conditions.
    // The previous phase's pods are gone from the API before the node has finished with
    // them (containers and sandboxes removed, CNI DEL): the floor is timed alone, and the
    // phase starts, once the machine is quiet.
    wait_quiet(what);
    eprintln!("{what}: timing the floor");
    let floor_ms = per_pod_floor_ms()?;
    let burst = if at_once {
        wait_quiet(what);
        eprintln!("{what}: timing the floor's parts as one burst of {pods}");
        Some(nodus_bench::floor::burst(
            pods,
            Masq::Agent,
            true,
            nodus_bench::floor::PodMounts::Runtime,
        )?)
    } else {
        None
    };
    wait_quiet(what);
    let calls0 = cri_calls(m);
    let c0 = Counters::read(m);
    eprintln!("{what}: started");
    let t0 = Instant::now();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let timeline_dir = std::env::var_os("WORKLOADS_TIMELINE");
    let (wall, rss_max) = std::thread::scope(|s| -> Result<(Duration, u64)> {
        if let Some(dir) = &timeline_dir {
            let file = std::path::Path::new(dir).join(format!("{}.tsv", what.replace(' ', "_")));
            let stop = &stop;
            s.spawn(move || timeline(&file, m, t0, stop));
        }
        let r = wait_done(what, m, t0, start, &mut done, timeout);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    })?;
    let c1 = Counters::read(m);
    let calls1 = cri_calls(m);
    eprintln!("{what}: {:.2} s", wall.as_secs_f64());
    Ok(Phase {
        what: what.to_string(),
        wall,
        cp_cpu_ms: c1.cp - c0.cp,
        kubelet_cpu_ms: c1.kubelet - c0.kubelet,
        cri_calls: calls1 - calls0,
        runtime_cpu_ms: c1.runtime - c0.runtime,
        runtime_daemon_cpu_ms: c1.runtime_daemon - c0.runtime_daemon,
        containers_cpu_ms: c1.containers - c0.containers,
        host_busy_pct: c0.host_busy(&c1),
        cp_rss_max_kib: rss_max.max(rss_kib(m.cp_pid)),
        pods,
        floor_ms,
        burst,
    })
}

/// Starts the phase and waits until `done`; returns the wall time and the control plane's
/// highest RSS seen by the checks.
fn wait_done(
    what: &str,
    m: &Meters,
    t0: Instant,
    start: impl FnOnce() -> Result<()>,
    done: &mut impl FnMut() -> Result<bool>,
    timeout: Duration,
) -> Result<(Duration, u64)> {
    start()?;
    let mut seen = m.watched.changes();
    let mut rss_max = 0;
    loop {
        rss_max = rss_max.max(rss_kib(m.cp_pid));
        if done()? {
            return Ok((t0.elapsed(), rss_max));
        }
        if t0.elapsed() > timeout {
            bail!("{what}: not done after {timeout:?}");
        }
        seen = m.watched.wait_change(seen, Duration::from_millis(200));
    }
}

/// `WORKLOADS_TIMELINE=DIR`: every 100 ms of a phase, how busy the machine's cores were, each
/// process group's CPU in that interval, how far the pods had come and how long the node's
/// mount table was — to see where a phase waits rather than works. One file per phase.
fn timeline(file: &std::path::Path, m: &Meters, t0: Instant, stop: &std::sync::atomic::AtomicBool) {
    use std::io::Write as _;
    let Ok(mut f) = std::fs::File::create(file) else {
        return;
    };
    let _ = writeln!(
        f,
        "ms\tbusy%\tcp\tkubelet\truntime\tcontainers\tpods\tbound\trunning\tready\tmounts"
    );
    let mut c = Counters::read(m);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        let c2 = Counters::read(m);
        let pods = m.watched.pods.state();
        let live: Vec<_> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let count = |f: &dyn Fn(&Pod) -> bool| live.iter().filter(|p| f(p)).count();
        let bound = count(&|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()));
        let running = count(&|p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.phase.as_deref() == Some("Running"))
        });
        // The node's mount table, which every runc invocation renders several times.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .map(|t| t.lines().count())
            .unwrap_or(0);
        let _ = writeln!(
            f,
            "{}\t{:.0}\t{:.0}\t{:.0}\t{:.0}\t{:.0}\t{}\t{bound}\t{running}\t{}\t{mounts}",
            t0.elapsed().as_millis(),
            c.host_busy(&c2),
            c2.cp - c.cp,
            c2.kubelet - c.kubelet,
            c2.runtime - c.runtime,
            c2.containers - c.containers,
            live.len(),
            count(&pod_ready),
        );
        c = c2;
    }
}

/// What the phases wait for, kept by watches of the API server as an informer keeps it:
/// pods, Deployments and Jobs of the default namespace. Polling with a kubectl process
/// every 500 ms cost about a tenth of the machine's CPU, taken from the node it measures.
struct Watched {
    pods: Store<Pod>,
    deployments: Store<Deployment>,
    jobs: Store<Job>,
    /// Counts the events seen; waiters sleep on the condvar until it moves.
    changed: Arc<(Mutex<u64>, Condvar)>,
}

impl Watched {
    /// Starts the watches on a thread inside the network namespace at `netns` (where the API
    /// server listens) and returns once each has listed.
    fn start(netns: std::path::PathBuf, admin: std::path::PathBuf) -> Result<Watched> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let run = || -> Result<()> {
                let f = std::fs::File::open(&netns)?;
                nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let client = nodus_bench::controlplane::client(&admin).await?;
                    let (pods, pw) = reflector::store();
                    let (deployments, dw) = reflector::store();
                    let (jobs, jw) = reflector::store();
                    let changed = Arc::new((Mutex::new(0u64), Condvar::new()));
                    let cfg = watcher::Config::default;
                    let streams = vec![
                        reflector(
                            pw,
                            watcher(Api::<Pod>::namespaced(client.clone(), "default"), cfg()),
                        )
                        .default_backoff()
                        .map(drop)
                        .boxed(),
                        reflector(
                            dw,
                            watcher(
                                Api::<Deployment>::namespaced(client.clone(), "default"),
                                cfg(),
                            ),
                        )
                        .default_backoff()
                        .map(drop)
                        .boxed(),
                        reflector(
                            jw,
                            watcher(Api::<Job>::namespaced(client, "default"), cfg()),
                        )
                        .default_backoff()
                        .map(drop)
                        .boxed(),
                    ];
                    let mut all = futures::stream::select_all(streams);
                    let w = Watched {
                        pods,
                        deployments,
                        jobs,
                        changed: Arc::clone(&changed),
                    };
                    let (p, d, j) = (w.pods.clone(), w.deployments.clone(), w.jobs.clone());
                    let listed = async move {
                        let _ = tokio::join!(
                            p.wait_until_ready(),
                            d.wait_until_ready(),
                            j.wait_until_ready()
                        );
                    };
                    tokio::pin!(listed);
                    let deadline = tokio::time::sleep(Duration::from_secs(60));
                    tokio::pin!(deadline);
                    loop {
                        tokio::select! {
                            _ = &mut listed => break,
                            _ = &mut deadline => bail!("the watches did not list within 60 s"),
                            n = all.next() => if n.is_none() { bail!("the watches ended") },
                        }
                    }
                    let _ = tx.send(w);
                    while all.next().await.is_some() {
                        let (n, cv) = &*changed;
                        *n.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                        cv.notify_all();
                    }
                    Ok(())
                })
            };
            if let Err(e) = run() {
                eprintln!("watching the API server: {e:#}");
            }
        });
        rx.recv_timeout(Duration::from_secs(90))
            .context("the watches did not list within 90 s")
    }

    fn changes(&self) -> u64 {
        *self.changed.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until a change after `seen` or `timeout`; returns the count seen then.
    fn wait_change(&self, seen: u64, timeout: Duration) -> u64 {
        let (n, cv) = &*self.changed;
        let g = n.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = cv
            .wait_timeout_while(g, timeout, |n| *n == seen)
            .unwrap_or_else(|e| e.into_inner());
        *g
    }

    /// How many pods labelled `app=<app>` are Ready (of those not being deleted), and how
    /// many there are.
    fn ready_pods(&self, app: &str) -> (usize, usize) {
        let pods: Vec<_> = self
            .pods
            .state()
            .into_iter()
            .filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app"))
                    .is_some_and(|a| a == app)
            })
            .collect();
        let ready = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
            .count();
        (ready, pods.len())
    }

    fn wait_no_pods(&self, app: &str) -> Result<()> {
        let t0 = Instant::now();
        let mut seen = self.changes();
        while self.ready_pods(app).1 > 0 {
            if t0.elapsed() > Duration::from_secs(300) {
                bail!("pods app={app} still there after 300 s");
            }
            seen = self.wait_change(seen, Duration::from_millis(200));
        }
        Ok(())
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn ready(p: &Value) -> bool {
    p.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn pod_list(n: usize) -> String {
    let items: Vec<Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("bare-{i}"), "labels": {"app": "bare"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "app", "image": "docker.io/library/busybox:latest",
                        "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"]}],
                },
            })
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

fn deployment() -> String {
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "app", "image": "docker.io/library/busybox:latest",
                        "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"]}],
                },
            },
        },
    })
    .to_string()
}

fn job() -> String {
    serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "batch"},
        "spec": {
            "completions": JOB_COMPLETIONS,
            "parallelism": JOB_PARALLELISM,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "work", "image": "docker.io/library/busybox:latest",
                        "imagePullPolicy": "IfNotPresent", "command": ["true"]}],
                },
            },
        },
    })
    .to_string()
}

fn rollout_complete(w: &Watched, image: &str) -> bool {
    let Some(d) = w
        .deployments
        .state()
        .into_iter()
        .find(|d| d.metadata.name.as_deref() == Some("web"))
    else {
        return false;
    };
    let image_now = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.as_deref())
        == Some(image);
    let st = d.status.clone().unwrap_or_default();
    let n = |v: Option<i32>| v.unwrap_or(0) as usize;
    image_now
        && st.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
        && n(st.updated_replicas) == REPLICAS
        && n(st.replicas) == REPLICAS
        && n(st.available_replicas) == REPLICAS
}

/// Whether the Job `batch` is Complete; an error when it Failed.
fn job_complete(w: &Watched) -> Result<bool> {
    let Some(j) = w
        .jobs
        .state()
        .into_iter()
        .find(|j| j.metadata.name.as_deref() == Some("batch"))
    else {
        return Ok(false);
    };
    let conds = j
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    if conds
        .iter()
        .any(|c| c.type_ == "Failed" && c.status == "True")
    {
        bail!("the Job failed: {:?}", j.status);
    }
    Ok(conds
        .iter()
        .any(|c| c.type_ == "Complete" && c.status == "True"))
}

fn run_phases(k: &Kubectl, m: &Meters) -> Result<Vec<Phase>> {
    let w = &m.watched;
    let t0 = Instant::now();
    loop {
        let n = k.json(&["get", "node", NODE]);
        if n.as_ref().is_ok_and(ready) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("node {NODE} not Ready after 60 s");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let long = Duration::from_secs(600);
    let mut phases = Vec::new();
    let list = pod_list(REPLICAS);
    let d = deployment();
    // Bare pods then the Deployment, twice: the controllers' own CPU is the difference of
    // the two phases' control-plane CPU, each about a second and noisy by a tenth, so one
    // pair alone cannot tell 0.1 ms per pod from 1 ms.
    for round in 1..=CONTROLLER_ROUNDS {
        let nth = if round == 1 {
            String::new()
        } else {
            format!(" (round {round})")
        };
        phases.push(measure(
            &format!("{REPLICAS} bare pods (kubectl apply of a List) → all Ready{nth}"),
            REPLICAS,
            true,
            m,
            || k.run(&["apply", "-f", "-"], Some(&list)).map(drop),
            || Ok(w.ready_pods("bare").0 == REPLICAS),
            long,
        )?);
        k.run(&["delete", "pods", "-l", "app=bare", "--wait=false"], None)?;
        w.wait_no_pods("bare")?;
        phases.push(measure(
            &format!("Deployment of {REPLICAS} replicas (kubectl apply) → all pods Ready{nth}"),
            REPLICAS,
            true,
            m,
            || k.run(&["apply", "-f", "-"], Some(&d)).map(drop),
            || Ok(w.ready_pods("web").0 == REPLICAS),
            long,
        )?);
        if round < CONTROLLER_ROUNDS {
            k.run(&["delete", "deployment", "web"], None)?;
            w.wait_no_pods("web")?;
        }
    }
    phases.push(measure(
        &format!(
            "rolling update of the {REPLICAS} to a new image (kubectl set image) → rollout complete"
        ),
        REPLICAS,
        false,
        m,
        || {
            k.run(
                &[
                    "set",
                    "image",
                    "deployment/web",
                    &format!("app={NEW_IMAGE}"),
                ],
                None,
            )
            .map(drop)
        },
        || Ok(rollout_complete(w, NEW_IMAGE)),
        long,
    )?);
    k.run(&["delete", "deployment", "web"], None)?;
    w.wait_no_pods("web")?;
    let j = job();
    phases.push(measure(
        &format!("Job of {JOB_COMPLETIONS} completions, parallelism {JOB_PARALLELISM} → Complete"),
        JOB_COMPLETIONS,
        false,
        m,
        || k.run(&["apply", "-f", "-"], Some(&j)).map(drop),
        || job_complete(w),
        Duration::from_secs(1800),
    )?);
    Ok(phases)
}

#[tokio::main]
async fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin = std::path::PathBuf::from(
        std::env::var("NODUS_BIN").context("set NODUS_BIN to the nodus binary")?,
    );
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    eprintln!("timing the floor (runc run --detach, CNI ADD) alone, before the cluster starts");
    let start_floor_ms = per_pod_floor_ms()?;
    let mounts_ab = mount_table_ab()?;
    // The runtime as `nodus node` configures it: `lo` brought up by the runtime.
    let t = nodus_with_masq(&bin, "use-internal-loopback = true\n", Masq::Agent).await?;
    let runtime = TreeCpu::new("nodus-bench-runtime")?;
    runtime.add(t.daemon_pid)?;
    // The rolling update's "new image": the same busybox under another name.
    let dir = tempfile::tempdir()?;
    let archive = dir.path().join("busybox-1.36.tar");
    testkit::image::busybox().write_oci_archive(&archive, NEW_IMAGE)?;
    let root = t
        .logs
        .parent()
        .context("the runtime's directory")?
        .join("root");
    let out = Command::new(&bin)
        .args(["runtime", "import"])
        .arg(&archive)
        .arg("--root-dir")
        .arg(&root)
        .output()?;
    if !out.status.success() {
        bail!("import: {}", String::from_utf8_lossy(&out.stderr));
    }
    // 100 replicas plus a rolling update's surge exceed upstream's default maxPods (110):
    // the benchmark measures the controllers, not the node's pod limit.
    let c = cluster::start(&bin, &t, &["--max-pods", "250"])?;
    let k = Kubectl {
        netns: Arc::clone(&t.netns),
        kubeconfig: c.admin.clone(),
    };
    let meters = Meters {
        cp_pid: c.control_plane.pid(),
        kubelet_pid: c.kubelet.pid(),
        runtime_pid: t.daemon_pid,
        runtime,
        containers: TreeCpu::open(&t.cgroup.path()),
        watched: Watched::start(t.netns.path(), c.admin.clone())?,
        kubelet_netns: std::sync::Arc::clone(&t.netns),
    };
    let phases = run_phases(&k, &meters)?;
    let floor_wall = |p: &Phase| p.pods as f64 * p.floor_ms / cores as f64 / 1e3;
    let mut body = format!(
        "One node: `nodus control-plane` and the nodus kubelet (`--kubeconfig`, EventedPLEG on, \
         `--max-pods 250`) on nodus's runtime, in the runtime's network namespace, driven by the \
         real kubectl ({}); the CNI chain as `nodus up` configures it (bridge + host-local + \
         portmap, the bridge plugin's `ipMasq` off because the pod network agent masquerades); \
         busybox `sleep 3600` (the Job: `true`), image present, \
         terminationGracePeriodSeconds 1. Each phase ends when watches of pods, Deployments and Jobs held by the benchmark (an informer's view, no process per poll) see its goal. \
         \"control plane CPU\" is the `nodus control-plane` process's user + system time over \
         the phase (API server, scheduler and every controller together); its RSS is the \
         highest seen. Floor = pods × the per-pod floor (CPU of `runc run --detach` — runc and \
         its init process until it execs the container's program, its state and bundle on a tmpfs \
         as the runtime's state dir is — + CNI ADD, p50 of 10, timed \
         alone just before the phase, once the machine is quiet (under 10 % busy for a second), \
         as the phase then starts; {start_floor_ms:.1} ms when timed before \
         the cluster started) / {cores} cores. Burst floor = the same parts for all the \
         phase's pods at once, with no runtime, kubelet or control plane running \
         (`bench/src/floor.rs` `burst`: per pod a pinned network namespace, a `/dev/shm` \
         tmpfs and an overlay root mounted, the CNI ADD into that namespace, then `runc run \
         --detach` of a container joining it), timed just before the phase: what the \
         prescribed parts cost as a burst on this machine, where the floor times one pod \
         at a time. {cores} cores.\n\n\
         | phase | pods | wall | floor | wall / floor | burst floor | burst floor / floor | nodus beyond the burst floor | control plane CPU | per pod | control plane RSS |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        kubectl_version(),
    );
    for p in &phases {
        let fl = floor_wall(p);
        let wall = p.wall.as_secs_f64();
        let (burst, burst_ratio, beyond) = match &p.burst {
            Some(b) => (
                format!("{:.2} s", b.wall_ms / 1e3),
                format!("{:.1}×", b.wall_ms / 1e3 / fl),
                format!(
                    "{:.2} s ({:.1}× the floor)",
                    wall - b.wall_ms / 1e3,
                    (wall - b.wall_ms / 1e3) / fl
                ),
            ),
            None => ("—".into(), "—".into(), "—".into()),
        };
        body.push_str(&format!(
            "| {} | {} | {:.2} s | {:.2} s | {:.1}× | {burst} | {burst_ratio} | {beyond} | {:.0} ms | {:.2} ms | {:.1} MiB |\n",
            p.what,
            p.pods,
            wall,
            fl,
            wall / fl,
            p.cp_cpu_ms,
            p.cp_cpu_ms / p.pods as f64,
            p.cp_rss_max_kib as f64 / 1024.0,
        ));
    }
    body.push_str(&format!(
        "\nWhere the CPU went, per pod: the control plane; the kubelet; the runtime's whole \
         process tree (the daemon, its shims, runc and the CNI plugins, read from a cgroup \
         the runtime was started in), and of it the runtime daemon's own process; the pods' cgroups (runc's init, which sets a container up \
         in its cgroup before it execs the program, and the programs themselves); the floor's \
         share of those (timed before the phase), and the same parts' CPU per pod when they ran \
         as one burst without nodus; nodus's own CPU (all four minus the floor); \
         how busy the {cores} cores were with these processes over the phase's wall time, and \
         with everything (the kernel's workers, interrupts, the benchmark and kubectl too); \
         the CRI calls the kubelet made, per pod (its `kubelet_runtime_operations_total`).\n\n\
         | phase | control plane | kubelet | runtime tree | of it the daemon | pods' cgroups | floor (runc + CNI) | the same as a burst | nodus's own | busy with these | machine busy | CRI calls |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    ));
    for p in &phases {
        let per = |ms: f64| ms / p.pods as f64;
        let all = p.cp_cpu_ms + p.kubelet_cpu_ms + p.runtime_cpu_ms + p.containers_cpu_ms;
        body.push_str(&format!(
            "| {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {} | {:.1} ms | {:.0} % | {:.0} % | {:.1} |\n",
            p.what,
            per(p.cp_cpu_ms),
            per(p.kubelet_cpu_ms),
            per(p.runtime_cpu_ms),
            per(p.runtime_daemon_cpu_ms),
            per(p.containers_cpu_ms),
            p.floor_ms,
            p.burst
                .as_ref()
                .map_or("—".into(), |b| format!("{:.1} ms", b.cpu_ms_per_pod)),
            per(all) - p.floor_ms,
            100.0 * all / (p.wall.as_secs_f64() * 1e3 * cores as f64),
            p.host_busy_pct,
            per(p.cri_calls),
        ));
    }
    // The rounds' phases come first, bare pods and Deployment alternating.
    let pairs: Vec<(f64, f64)> = phases[..2 * CONTROLLER_ROUNDS]
        .chunks(2)
        .map(|p| (p[0].cp_cpu_ms, p[1].cp_cpu_ms))
        .collect();
    let each = pairs
        .iter()
        .map(|(b, d)| format!("{d:.0} − {b:.0} ms"))
        .collect::<Vec<_>>()
        .join(", ");
    let controller_ms =
        pairs.iter().map(|(b, d)| d - b).sum::<f64>() / (pairs.len() * REPLICAS) as f64;
    body.push_str(&format!(
        "\nThe controllers' own CPU for the Deployment: control plane CPU of each Deployment \
         phase minus that of the bare pods before it ({each}), averaged over the {} rounds: \
         {controller_ms:.2} ms per created pod (Deployment and ReplicaSet controllers, their \
         status writes and events, and the API work those cause).\n\nGoals (issue 16): 100 \
         replicas Ready within 2× the floor; the controllers' own CPU under 1 ms per created \
         pod.\n",
        pairs.len()
    ));
    body.push_str(&format!(
        "\nWhat the node's mount table costs the burst floor, before the cluster started \
         ({REPLICAS} pods, alternating, {MOUNT_AB_ROUNDS} of each): with each pod's mounts \
         in the node's mount namespace, as every CRI runtime makes them (netns pin, \
         `/dev/shm`, overlay root) {}; with the netns pins alone (a plain root, runc's own \
         `/dev/shm`) {}.\n",
        mounts_ab.0, mounts_ab.1
    ));
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "workloads",
            "## Workload controllers (`bash bench/workloads.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    drop(c);
    drop(t);
    Ok(())
}

/// CPU of the parts a pod start cannot avoid, per pod: `runc run --detach` and CNI ADD, p50
/// of 10 each, timed alone. The pod network as `nodus up` runs it: the bridge plugin's ipMasq
/// off (the pod network agent masquerades with one rule), so a CNI ADD does not grow with
/// the node's pod count; no loopback plugin, since the runtime brings `lo` up itself.
fn per_pod_floor_ms() -> Result<f64> {
    let mut floor = nodus_bench::floor::measure_with(10, Masq::Agent, true)?;
    Ok(pct(&mut floor.runc_run_cpu, 50.0) + pct(&mut floor.cni_add_cpu, 50.0))
}

const MOUNT_AB_ROUNDS: usize = 2;

/// The burst floor with the pods' mounts in the node's mount namespace and with the netns
/// pins alone, alternating: runc reads the whole mount table several times per container,
/// so this is what keeping a runtime's per-pod mounts out of it would move.
fn mount_table_ab() -> Result<(String, String)> {
    use nodus_bench::floor::{PodMounts, burst};
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..MOUNT_AB_ROUNDS {
        for (m, out) in [
            (PodMounts::Runtime, &mut with),
            (PodMounts::NetnsOnly, &mut without),
        ] {
            wait_quiet("mount-table A/B");
            let b = burst(REPLICAS, Masq::Agent, true, m)?;
            out.push(format!(
                "{:.2} s ({:.1} ms CPU per pod)",
                b.wall_ms / 1e3,
                b.cpu_ms_per_pod
            ));
        }
    }
    Ok((with.join(", "), without.join(", ")))
}

fn kubectl_version() -> String {
    Command::new("kubectl")
        .args(["version", "--client", "-o", "json"])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
        .and_then(|v| {
            v.pointer("/clientVersion/gitVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .map(|v| format!("kubectl {v}"))
        .unwrap_or_else(|| "kubectl".into())
}
