//! Pod sandboxes for real: namespaces pinned by bind mounts, the Debian CNI plugins (loopback,
//! bridge, host-local, portmap) with the default conflist, pod-to-pod traffic and a hostPort.
//!
//! Isolation: the "node" is a private network namespace made for the test (`nodus-sbx-*`). The
//! CNI client runs on a thread that has entered it, so cni0, the veths, ip_forward and the
//! masquerade/portmap iptables rules all land there, and deleting it removes them. Every
//! address the test talks to lives in namespaces it created. Drop guards unpin, delete the
//! namespace and remove the temporary directory also when an assertion fails.

use nodus_runtime::sandbox::cni::{
    Cni, CniConfig, CniError, DefaultNetwork, PodNetworkInfo, PortMapping, Protocol,
};
use nodus_runtime::sandbox::namespaces::{PID_INIT_NAME, is_namespace_file};
use nodus_runtime::sandbox::{
    PinOptions, PinRoot, PinnedNamespaces, pin, pin_pid_namespace, unpin,
};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn have_root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root && std::env::var_os("NODUS_TEST_REQUIRE_ROOT").is_some() {
        panic!("this test needs root and NODUS_TEST_REQUIRE_ROOT is set");
    }
    root
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A private network namespace, deleted on drop.
struct TestNetns {
    name: String,
}

impl TestNetns {
    fn new() -> TestNetns {
        let name = format!(
            "nodus-sbx-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = TestNetns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    fn ip(&self, args: &[&str]) -> String {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Unpins every sandbox directory registered, on drop.
#[derive(Default)]
struct Pins(Vec<PathBuf>);

impl Drop for Pins {
    fn drop(&mut self) {
        for d in &self.0 {
            if let Err(e) = unpin(d) {
                eprintln!("cleanup: unpin {}: {e}", d.display());
            }
        }
    }
}

fn ns_inode(path: &Path) -> (u64, u64) {
    let m = std::fs::metadata(path).unwrap();
    (m.dev(), m.ino())
}

/// Runs `f` on a fresh thread that has entered the network namespace at `netns` (and checked
/// that it did: nothing may run in the host's namespace by mistake).
fn in_netns<T: Send>(netns: &Path, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        let handle = scope.spawn(|| {
            let file = std::fs::File::open(netns).unwrap();
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns {}: {e}", netns.display()));
            assert_eq!(
                ns_inode(Path::new("/proc/thread-self/ns/net")),
                ns_inode(netns),
                "the test thread is not in the test network namespace"
            );
            f()
        });
        match handle.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|mp| mp.starts_with(&dir)))
        .map(String::from)
        .collect()
}

fn nsenter_net(netns: &Path, args: &[&str]) -> std::process::Output {
    Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(args)
        .output()
        .unwrap()
}

/// Files of host-local's data dir that are allocations (named by an IP).
fn allocations(ipam: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(ipam.join("nodus")) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<IpAddr>().is_ok())
        .collect()
}

/// A TCP server inside the network namespace `netns` answering `conns` connections on `port`.
fn serve_in(netns: PathBuf, port: u16, conns: usize) -> std::thread::JoinHandle<usize> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let file = std::fs::File::open(&netns).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).unwrap();
        l.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut served = 0;
        while served < conns && Instant::now() < deadline {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    let _ = s.write_all(b"hello from pod A\n");
                    served += 1;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        served
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    h
}

#[test]
fn sandbox_net_two_pods_ping_hostport_and_clean_teardown() {
    if !have_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tmp_path = tmp.path().canonicalize().unwrap();
    let node = TestNetns::new();
    let mut pins = Pins::default();
    // The node's own address inside the test namespace (no dummy driver in this kernel: lo).
    node.ip(&["addr", "add", "192.168.77.1/32", "dev", "lo"]);

    let ipam = tmp_path.join("ipam");
    let cni = Cni::new(CniConfig::new(
        vec!["/opt/cni/bin".into(), "/usr/lib/cni".into()],
        tmp_path.join("net.d"),
        tmp_path.join("cni-cache"),
    ));
    assert!(!cni.status().ready);
    assert!(
        cni.ensure_default_config_with(
            &DefaultNetwork::new(Some("10.244.7.0/24")).with_ipam_data_dir(&ipam)
        )
        .unwrap()
    );
    let status = cni.status();
    assert!(status.ready, "{}", status.message);

    let dir_a = tmp_path.join("sandboxes/sba/ns");
    let dir_b = tmp_path.join("sandboxes/sbb/ns");
    pins.0.push(dir_a.clone());
    pins.0.push(dir_b.clone());
    let a = pin(&dir_a, &PinOptions::pod("pod-a")).unwrap();
    let b = pin(&dir_b, &PinOptions::pod("pod-b")).unwrap();
    let net_a = a.net.clone().unwrap();
    let net_b = b.net.clone().unwrap();
    assert_eq!(PinnedNamespaces::load(&dir_a).unwrap(), a);
    assert_ne!(ns_inode(&net_a), ns_inode(&net_b));
    assert_ne!(ns_inode(&net_a), ns_inode(Path::new("/proc/self/ns/net")));
    assert_ne!(
        ns_inode(a.ipc.as_ref().unwrap()),
        ns_inode(Path::new("/proc/self/ns/ipc"))
    );
    let hostname = run(Command::new("nsenter")
        .arg(format!("--uts={}", a.uts.as_ref().unwrap().display()))
        .arg("hostname"));
    assert_eq!(hostname.trim(), "pod-a");

    let mut pod_a = PodNetworkInfo::new("pod-a", "default", "uid-a");
    pod_a.port_mappings.push(PortMapping {
        protocol: Protocol::Tcp,
        container_port: 8080,
        host_port: 18080,
        host_ip: String::new(),
    });
    let pod_b = PodNetworkInfo::new("pod-b", "default", "uid-b");

    in_netns(&node.path(), || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ra = cni.setup("sba", &net_a, &pod_a).await.unwrap();
            let rb = cni.setup("sbb", &net_b, &pod_b).await.unwrap();
            let (ip_a, ip_b) = (ra.primary_ip().unwrap(), rb.primary_ip().unwrap());
            for ip in [ip_a, ip_b] {
                match ip {
                    IpAddr::V4(v4) => assert_eq!(v4.octets()[..3], [10, 244, 7]),
                    _ => panic!("expected IPv4, got {ip}"),
                }
            }
            assert_ne!(ip_a, ip_b);
            assert_eq!(ra.ips[0].interface.as_deref(), Some("eth0"));
            assert_eq!(allocations(&ipam).len(), 2);

            // The IPs are on eth0 inside the pinned namespaces; lo is up.
            for (ns, ip) in [(&net_a, ip_a), (&net_b, ip_b)] {
                let out = nsenter_net(ns, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"]);
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(text.contains(&format!("inet {ip}/24")), "{text}");
                let lo = nsenter_net(ns, &["ip", "-o", "link", "show", "lo"]);
                assert!(String::from_utf8_lossy(&lo.stdout).contains("UP"));
            }

            // Pod to pod over cni0.
            for (from, to) in [(&net_a, ip_b), (&net_b, ip_a)] {
                let out = nsenter_net(from, &["busybox", "ping", "-c1", "-W2", &to.to_string()]);
                assert!(
                    out.status.success(),
                    "ping {to}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }

            // CHECK: loopback, bridge and host-local confirm. Debian's portmap 1.1.1 checks an
            // IPv6 chain even for an IPv4-only pod and fails (fixed upstream later); no CRI
            // call runs CHECK, so only that known failure is tolerated.
            for (id, ns, pod) in [("sba", &net_a, &pod_a), ("sbb", &net_b, &pod_b)] {
                match cni.check(id, ns, pod).await {
                    Ok(()) => {}
                    Err(CniError::Plugin { plugin, msg, .. })
                        if plugin == "portmap" && msg.contains("could not check ipv6 dnat") => {}
                    Err(e) => panic!("CHECK {id}: {e}"),
                }
            }

            // hostPort 18080 -> pod A:8080, from the node (OUTPUT path) and from pod B
            // (PREROUTING path).
            let server = serve_in(net_a.clone(), 8080, 2);
            let addr = SocketAddr::from(([192, 168, 77, 1], 18080));
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut got = String::new();
            s.read_to_string(&mut got).unwrap();
            assert_eq!(got, "hello from pod A\n");
            let out = nsenter_net(
                &net_b,
                &["busybox", "nc", "-w", "3", "192.168.77.1", "18080"],
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "hello from pod A\n",
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(server.join().unwrap(), 2);

            // Teardown A; again (idempotent).
            cni.teardown("sba", Some(&net_a), &pod_a).await.unwrap();
            cni.teardown("sba", Some(&net_a), &pod_a).await.unwrap();
            let out = nsenter_net(&net_a, &["ip", "-o", "link", "show", "eth0"]);
            assert!(!out.status.success(), "eth0 still in pod A after DEL");
            let err = cni.check("sba", &net_a, &pod_a).await.unwrap_err();
            assert!(err.to_string().contains("no cached result"), "{err}");

            // B's namespace disappears first (a crash, a reboot); DEL still releases its IP.
            unpin(&dir_b).unwrap();
            assert!(!net_b.exists());
            cni.teardown("sbb", Some(&net_b), &pod_b).await.unwrap();
            cni.teardown("sbb", None, &pod_b).await.unwrap();

            assert_eq!(allocations(&ipam), Vec::<String>::new());
            let cached: Vec<_> = std::fs::read_dir(tmp_path.join("cni-cache/results"))
                .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            assert!(cached.is_empty(), "{cached:?}");
            // portmap removed the pod's DNAT chain (this thread is in the test namespace).
            let nat = run(Command::new("iptables").args(["-t", "nat", "-S"]));
            assert!(nat.contains("CNI-HOSTPORT-DNAT"), "{nat}");
            assert!(!nat.contains("CNI-DN-"), "{nat}");
        });
    });

    unpin(&dir_a).unwrap();
    unpin(&dir_a).unwrap();
    assert!(!dir_a.exists() && !dir_b.exists());
    assert_eq!(mounts_under(&tmp_path), Vec::<String>::new());
}

/// `use-internal-loopback`: the runtime brings `lo` up itself, as CRI-O does, so the
/// loopback plugin is neither run nor required, and nothing is cached for it.
#[test]
fn sandbox_net_internal_loopback_needs_no_plugin() {
    if !have_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tmp_path = tmp.path().canonicalize().unwrap();
    let node = TestNetns::new();
    let mut pins = Pins::default();
    // Only the pod network's plugins: no `loopback` binary anywhere the runtime looks.
    let bin = tmp_path.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for plugin in ["bridge", "host-local", "portmap"] {
        let found = ["/usr/lib/cni", "/opt/cni/bin"]
            .iter()
            .map(|d| Path::new(d).join(plugin))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("the CNI plugin {plugin} is not installed"));
        std::os::unix::fs::symlink(found, bin.join(plugin)).unwrap();
    }
    let mut config = CniConfig::new(
        vec![bin.clone()],
        tmp_path.join("net.d"),
        tmp_path.join("cni-cache"),
    );
    config.internal_loopback = true;
    let cni = Cni::new(config);
    let ipam = tmp_path.join("ipam");
    cni.ensure_default_config_with(
        &DefaultNetwork::new(Some("10.244.8.0/24")).with_ipam_data_dir(&ipam),
    )
    .unwrap();
    let status = cni.status();
    assert!(status.ready, "{}", status.message);

    let dir = tmp_path.join("sandboxes/sbl/ns");
    pins.0.push(dir.clone());
    let pinned = pin(&dir, &PinOptions::pod("pod-l")).unwrap();
    let net = pinned.net.clone().unwrap();
    let pod = PodNetworkInfo::new("pod-l", "default", "uid-l");
    let before = nsenter_net(&net, &["ip", "-o", "link", "show", "lo"]);
    assert!(
        !String::from_utf8_lossy(&before.stdout).contains(",UP"),
        "lo is up before the pod network is set up: {}",
        String::from_utf8_lossy(&before.stdout)
    );
    in_netns(&node.path(), || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            cni.setup("sbl", &net, &pod).await.unwrap();
            let lo = nsenter_net(&net, &["ip", "-o", "link", "show", "lo"]);
            assert!(
                String::from_utf8_lossy(&lo.stdout).contains(",UP"),
                "{}",
                String::from_utf8_lossy(&lo.stdout)
            );
            let ping = nsenter_net(&net, &["busybox", "ping", "-c1", "-W2", "127.0.0.1"]);
            assert!(ping.status.success(), "{ping:?}");
            assert!(
                !tmp_path
                    .join("cni-cache/results/cni-loopback-sbl-lo")
                    .exists()
            );
            cni.check("sbl", &net, &pod).await.unwrap();
            cni.teardown("sbl", Some(&net), &pod).await.unwrap();
            assert_eq!(allocations(&ipam), Vec::<String>::new());
        });
    });
    unpin(&dir).unwrap();
    assert_eq!(mounts_under(&tmp_path), Vec::<String>::new());
}

/// Unmounts what a failed assertion left under a test directory.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        for m in nodus_cgroups::mountinfo::mounts_under(&self.0).unwrap_or_default() {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

#[test]
fn sandboxes_share_one_mount_point_whose_unmounts_reach_cloned_mount_namespaces() {
    if !have_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tmp_path = tmp.path().canonicalize().unwrap();
    let _unmount = Unmount(tmp_path.clone());
    let root_dir = tmp_path.join("sandboxes");
    let root = PinRoot::prepare(&root_dir).unwrap();
    let mut pins = Pins::default();
    let dir_a = root_dir.join("sba/ns");
    let dir_b = root_dir.join("sbb/ns");
    pins.0.push(dir_a.clone());
    pins.0.push(dir_b.clone());
    let a = pin(&dir_a, &PinOptions::pod("pod-a")).unwrap();
    pin(&dir_b, &PinOptions::pod("pod-b")).unwrap();

    // One mount for the root, shared, and the three pins of each sandbox: no mount per
    // sandbox directory.
    let mounts = mounts_under(&tmp_path);
    assert_eq!(mounts.len(), 7, "{mounts:#?}");
    let root_line = mounts
        .iter()
        .find(|l| l.split(' ').nth(4) == Some(root_dir.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{} is not a mount point: {mounts:#?}", root_dir.display()));
    assert!(root_line.contains(" shared:"), "{root_line}");
    assert!(
        !mounts
            .iter()
            .any(|l| l.split(' ').nth(4) == Some(dir_a.to_str().unwrap()))
    );

    // A daemon started again finds the root mounted and leaves it (and the pins) as it is.
    let again = PinRoot::prepare(&root_dir).unwrap();
    assert_eq!(mounts_under(&tmp_path).len(), 7);
    assert_eq!(PinnedNamespaces::load(&dir_a).unwrap(), a);
    again.release();
    root.release();
    assert_eq!(
        mounts_under(&tmp_path).len(),
        7,
        "released with pods pinned"
    );

    // A mount namespace cloned meanwhile (its propagation unchanged, as a daemon's private
    // /tmp is made) holds a copy of the pins; unpin's unmount reaches it.
    let mut holder = Command::new("unshare")
        .args(["--mount", "--propagation", "unchanged", "sleep", "60"])
        .spawn()
        .unwrap();
    let net_a = a.net.clone().unwrap();
    let net_a_str = net_a.to_str().unwrap().to_string();
    let holder_mounts =
        || std::fs::read_to_string(format!("/proc/{}/mountinfo", holder.id())).unwrap_or_default();
    // Once it runs sleep, unshare has made its mount namespace.
    let comm =
        || std::fs::read_to_string(format!("/proc/{}/comm", holder.id())).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while comm().trim() != "sleep" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_ne!(
        std::fs::read_link(format!("/proc/{}/ns/mnt", holder.id())).unwrap(),
        std::fs::read_link("/proc/self/ns/mnt").unwrap()
    );
    assert!(holder_mounts().contains(&net_a_str), "{}", holder_mounts());
    unpin(&dir_a).unwrap();
    let after = holder_mounts();
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(!after.contains(&net_a_str), "{after}");

    unpin(&dir_b).unwrap();
    root.release();
    assert_eq!(mounts_under(&tmp_path), Vec::<String>::new());
}

#[test]
fn sandbox_pid_namespace_init_reaps_and_is_killed_by_unpin() {
    if !have_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tmp_path = tmp.path().canonicalize().unwrap();
    let dir = tmp_path.join("sandboxes/sbp/ns");
    let mut pins = Pins::default();
    pins.0.push(dir.clone());
    let p = pin(
        &dir,
        &PinOptions {
            pid: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(p.net.is_none() && p.ipc.is_none() && p.uts.is_none());
    let pid_path = p.pid.clone().unwrap();
    let init = p.pid_init.unwrap();
    // What a restarted daemon reads back.
    assert_eq!(PinnedNamespaces::load(&dir).unwrap(), p);

    let status = std::fs::read_to_string(format!("/proc/{init}/status")).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap()
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(field("Name:"), [PID_INIT_NAME]);
    assert_eq!(field("NSpid:"), [init.to_string(), "1".to_string()]);
    assert_ne!(
        field("PPid:"),
        [std::process::id().to_string()],
        "init not detached"
    );
    let stat = std::fs::read_to_string(format!("/proc/{init}/stat")).unwrap();
    let after = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect::<Vec<_>>();
    assert_eq!(
        after[3],
        init.to_string(),
        "init is not its own session leader"
    );
    assert_eq!(
        ns_inode(&pid_path),
        ns_inode(Path::new(&format!("/proc/{init}/ns/pid")))
    );

    // A process joining the namespace is pid >1 in it; its orphans are reaped by the init.
    let out = run(Command::new("nsenter")
        .arg(format!("--pid={}", pid_path.display()))
        .args([
            "busybox",
            "sh",
            "-c",
            "busybox sleep 1 </dev/null >/dev/null 2>&1 & busybox cat /proc/self/status",
        ]));
    let nspid: Vec<&str> = out
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(nspid.len(), 2, "{out}");
    assert!(nspid[1].parse::<u32>().unwrap() > 1);
    let children = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert!(
        !children(init).is_empty(),
        "the orphaned sleep was not reparented to the init"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !children(init).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(children(init), Vec::<String>::new(), "zombie not reaped");

    // SIGTERM ends an init (pause semantics); checked on a second one.
    let extra = tmp_path.join("extra-pid");
    let init2 = pin_pid_namespace(&extra, None).unwrap();
    assert!(is_namespace_file(&extra));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init2 as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_gone(init2), "init did not exit on SIGTERM");
    nix::mount::umount2(&extra, nix::mount::MntFlags::MNT_DETACH).unwrap();

    unpin(&dir).unwrap();
    assert!(wait_gone(init), "unpin left the init running");
    assert!(!dir.exists());
    unpin(&dir).unwrap();
    assert_eq!(mounts_under(&tmp_path), Vec::<String>::new());
}

fn wait_gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(s)
                if s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z')) =>
            {
                return true;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    false
}

#[test]
fn sandbox_files_shm_mount_and_unmount() {
    if !have_root() {
        return;
    }
    use nodus_runtime::sandbox::files;
    let tmp = tempfile::tempdir().unwrap();
    let tmp_path = tmp.path().canonicalize().unwrap();
    let shm = tmp_path.join("sb/shm");
    files::mount_shm(&shm, files::DEFAULT_SHM_SIZE).unwrap();
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = files::unmount_shm(&self.0);
        }
    }
    let _guard = Unmount(shm.clone());
    let mounts = mounts_under(&shm);
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    let line = &mounts[0];
    assert!(line.contains("nosuid,nodev,noexec"), "{line}");
    assert!(line.contains(" - tmpfs shm "), "{line}");
    assert!(line.contains("size=65536k"), "{line}");
    let vfs = nix::sys::statvfs::statvfs(&shm).unwrap();
    assert_eq!(
        vfs.blocks() as u64 * vfs.fragment_size() as u64,
        files::DEFAULT_SHM_SIZE
    );
    files::unmount_shm(&shm).unwrap();
    files::unmount_shm(&shm).unwrap();
    assert!(!shm.exists());
    assert_eq!(mounts_under(&tmp_path), Vec::<String>::new());
}
