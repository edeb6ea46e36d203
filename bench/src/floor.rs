//! What the parts the CRI runtimes on this node call cost when timed alone: `runc create` +
//! `runc start` (containerd's shim) and `runc run --detach` (nodus's shim) of the same
//! busybox container the CRI benchmark runs, and the CNI plugin chain's ADD and DEL with
//! the same network configuration. A CRI phase built on them cannot be faster than they
//! are: this is the floor under the per-phase comparison.

use anyhow::{Context, Result, bail};
use nodus_runtime::sandbox::cni::{Cni, CniConfig, PodNetworkInfo};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use testkit::{CgroupParent, Netns};

/// Samples in milliseconds.
#[derive(Debug, Default)]
pub struct Floors {
    pub runc_create_start: Vec<f64>,
    pub runc_run: Vec<f64>,
    pub cni_add: Vec<f64>,
    pub cni_del: Vec<f64>,
    /// CPU time (user + system) of the processes each round ran: what a burst of pods must
    /// share between the machine's cores.
    pub runc_cpu: Vec<f64>,
    pub runc_run_cpu: Vec<f64>,
    pub cni_add_cpu: Vec<f64>,
}

/// CPU time (ms) of every child process this process has waited for so far.
pub fn children_cpu() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage for the call's duration.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Times `runs` rounds of each part, in a private network namespace and cgroup parent.
pub fn measure(runs: usize) -> Result<Floors> {
    measure_with(runs, crate::targets::Masq::Bridge, false)
}

/// [`measure`] with the CNI chain masquerading as `masq` says, and without the loopback
/// plugin when the runtime brings `lo` up itself (`internal_loopback`).
pub fn measure_with(
    runs: usize,
    masq: crate::targets::Masq,
    internal_loopback: bool,
) -> Result<Floors> {
    let node = Netns::new("floor")?;
    let cg = CgroupParent::new("floor");
    cg.create();
    let dir = tempfile::Builder::new().prefix("bench-floor-").tempdir()?;
    let mut f = Floors::default();
    let oci = MemDir::new(&dir.path().join("oci"))?;
    runc(&node, &cg, &oci.0, runs, &mut f)?;
    drop(oci);
    cni(&node, dir.path(), runs, masq, internal_loopback, &mut f)?;
    Ok(f)
}

/// A tmpfs mounted for the OCI runtime's state and bundles, unmounted on drop: nodus's shim
/// runs runc with both on the runtime's state dir, which is in memory (`/run` on a host,
/// a tmpfs of the runtime's own otherwise), so the floor does the same work.
pub struct MemDir(pub PathBuf);

impl MemDir {
    pub fn new(path: &Path) -> Result<MemDir> {
        std::fs::create_dir_all(path)?;
        nix::mount::mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("mode=711"),
        )
        .with_context(|| format!("mounting a tmpfs on {}", path.display()))?;
        Ok(MemDir(path.to_path_buf()))
    }
}

impl Drop for MemDir {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// A bundle whose rootfs is the host's static busybox, running `sleep 3600` in the namespaces
/// `runc spec` asks for (a new network namespace among them), under `cg`.
pub fn bundle(dir: &Path, cg: &CgroupParent, id: &str) -> Result<PathBuf> {
    let b = dir.join(id);
    std::fs::create_dir_all(b.join("rootfs/bin"))?;
    std::fs::copy(
        testkit::image::busybox::HOST_BUSYBOX,
        b.join("rootfs/bin/busybox"),
    )?;
    run(Command::new("runc").arg("spec").arg("--bundle").arg(&b))?;
    let path = b.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!(["/bin/busybox", "sleep", "3600"]);
    spec["linux"]["cgroupsPath"] = format!("{}/{id}", cg.path()).into();
    std::fs::write(&path, serde_json::to_vec(&spec)?)?;
    Ok(b)
}

/// One container through an OCI runtime (`program`: runc, crun), timed: `run --detach` when
/// `one_process`, else `create` then `start`. Returns (wall ms, CPU ms of the runtime's
/// processes); the container is deleted after.
///
/// The CPU is the runtime's processes' in a cgroup they start in, plus the container's
/// cgroup's: the runtime's own init (`runc init`, which sets the container up and then
/// execs the program) runs in the container's cgroup and is waited for by nobody until the
/// container ends, so counting waited children alone missed about half of runc's work.
fn oci_container(
    program: &str,
    node: &Netns,
    state: &Path,
    bundle_dir: &Path,
    id: &str,
    one_process: bool,
    log: &Path,
) -> Result<(f64, f64)> {
    let meter = crate::treecpu::TreeCpu::new(&format!("bench-floor-{id}"))?;
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle_dir.join("config.json"))?)?;
    let cgroup = spec["linux"]["cgroupsPath"]
        .as_str()
        .with_context(|| format!("{}: no linux.cgroupsPath", bundle_dir.display()))?;
    let container = crate::treecpu::TreeCpu::open(cgroup);
    let runc = |args: &[&str]| -> Result<Command> {
        let mut c = node.command(program)?;
        c.arg("--root").arg(state).args(args);
        meter.join_on_exec(&mut c)?;
        Ok(c)
    };
    let first = if one_process {
        &["run", "--detach"][..]
    } else {
        &["create"][..]
    };
    // The container inherits runc's stdio, so it gets none (a captured pipe would stay open
    // for as long as the container lives); runc's errors go to --log.
    let mut cmd = runc(&["--log", &log.display().to_string()])?;
    cmd.args(first)
        .arg("--bundle")
        .arg(bundle_dir)
        .arg(id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let t = Instant::now();
    let r = match cmd.status() {
        Ok(s) if s.success() && one_process => Ok(()),
        Ok(s) if s.success() => run(&mut runc(&["start", id])?),
        Ok(s) => Err(anyhow::anyhow!(
            "{program} {}: {s}: {}",
            first[0],
            std::fs::read_to_string(log).unwrap_or_default()
        )),
        Err(e) => Err(anyhow::anyhow!("{program} {}: {e}", first[0])),
    };
    let took = ms(t);
    let cpu = meter.ms() + container.ms();
    let _ = runc(&["delete", "--force", id])?.output();
    r.map(|()| (took, cpu))
}

fn runc(node: &Netns, cg: &CgroupParent, dir: &Path, runs: usize, f: &mut Floors) -> Result<()> {
    let state = dir.join("runc-state");
    for i in 0..=runs {
        let mut rounds = Vec::new();
        for (id, one_process) in [
            (format!("floor-{i}"), false),
            (format!("floor-run-{i}"), true),
        ] {
            let b = bundle(dir, cg, &id)?;
            let log = dir.join(format!("{id}.log"));
            rounds.push(oci_container(
                "runc",
                node,
                &state,
                &b,
                &id,
                one_process,
                &log,
            )?);
        }
        // The first round pays for page-cache misses only: left out, as the CRI
        // benchmark's warm-up pod is.
        if i > 0 {
            f.runc_create_start.push(rounds[0].0);
            f.runc_cpu.push(rounds[0].1);
            f.runc_run.push(rounds[1].0);
            f.runc_run_cpu.push(rounds[1].1);
        }
    }
    Ok(())
}

/// `<program> run --detach` of the same container, `runs` times after a warm-up, in its own
/// network namespace and cgroup parent: the floor under a nodus shim's start with that
/// RuntimeClass handler. Returns (wall ms, CPU ms) per run.
pub fn oci_run_detach(program: &str, runs: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let node = Netns::new("floor")?;
    let cg = CgroupParent::new("floor");
    cg.create();
    let tmp = tempfile::Builder::new().prefix("bench-floor-").tempdir()?;
    let dir = MemDir::new(&tmp.path().join("oci"))?;
    let state = dir.0.join(format!("{program}-state"));
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    for i in 0..=runs {
        let id = format!("floor-{program}-{i}");
        let b = bundle(&dir.0, &cg, &id)?;
        let log = dir.0.join(format!("{id}.log"));
        let (w, c) = oci_container(program, &node, &state, &b, &id, true, &log)?;
        // As in `runc`: the first round only warms the page cache.
        if i > 0 {
            wall.push(w);
            cpu.push(c);
        }
    }
    Ok((wall, cpu))
}

fn cni(
    node: &Netns,
    dir: &Path,
    runs: usize,
    masq: crate::targets::Masq,
    internal_loopback: bool,
    f: &mut Floors,
) -> Result<()> {
    let conf = dir.join("net.d");
    std::fs::create_dir_all(&conf)?;
    std::fs::write(
        conf.join("10-bench.conflist"),
        crate::targets::conflist_with(&dir.join("ipam"), masq),
    )?;
    let mut cfg = CniConfig::new(
        vec!["/usr/lib/cni".into(), "/opt/cni/bin".into()],
        &conf,
        dir.join("cni-cache"),
    );
    cfg.internal_loopback = internal_loopback;
    let ns = node.path();
    let pods: Vec<Netns> = (0..=runs)
        .map(|_| Netns::new("floor-pod"))
        .collect::<Result<_>>()?;
    let out = in_netns(&ns, || async {
        let cni = Cni::new(cfg);
        let mut f = Floors::default();
        for (i, pod) in pods.iter().enumerate() {
            let id = format!("floor{i:04}");
            let info = PodNetworkInfo::new(format!("floor-{i}"), "bench", id.clone());
            let t = Instant::now();
            let cpu = children_cpu();
            cni.setup(&id, &pod.path(), &info).await?;
            let add = ms(t);
            let add_cpu = children_cpu() - cpu;
            let t = Instant::now();
            cni.teardown(&id, Some(&pod.path()), &info).await?;
            let del = ms(t);
            if i > 0 {
                f.cni_add.push(add);
                f.cni_del.push(del);
                f.cni_add_cpu.push(add_cpu);
            }
        }
        Ok(f)
    })?;
    f.cni_add = out.cni_add;
    f.cni_del = out.cni_del;
    f.cni_add_cpu = out.cni_add_cpu;
    Ok(())
}

/// The floor's parts for `pods` pods started all at once, as a burst of pods asks them of a
/// runtime: for each pod a network namespace pinned by a bind mount, a `/dev/shm` tmpfs and
/// an overlay root (the mounts every CRI runtime makes per pod: containerd's netns pin,
/// sandbox shm and rootfs), the CNI chain's ADD into that namespace and `runc run --detach`
/// of a container joining it. No runtime of any kind runs: this is what the burst costs
/// the parts alone on this machine, where [`measure`] times one pod at a time on an idle
/// machine.
#[derive(Debug)]
pub struct Burst {
    /// From the first pod's start to the last `runc run` returning.
    pub wall_ms: f64,
    /// CPU (user + system) of the plugins, runc and the containers' cgroups, per pod.
    pub cpu_ms_per_pod: f64,
}

pub fn burst(
    pods: usize,
    masq: crate::targets::Masq,
    internal_loopback: bool,
    mounts: PodMounts,
) -> Result<Burst> {
    let node = Netns::new("floor-burst")?;
    let cg = CgroupParent::new("floor-burst");
    cg.create();
    let dir = tempfile::Builder::new().prefix("bench-burst-").tempdir()?;
    let oci = MemDir::new(&dir.path().join("oci"))?;
    let conf = dir.path().join("net.d");
    std::fs::create_dir_all(&conf)?;
    std::fs::write(
        conf.join("10-bench.conflist"),
        crate::targets::conflist_with(&dir.path().join("ipam"), masq),
    )?;
    let mut cfg = CniConfig::new(
        vec!["/usr/lib/cni".into(), "/opt/cni/bin".into()],
        &conf,
        dir.path().join("cni-cache"),
    );
    cfg.internal_loopback = internal_loopback;
    // The image's one layer, shared by every pod's overlay as a snapshot is.
    let lower = oci.0.join("lower");
    std::fs::create_dir_all(lower.join("bin"))?;
    std::fs::copy(
        testkit::image::busybox::HOST_BUSYBOX,
        lower.join("bin/busybox"),
    )?;
    run(Command::new("runc").arg("spec").arg("--bundle").arg(&oci.0))?;
    let base: serde_json::Value =
        serde_json::from_slice(&std::fs::read(oci.0.join("config.json"))?)?;
    // Bundles and namespaces are made before the clock starts, as an unpacked image and
    // a kubelet's earlier work are; the pins are mounts, so the mount table runc reads is
    // as large from the start as it gets late in a real burst.
    let mut set = Vec::with_capacity(pods);
    for i in 0..pods {
        let pod = Netns::new("floor-burst-pod")?;
        let b = oci.0.join(format!("p{i}"));
        // The writable layer lives on disk, under the runtime's root as containerd's does.
        let layer = dir.path().join(format!("layers/p{i}"));
        for d in [
            b.join("rootfs"),
            b.join("shm"),
            layer.join("upper"),
            layer.join("work"),
        ] {
            std::fs::create_dir_all(&d)?;
        }
        if mounts == PodMounts::NetnsOnly {
            // A root of its own on the tmpfs, linked to the one busybox: no mount.
            std::fs::create_dir_all(b.join("rootfs/bin"))?;
            std::fs::hard_link(lower.join("bin/busybox"), b.join("rootfs/bin/busybox"))?;
        }
        let mut spec = base.clone();
        spec["process"]["terminal"] = false.into();
        spec["process"]["args"] = serde_json::json!(["/bin/busybox", "sleep", "3600"]);
        spec["root"] = serde_json::json!({ "path": b.join("rootfs") });
        spec["linux"]["cgroupsPath"] = format!("{}/floor-burst-{i}", cg.path()).into();
        if let Some(ns) = spec["linux"]["namespaces"].as_array_mut() {
            for n in ns.iter_mut().filter(|n| n["type"] == "network") {
                n["path"] = pod.path().display().to_string().into();
            }
        }
        if let Some(m) = spec["mounts"].as_array_mut()
            && mounts == PodMounts::Runtime
        {
            m.retain(|m| m["destination"] != "/dev/shm");
            m.push(serde_json::json!({
                "destination": "/dev/shm", "type": "bind",
                "source": b.join("shm"), "options": ["rbind", "rw"],
            }));
        }
        std::fs::write(b.join("config.json"), serde_json::to_vec(&spec)?)?;
        set.push((pod, b, layer));
    }
    let state = oci.0.join("runc-state");
    let ns = node.path();
    let t = Instant::now();
    let cpu0 = children_cpu();
    let started = in_netns(&ns, || async {
        let cni = Cni::new(cfg);
        let one = |i: usize| {
            let (pod, b, layer) = &set[i];
            let (cni, state, lower) = (&cni, &state, &lower);
            async move {
                if mounts == PodMounts::Runtime {
                    mount_pod(b, layer, lower)?;
                }
                let id = format!("burst{i:04}");
                let info = PodNetworkInfo::new(format!("burst-{i}"), "bench", id.clone());
                cni.setup(&id, &pod.path(), &info).await?;
                // As in `oci_container`: the container inherits runc's stdio, so
                // it gets none, and runc's errors go to --log.
                let log = b.join("runc.log");
                let st = tokio::process::Command::new("runc")
                    .arg("--root")
                    .arg(state)
                    .arg("--log")
                    .arg(&log)
                    .args(["run", "--detach", "--bundle"])
                    .arg(b)
                    .arg(&id)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .await?;
                if !st.success() {
                    bail!(
                        "runc run {id}: {st}: {}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
                Ok(())
            }
        };
        futures::future::try_join_all((0..pods).map(one)).await?;
        Ok(())
    });
    let wall_ms = ms(t);
    let cpu = children_cpu() - cpu0 + crate::treecpu::TreeCpu::open(&cg.path()).ms();
    for i in 0..pods {
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&state)
            .args(["delete", "--force", &format!("burst{i:04}")])
            .output();
    }
    for (_, b, _) in &set {
        for m in ["rootfs", "shm"] {
            let _ = nix::mount::umount2(&b.join(m), nix::mount::MntFlags::MNT_DETACH);
        }
    }
    started?;
    Ok(Burst {
        wall_ms,
        cpu_ms_per_pod: cpu / pods as f64,
    })
}

/// Runs `work` on a thread that entered the network namespace `ns`, on a runtime of its
/// own: the CNI plugins create the bridge and veths in the namespace they run in, so the
/// host's own network is never touched.
fn in_netns<T: Send, F: std::future::Future<Output = Result<T>>>(
    ns: &Path,
    work: impl FnOnce() -> F + Send,
) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| -> Result<T> {
            let file = std::fs::File::open(ns)?;
            // SAFETY: setns on this thread only, with a valid namespace fd.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                bail!("setns: {}", std::io::Error::last_os_error());
            }
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(work())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the thread in {} panicked", ns.display()))?
    })
}

/// Which of a pod's mounts [`burst`] makes in the node's mount namespace, where runc reads
/// the whole mount table several times per container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodMounts {
    /// The pinned network namespace, the `/dev/shm` tmpfs and the overlay root: what every
    /// CRI runtime mounts per pod.
    Runtime,
    /// The network namespace's pin alone (the CNI plugins need its path); the container's
    /// root a plain directory and its `/dev/shm` runc's own: the mount table a runtime
    /// that kept its per-pod mounts out of the node's mount namespace would leave.
    NetnsOnly,
}

/// A pod's `/dev/shm` tmpfs and its container's overlay root, as a runtime mounts them.
fn mount_pod(bundle: &Path, layer: &Path, lower: &Path) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    mount(
        Some("shm"),
        &bundle.join("shm"),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=1777,size=65536k"),
    )
    .context("mounting the pod's shm")?;
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        layer.join("upper").display(),
        layer.join("work").display()
    );
    mount(
        Some("overlay"),
        &bundle.join("rootfs"),
        Some("overlay"),
        MsFlags::empty(),
        Some(opts.as_str()),
    )
    .context("mounting the pod's overlay root")?;
    Ok(())
}
