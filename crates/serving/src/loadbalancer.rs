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

use std::io::{Error, ErrorKind};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    pub async fn start(listen: SocketAddr, servers: &[String]) -> std::io::Result<LoadBalancer> {
        let targets = servers
            .iter()
            .map(|s| host_port(s))
            .collect::<std::io::Result<Vec<_>>>()?;
        if targets.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "no API server to balance across",
            ));
        }
        let listener = TcpListener::bind(listen).await.map_err(|e| {
            Error::new(
                e.kind(),
                format!("API server load balancer: binding {listen}: {e}"),
            )
        })?;
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
fn host_port(url: &str) -> std::io::Result<String> {
    let invalid = |why: String| Error::new(ErrorKind::InvalidInput, why);
    let expected = || invalid(format!("API server {url:?}: expected https://HOST[:PORT]"));
    let rest = url.strip_prefix("https://").ok_or_else(expected)?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(expected());
    }
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
            .map_err(|_| invalid(format!("API server {url:?}: port {port:?} is not a number")))?;
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
