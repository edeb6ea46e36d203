//! A local etcd member as a child process (Debian's `/usr/bin/etcd`): `nodus up --store etcd`
//! without `--etcd-servers`, and tests and benchmarks of the etcd backend. It listens on
//! 127.0.0.1 only, keeps its data in the given directory and is stopped when dropped.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd binary: `$NODUS_ETCD` or Debian's.
pub fn etcd_binary() -> PathBuf {
    std::env::var_os("NODUS_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

/// How long a fresh member may take to serve clients.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running etcd member.
pub struct EtcdServer {
    child: Child,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
}

/// A free port on 127.0.0.1 (asked of the kernel, then released for etcd to bind).
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// The client and peer ports of the member whose data is in `data_dir`: the ones it used
/// before (kept in `data_dir/ports`, so a restarted member has the peer URL its data
/// records), else `preferred` when both are free (etcd's 2379 and 2380 for `nodus up`'s
/// static pod), else free ones.
pub fn member_ports(data_dir: &Path, preferred: Option<(u16, u16)>) -> std::io::Result<(u16, u16)> {
    let file = data_dir.join("ports");
    let recorded = std::fs::read_to_string(&file).ok().and_then(|s| {
        let (c, p) = s.trim().split_once(' ')?;
        Some((c.parse().ok()?, p.parse().ok()?))
    });
    if let Some(ports) = recorded {
        return Ok(ports);
    }
    let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
    let ports = match preferred {
        Some((c, p)) if free(c) && free(p) => (c, p),
        _ => (free_port()?, free_port()?),
    };
    std::fs::create_dir_all(data_dir)?;
    std::fs::write(&file, format!("{} {}\n", ports.0, ports.1))?;
    Ok(ports)
}

/// etcd's flags for member `name` of `cluster` (`name=peer-url,…`), serving clients and
/// peers on 127.0.0.1 with its data in `data_dir/member-data`.
pub fn member_args(
    name: &str,
    data_dir: &Path,
    client_port: u16,
    peer_port: u16,
    cluster: &str,
) -> Vec<String> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    vec![
        format!("--name={name}"),
        format!("--data-dir={}", data_dir.join("member-data").display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster={cluster}"),
        "--initial-cluster-state=new".to_string(),
        // The API server's watch cache learns etcd's revision from these even when no
        // event under its prefix moved it (the default is every 10 minutes).
        "--experimental-watch-progress-notify-interval=5s".to_string(),
    ]
}

impl EtcdServer {
    /// Starts a member with its data in `data_dir`: on the ports it used before (kept in
    /// `data_dir/ports`, so a restarted member has the peer URL its data records), else on
    /// free ones.
    pub fn start(data_dir: &Path) -> std::io::Result<EtcdServer> {
        let (client, peer) = member_ports(data_dir, None)?;
        Self::start_on(data_dir, client, peer)
    }

    /// Starts a member on the given ports (a restart on the ports clients know).
    pub fn start_on(
        data_dir: &Path,
        client_port: u16,
        peer_port: u16,
    ) -> std::io::Result<EtcdServer> {
        let cluster = format!("nodus=http://127.0.0.1:{peer_port}");
        Self::spawn("nodus", data_dir, client_port, peer_port, &cluster)
    }

    /// Starts a cluster of `members` members on free ports, each with its data under
    /// `data_dir/<name>`; returns once every one serves clients (they elect a leader once
    /// a quorum is up).
    pub fn start_cluster(data_dir: &Path, members: usize) -> std::io::Result<Vec<EtcdServer>> {
        let ports = (0..members)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<std::io::Result<Vec<(u16, u16)>>>()?;
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut started = Vec::new();
        for (i, (client, peer)) in ports.into_iter().enumerate() {
            let name = format!("m{i}");
            let dir = data_dir.join(&name);
            started.push(Self::spawn_only(&name, &dir, client, peer, &cluster)?);
        }
        for m in &mut started {
            m.wait_ready()?;
        }
        Ok(started)
    }

    fn spawn(
        name: &str,
        data_dir: &Path,
        client_port: u16,
        peer_port: u16,
        cluster: &str,
    ) -> std::io::Result<EtcdServer> {
        let mut server = Self::spawn_only(name, data_dir, client_port, peer_port, cluster)?;
        server.wait_ready()?;
        Ok(server)
    }

    fn spawn_only(
        name: &str,
        data_dir: &Path,
        client_port: u16,
        peer_port: u16,
        cluster: &str,
    ) -> std::io::Result<EtcdServer> {
        std::fs::create_dir_all(data_dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data_dir.join("etcd.log"))?;
        let bin = etcd_binary();
        let child = Command::new(&bin)
            .args(member_args(name, data_dir, client_port, peer_port, cluster))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", bin.display())))?;
        Ok(EtcdServer {
            child,
            client_port,
            peer_port,
            data_dir: data_dir.to_path_buf(),
        })
    }

    fn wait_ready(&mut self) -> std::io::Result<()> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port));
        let start = Instant::now();
        while start.elapsed() < READY_TIMEOUT {
            if let Some(status) = self.child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "etcd exited with {status}; see {}",
                    self.data_dir.join("etcd.log").display()
                )));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(std::io::Error::other(format!(
            "etcd did not listen on {addr} within {READY_TIMEOUT:?}"
        )))
    }

    /// The client URL (`--etcd-servers`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the member: SIGTERM, then SIGKILL after a grace period.
    pub fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        // SAFETY: kill(2) on our own child's PID, which is not reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}
