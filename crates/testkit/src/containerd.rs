//! A private, throw-away containerd (`/usr/bin/containerd`, 1.6) for comparison tests.
//!
//! [`Containerd::start`] writes `config.toml` into a temp dir, with root, state, the gRPC
//! and ttrpc sockets and the `opt` plugin dir all inside it; the CRI plugin enabled
//! (stream server on 127.0.0.1, random port; overlayfs snapshotter; sandbox image
//! `registry.k8s.io/pause:3.8`, never pulled by testkit; CNI dirs empty; registry hosts from
//! the given `certs.d`); and the snapshotters that probe the machine (btrfs, zfs, aufs,
//! devmapper) disabled. It waits until `ctr --address SOCK version` succeeds.
//!
//! Dropping it SIGTERMs containerd (SIGKILL after 10 s), kills any shim still serving its
//! socket (by PID), unmounts whatever is still mounted under the temp dir (deepest first,
//! lazily), and removes the temp dir. The log is `containerd.log` in the temp dir.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tempfile::TempDir;

use crate::daemon::Daemon;

/// The containerd binary.
pub const CONTAINERD_BIN: &str = "/usr/bin/containerd";
/// The ctr binary.
pub const CTR_BIN: &str = "/usr/bin/ctr";

/// A running private containerd. See the [module docs](self).
pub struct Containerd {
    daemon: Option<Daemon>,
    dir: TempDir,
}

impl std::fmt::Debug for Containerd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Containerd")
            .field("dir", &self.dir.path())
            .field("pid", &self.daemon.as_ref().map(Daemon::pid))
            .finish()
    }
}

fn quote(p: &Path) -> String {
    toml::Value::String(p.to_string_lossy().into_owned()).to_string()
}

/// Where a test containerd runs and what its CRI plugin uses.
#[derive(Default)]
pub struct ContainerdOptions<'a> {
    /// The CRI registry `config_path` (certs.d layout).
    pub certs_d: Option<&'a Path>,
    /// Run it inside this network namespace (a test node), keeping the mount namespace.
    pub netns: Option<&'a crate::Netns>,
    /// CNI plugin and configuration directories (defaults: empty dirs of its own).
    pub cni_bin_dir: Option<&'a Path>,
    pub cni_conf_dir: Option<&'a Path>,
}

impl Containerd {
    /// Starts containerd; `certs_d` becomes the CRI registry `config_path`.
    pub fn start(certs_d: Option<&Path>) -> Result<Containerd> {
        Self::start_with(ContainerdOptions {
            certs_d,
            ..Default::default()
        })
    }

    /// Starts containerd with `opts`.
    pub fn start_with(opts: ContainerdOptions<'_>) -> Result<Containerd> {
        let certs_d = opts.certs_d;
        let dir = tempfile::Builder::new()
            .prefix("testkit-containerd-")
            .tempdir()?;
        let d = dir.path();
        for sub in ["root", "state", "opt", "cni/bin", "cni/conf.d"] {
            std::fs::create_dir_all(d.join(sub))?;
        }
        // containerd's `state` is on /run, a tmpfs on the hosts it runs on, as nodus's
        // runtime keeps its own state dir: the two are compared on the same footing.
        nix::mount::mount(
            Some("tmpfs"),
            &d.join("state"),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("mode=711"),
        )?;
        // Until the Containerd below exists (its drop unmounts everything under the dir), a
        // failure must not leave the tmpfs behind.
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        let state_mount = Unmount(d.join("state"));
        let config = format!(
            r#"version = 2
root = {root}
state = {state}
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = {sock}

[ttrpc]
  address = {ttrpc}

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  sandbox_image = "registry.k8s.io/pause:3.8"
  # This machine kind cannot lower oom_score_adj (no CAP_SYS_RESOURCE in the bounding
  # set); without this, runc fails on containerd's -998 for sandboxes.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = {certs}
"#,
            root = quote(&d.join("root")),
            state = quote(&d.join("state")),
            sock = quote(&d.join("containerd.sock")),
            ttrpc = quote(&d.join("containerd.sock.ttrpc")),
            opt = quote(&d.join("opt")),
            cni_bin = quote(opts.cni_bin_dir.unwrap_or(&d.join("cni/bin"))),
            cni_conf = quote(opts.cni_conf_dir.unwrap_or(&d.join("cni/conf.d"))),
            certs = quote(certs_d.unwrap_or(Path::new(""))),
        );
        let config_path = d.join("config.toml");
        std::fs::write(&config_path, config)?;
        let mut cmd = match opts.netns {
            Some(ns) => ns.command(CONTAINERD_BIN)?,
            None => Command::new(CONTAINERD_BIN),
        };
        cmd.arg("--config").arg(&config_path);
        let mut daemon = Daemon::spawn(
            "containerd",
            cmd,
            &d.join("containerd.log"),
            Duration::from_secs(10),
        )?;
        let sock = d.join("containerd.sock");
        let ready = daemon.wait_ready(Duration::from_secs(30), || {
            sock.exists()
                && Command::new(CTR_BIN)
                    .arg("--address")
                    .arg(&sock)
                    .arg("version")
                    .output()
                    .map(|o| o.status.success())
                    .unwrap_or(false)
        });
        let containerd = Containerd {
            daemon: Some(daemon),
            dir,
        };
        std::mem::forget(state_mount);
        ready?;
        Ok(containerd)
    }

    /// The gRPC socket path.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// `unix:///…/containerd.sock`, for CRI clients (`--container-runtime-endpoint`).
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// The temp dir holding config, root, state, sockets and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// containerd's root directory.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("containerd.log")
    }

    /// containerd's PID.
    pub fn pid(&self) -> u32 {
        self.daemon.as_ref().map(Daemon::pid).unwrap_or(0)
    }

    /// `ctr --address SOCK` with `args`, ready to run.
    pub fn ctr<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = Command::new(CTR_BIN);
        cmd.arg("--address").arg(self.socket()).args(args);
        cmd
    }

    /// Runs `ctr --address SOCK <args>` and returns its stdout; fails with its stderr.
    pub fn ctr_output<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let out = self.ctr(args).output().context("run ctr")?;
        ensure!(
            out.status.success(),
            "ctr failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Kills shims started for this containerd: processes whose command line names our
    /// socket after `-address`.
    /// Kills this containerd's shims; returns the network namespaces (nsfs inodes) their
    /// children (the pod sandboxes' pause processes) were in.
    fn kill_shims(&self) -> Vec<u64> {
        use std::os::unix::fs::MetadataExt as _;
        let sock = self.socket();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut shims = Vec::new();
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_shim = args.first().is_some_and(|a| {
                Path::new(std::ffi::OsStr::from_bytes(a))
                    .file_name()
                    .is_some_and(|n| n.as_bytes().starts_with(b"containerd-shim"))
            });
            let ours = args
                .windows(2)
                .any(|w| w[0] == b"-address" && w[1] == sock.as_os_str().as_bytes());
            if is_shim && ours {
                shims.push(pid);
            }
        }
        let mut netns = Vec::new();
        for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let status = std::fs::read_to_string(p.path().join("status")).unwrap_or_default();
            let ppid = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .and_then(|v| v.trim().parse::<i32>().ok());
            if ppid.is_some_and(|pp| shims.contains(&pp))
                && let Ok(m) = std::fs::metadata(p.path().join("ns/net"))
            {
                netns.push(m.ino());
            }
        }
        for pid in shims {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        netns
    }
}

/// Mount points at or under `dir`, deepest first (none when they cannot be listed).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    nodus_cgroups::mountinfo::mounts_under(dir).unwrap_or_default()
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
        let netns = self.kill_shims();
        // containerd 1.6 pins each sandbox's network namespace at /run/netns/cni-<uuid>
        // (it ignores netns_mounts_under) and only a StopPodSandbox releases it: remove the
        // ones its sandboxes were in, so a test that ends with pods running leaks none.
        if !netns.is_empty() {
            use std::os::unix::fs::MetadataExt as _;
            for e in std::fs::read_dir("/run/netns")
                .into_iter()
                .flatten()
                .flatten()
            {
                let path = e.path();
                let named_cni = e.file_name().to_string_lossy().starts_with("cni-");
                if named_cni && std::fs::metadata(&path).is_ok_and(|m| netns.contains(&m.ino())) {
                    let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let dir = self.dir.path().to_path_buf();
        for _ in 0..3 {
            let mounts = mounts_under(&dir);
            if mounts.is_empty() {
                break;
            }
            for m in mounts {
                let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}
