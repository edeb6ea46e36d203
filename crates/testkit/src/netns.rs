//! Private network namespaces for test nodes, so bridges, pod IPs and iptables rules of a
//! test never touch the machine's own network. Removed on drop.

use anyhow::{Context, Result, bail};
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::Command;

/// A named network namespace (`ip netns add`), with loopback up.
pub struct Netns {
    name: String,
    /// Held open so commands can setns(2) into it.
    file: std::fs::File,
}

impl Netns {
    /// Creates `<prefix>-<random>`.
    pub fn new(prefix: &str) -> Result<Netns> {
        let name = format!("{prefix}-{:08x}", rand_u32());
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .context("running ip netns add")?;
        if !out.status.success() {
            bail!(
                "ip netns add {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let file = std::fs::File::open(PathBuf::from("/run/netns").join(&name))
            .with_context(|| format!("opening /run/netns/{name}"))?;
        let ns = Netns { name, file };
        let out = Command::new("ip")
            .args(["-n", &ns.name, "link", "set", "lo", "up"])
            .output()
            .context("running ip link set lo up")?;
        if !out.status.success() {
            bail!(
                "lo up in {}: {}",
                ns.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace file (`/run/netns/<name>`).
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `program` run inside this network namespace only: unlike `ip netns exec` it keeps
    /// the caller's mount namespace, so mounts made by the child are the test's to see and
    /// to clean up, and a restarted daemon sees its predecessor's mounts.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Result<Command> {
        let mut cmd = Command::new(program);
        // SAFETY: pre_exec runs in the forked child before exec; setns is async-signal-safe
        // and the namespace file stays open for as long as this Netns lives.
        unsafe {
            let fd = self.file.as_raw_fd();
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(cmd)
    }

    /// A TCP connection to `addr` made from inside the namespace: a short-lived thread
    /// enters it, so the socket lives there while the caller stays where it is.
    pub fn connect_tcp(&self, addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpStream> {
        let ns = self.file.try_clone()?;
        std::thread::spawn(move || {
            // SAFETY: setns on this thread only; the fd is valid for the call.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(10))
        })
        .join()
        .map_err(|_| std::io::Error::other("connect thread panicked"))?
    }

    /// `GET path` from `127.0.0.1:port` inside the namespace: (status code, body).
    pub fn http_get(&self, port: u16, path: &str) -> std::io::Result<(u16, String)> {
        use std::io::{Read as _, Write as _};
        let mut s = self.connect_tcp(std::net::SocketAddr::from(([127, 0, 0, 1], port)))?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        let buf = String::from_utf8_lossy(&buf);
        let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((code, body.to_string()))
    }

    /// Runs `program args…` inside the namespace and returns its output.
    /// Gives the namespace an uplink-like interface, `eth0` with 10.250.0.2/24 and the
    /// default route (both veth ends stay inside: the kernel here has no dummy driver), so a
    /// kubelet in it finds its InternalIP the way it does on a real machine.
    pub fn add_uplink(&self) -> Result<()> {
        for args in [
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", "uplink0",
            ][..],
            &["addr", "add", "10.250.0.2/24", "dev", "eth0"],
            &["link", "set", "uplink0", "up"],
            &["link", "set", "eth0", "up"],
            &[
                "route",
                "add",
                "default",
                "via",
                "10.250.0.1",
                "dev",
                "eth0",
            ],
        ] {
            let out = self.run("ip", args)?;
            if !out.status.success() {
                anyhow::bail!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        Ok(())
    }

    pub fn run(&self, program: &str, args: &[&str]) -> Result<std::process::Output> {
        self.command(program)?
            .args(args)
            .output()
            .with_context(|| format!("running {program} in {}", self.name))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    u32::from_ne_bytes(b) ^ std::process::id()
}

/// A cgroup parent of a test's own (`/nodus-test-<random>`), removed with everything
/// below it, in every v1 controller (or the v2 tree), on drop.
pub struct CgroupParent {
    name: String,
}

impl CgroupParent {
    pub fn new(prefix: &str) -> CgroupParent {
        CgroupParent {
            name: format!("{prefix}-{:08x}", rand_u32()),
        }
    }

    /// The parent as the CRI spells it (`/name`).
    pub fn path(&self) -> String {
        format!("/{}", self.name)
    }

    /// Creates the parent in every mounted controller (a kubelet wants its cgroup root to
    /// exist, as upstream's does).
    pub fn create(&self) -> &CgroupParent {
        let base = std::path::Path::new("/sys/fs/cgroup");
        if base.join("cgroup.controllers").exists() {
            // On v2 a kubelet's cgroup root must have the controllers it needs available,
            // as an administrator prepares it (upstream's kubelet does not enable them
            // above its root either): delegate them from the root cgroup, where systemd
            // enables only some.
            for c in ["cpuset", "cpu", "io", "memory", "pids", "hugetlb"] {
                let _ = std::fs::write(base.join("cgroup.subtree_control"), format!("+{c}"));
            }
            let _ = std::fs::create_dir(base.join(&self.name));
            return self;
        }
        let mut dirs = vec![base.to_path_buf()];
        if let Ok(rd) = std::fs::read_dir(base) {
            dirs.extend(rd.flatten().map(|e| e.path()));
        }
        for d in dirs {
            if d.join("cgroup.procs").exists() {
                let _ = std::fs::create_dir(d.join(&self.name));
            }
        }
        self
    }
}

fn remove_cgroup_tree(dir: &std::path::Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    // A cgroup with processes cannot go; kill them first (they are the test's).
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: plain kill(2) of a pid listed in the test's own cgroup.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
    for _ in 0..50 {
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        let root = std::path::Path::new("/sys/fs/cgroup");
        if root.join("cgroup.controllers").exists() {
            remove_cgroup_tree(&root.join(&self.name));
            return;
        }
        if let Ok(rd) = std::fs::read_dir(root) {
            for c in rd.flatten() {
                let d = c.path().join(&self.name);
                if d.exists() {
                    remove_cgroup_tree(&d);
                }
            }
        }
    }
}
