//! The node's local API server load balancer, as k3s's agent runs one: with several API
//! servers (`nodus node --server https://a:6443,https://b:6443`), every component of the
//! node (kubelet, kube-proxy, the pod network agent, cluster DNS) talks to
//! `https://127.0.0.1:<port>` and this forwards each TCP connection to an API server that
//! accepts it.
//!
//! It forwards bytes, not requests: TLS stays end to end between the component and the API
//! server (whose serving certificate names 127.0.0.1, as every nodus control plane's does),
//! so client certificates and tokens work unchanged. A connection goes to the server the
//! previous one reached; when that server refuses or does not answer within
//! [`DIAL_TIMEOUT`], the next one in the list is tried and becomes the one new connections
//! use. When a server dies its open connections (watches, the kubelet's pooled connection)
//! end, the clients reconnect, and those connections land on a live server — which is how
//! a kubelet keeps its Lease and its pods through a control plane's failure.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};

/// How long one API server gets to accept a connection before the next is tried.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(3);

/// k3s's agent load balancer port for the API server.
pub const DEFAULT_PORT: u16 = 6444;

/// A running load balancer; it stops when dropped.
pub struct LoadBalancer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LoadBalancer {
    /// Listens on `listen` and forwards to `servers` (`https://host[:port]` URLs).
    pub async fn start(listen: SocketAddr, servers: &[String]) -> anyhow::Result<LoadBalancer> {
        let targets = servers
            .iter()
            .map(|s| host_port(s))
            .collect::<anyhow::Result<Vec<_>>>()?;
        anyhow::ensure!(!targets.is_empty(), "no API server to balance across");
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("API server load balancer: binding {listen}"))?;
        let addr = listener.local_addr()?;
        let servers = Arc::new(Servers {
            targets,
            current: Mutex::new(0),
        });
        let task = tokio::spawn(serve(listener, Arc::clone(&servers)));
        tracing::info!(listen = %addr, servers = ?servers.targets, "API server load balancer started");
        Ok(LoadBalancer { addr, task })
    }

    /// The URL components use in place of the API servers'.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

struct Servers {
    /// `host:port` of each API server, in the order given.
    targets: Vec<String>,
    /// Index of the server the last connection reached.
    current: Mutex<usize>,
}

impl Servers {
    fn current(&self) -> usize {
        *self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection to the current server, else to the next that accepts one, which
    /// becomes current.
    async fn dial(&self) -> Option<TcpStream> {
        let first = self.current();
        let n = self.targets.len();
        for i in (0..n).map(|k| (first + k) % n) {
            let target = &self.targets[i];
            match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(target.as_str())).await {
                Ok(Ok(conn)) => {
                    let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
                    if *cur != i {
                        tracing::warn!(from = %self.targets[*cur], to = %target, "API server load balancer: switching server");
                        *cur = i;
                    }
                    return Some(conn);
                }
                Ok(Err(e)) => {
                    tracing::debug!(server = %target, error = %e, "API server load balancer: dial failed")
                }
                Err(_) => {
                    tracing::debug!(server = %target, "API server load balancer: dial timed out")
                }
            }
        }
        None
    }
}

async fn serve(listener: TcpListener, servers: Arc<Servers>) {
    loop {
        let (mut client, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: back off rather than spin.
                tracing::warn!(error = %e, "API server load balancer: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let servers = Arc::clone(&servers);
        tokio::spawn(async move {
            let Some(mut upstream) = servers.dial().await else {
                tracing::warn!(peer = %peer, servers = ?servers.targets, "API server load balancer: no API server accepts connections");
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        });
    }
}

/// `host:port` of an `https://host[:port][/path]` URL (port 443 when absent).
fn host_port(url: &str) -> anyhow::Result<String> {
    let rest = url
        .strip_prefix("https://")
        .with_context(|| format!("API server {url:?}: expected https://HOST[:PORT]"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    anyhow::ensure!(
        !authority.is_empty() && !authority.contains('@'),
        "API server {url:?}: expected https://HOST[:PORT]"
    );
    let has_port = match authority.rsplit_once(':') {
        // `[::1]` alone has colons but no port.
        Some((host, port)) => !host.is_empty() && !port.contains(']'),
        None => false,
    };
    if has_port {
        let port = authority
            .rsplit_once(':')
            .map(|(_, p)| p)
            .unwrap_or_default();
        port.parse::<u16>()
            .with_context(|| format!("API server {url:?}: port {port:?} is not a number"))?;
        Ok(authority.to_string())
    } else {
        Ok(format!("{authority}:443"))
    }
}

/// The API servers of a `--server` value: one URL, or several separated by commas.
pub fn split_servers(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Writes a copy of the kubeconfig at `src` whose clusters point at `url`, to `dst` (0600):
/// paths in it are made absolute, as they were relative to `src`'s directory.
pub fn rewrite_kubeconfig(
    src: &std::path::Path,
    dst: &std::path::Path,
    url: &str,
) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(src).with_context(|| format!("reading {}", src.display()))?;
    let mut kc: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("parsing {}", src.display()))?;
    let base = src.parent().unwrap_or(std::path::Path::new("."));
    let absolute = |v: &mut serde_yaml::Value| {
        if let Some(p) = v.as_str()
            && !std::path::Path::new(p).is_absolute()
        {
            *v = serde_yaml::Value::String(base.join(p).display().to_string());
        }
    };
    for list in ["clusters", "users"] {
        let Some(items) = kc.get_mut(list).and_then(|v| v.as_sequence_mut()) else {
            continue;
        };
        for item in items {
            let inner = if list == "clusters" {
                "cluster"
            } else {
                "user"
            };
            let Some(m) = item.get_mut(inner).and_then(|v| v.as_mapping_mut()) else {
                continue;
            };
            if list == "clusters" {
                m.insert("server".into(), url.into());
            }
            for key in [
                "certificate-authority",
                "client-certificate",
                "client-key",
                "tokenFile",
            ] {
                if let Some(v) = m.get_mut(key) {
                    absolute(v);
                }
            }
        }
    }
    let out = serde_yaml::to_string(&kc)?;
    nodus_serving::private::write(dst, out.as_bytes())
        .with_context(|| format!("writing {}", dst.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn server_urls() {
        assert_eq!(host_port("https://10.0.0.1:6443").unwrap(), "10.0.0.1:6443");
        assert_eq!(host_port("https://cp.example/").unwrap(), "cp.example:443");
        assert_eq!(host_port("https://[::1]:6443").unwrap(), "[::1]:6443");
        assert_eq!(host_port("https://[::1]").unwrap(), "[::1]:443");
        assert!(host_port("http://10.0.0.1:6443").is_err());
        assert!(host_port("https://10.0.0.1:x").is_err());
        assert_eq!(
            split_servers("https://a:1, https://b:2,"),
            ["https://a:1", "https://b:2"]
        );
    }

    #[test]
    fn the_rewritten_kubeconfig_points_at_the_balancer_with_absolute_paths() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("kubelet.kubeconfig");
        std::fs::write(
            &src,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority: pki/ca.crt\nusers:\n- name: u\n  user:\n    client-certificate: /abs/client.pem\n    client-key: client.key\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
        )
        .unwrap();
        let dst = d.path().join("out").join("lb.kubeconfig");
        std::fs::create_dir(d.path().join("out")).unwrap();
        rewrite_kubeconfig(&src, &dst, "https://127.0.0.1:6444").unwrap();
        let kc = kube::config::Kubeconfig::read_from(&dst).unwrap();
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6444"));
        let ca = d.path().join("pki/ca.crt").display().to_string();
        assert_eq!(cluster.certificate_authority.as_deref(), Some(ca.as_str()));
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.client_certificate.as_deref(), Some("/abs/client.pem"));
        let key = d.path().join("client.key").display().to_string();
        assert_eq!(user.client_key.as_deref(), Some(key.as_str()));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dst).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    /// A server that answers each connection with its name.
    async fn named(name: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut c, _)) = l.accept().await else {
                    return;
                };
                let _ = c.write_all(name.as_bytes()).await;
            }
        });
        (addr, task)
    }

    async fn ask(lb: &LoadBalancer) -> String {
        let mut c = TcpStream::connect(lb.addr).await.unwrap();
        let mut buf = vec![0; 16];
        let n = c.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn connections_move_to_the_next_server_when_one_dies_and_stay_there() {
        let (a, a_task) = named("a").await;
        let (b, _b_task) = named("b").await;
        let lb = LoadBalancer::start(
            "127.0.0.1:0".parse().unwrap(),
            &[format!("https://{a}"), format!("https://{b}")],
        )
        .await
        .unwrap();
        assert_eq!(ask(&lb).await, "a");
        a_task.abort();
        // The listener closes once the aborted task is dropped.
        for _ in 0..50 {
            if TcpStream::connect(a).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(ask(&lb).await, "b");
        assert_eq!(ask(&lb).await, "b");
    }
}
