//! The forwarder: names outside the cluster zone go to the resolv.conf nameservers, as
//! CoreDNS's `forward . /etc/resolv.conf`. Each upstream gets one UDP try bounded by
//! [`TRY_TIMEOUT`], repeated over TCP when the answer is truncated; when every upstream
//! failed the caller answers SERVFAIL.
//!
//! Loopback stubs such as 127.0.0.53 are kept, as CoreDNS keeps them (its `loop` plugin only
//! detects a loop; kubelet hands pods another resolv.conf). Only our own listen addresses
//! are dropped, since forwarding to ourselves would loop.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UdpSocket};

/// How long one try (UDP, or the TCP retry) may take.
pub(crate) const TRY_TIMEOUT: Duration = Duration::from_secs(2);
const DNS_PORT: u16 = 53;

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("reading {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("{path}:{line}: nameserver {value:?} is not an IP address")]
    Nameserver {
        path: String,
        line: usize,
        value: String,
    },
    #[error("no upstream answered")]
    NoAnswer,
}

/// The `nameserver` lines of a resolv.conf. Beside the standard `IP`, `IP:port` and
/// `[IPv6]:port` are accepted (a port other than 53, for tests and benchmarks).
pub(crate) fn read_resolv_conf(path: &Path) -> Result<Vec<SocketAddr>, ForwardError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|err| ForwardError::Read {
        path: shown.clone(),
        err,
    })?;
    parse_resolv_conf(&shown, &text)
}

fn parse_resolv_conf(path: &str, text: &str) -> Result<Vec<SocketAddr>, ForwardError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            continue;
        }
        let Some(value) = words.next() else { continue };
        // A zone index (fe80::1%eth0) cannot be used from here; glibc drops it as well.
        let bare = value.split('%').next().unwrap_or(value);
        let addr = bare
            .parse::<IpAddr>()
            .map(|ip| SocketAddr::new(ip, DNS_PORT))
            .or_else(|_| bare.parse::<SocketAddr>())
            .map_err(|_| ForwardError::Nameserver {
                path: path.to_string(),
                line: i + 1,
                value: value.to_string(),
            })?;
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    Ok(out)
}

#[derive(Clone, Debug)]
pub(crate) struct Forwarder {
    upstreams: Vec<SocketAddr>,
}

impl Forwarder {
    /// Upstreams in resolv.conf order, less `own` (our listen addresses).
    pub(crate) fn new(upstreams: Vec<SocketAddr>, own: &[SocketAddr]) -> Self {
        let is_own = |u: &SocketAddr| {
            own.iter().any(|o| {
                o.port() == u.port()
                    && (o.ip() == u.ip() || (o.ip().is_unspecified() && u.ip().is_loopback()))
            })
        };
        let upstreams = upstreams
            .into_iter()
            .filter(|u| {
                let own = is_own(u);
                if own {
                    tracing::warn!(upstream = %u, "skipping an upstream that is this server: forwarding there would loop");
                }
                !own
            })
            .collect();
        Self { upstreams }
    }

    pub(crate) fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// Sends `query` (wire format) to the upstreams in turn; returns the first answer with
    /// the query's own ID.
    pub(crate) async fn exchange(&self, query: &[u8]) -> Result<Vec<u8>, ForwardError> {
        if query.len() < 12 {
            return Err(ForwardError::NoAnswer);
        }
        for up in &self.upstreams {
            match self.exchange_one(*up, query).await {
                Ok(r) => return Ok(r),
                Err(e) => tracing::debug!(upstream = %up, error = %e, "upstream failed"),
            }
        }
        Err(ForwardError::NoAnswer)
    }

    async fn exchange_one(&self, up: SocketAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
        // A fresh random ID per try keeps late answers to an earlier try from matching.
        let id: u16 = rand::random();
        let mut q = query.to_vec();
        q[..2].copy_from_slice(&id.to_be_bytes());
        let mut resp = tokio::time::timeout(TRY_TIMEOUT, udp(up, &q, id))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if resp.len() > 2 && resp[2] & 0x02 != 0 {
            // Truncated: the full answer only comes over TCP.
            resp = tokio::time::timeout(TRY_TIMEOUT, tcp(up, &q, id))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        }
        resp[..2].copy_from_slice(&query[..2]);
        Ok(resp)
    }
}

async fn udp(up: SocketAddr, q: &[u8], id: u16) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = match up {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(local).await?;
    // Connected: only the upstream's datagrams arrive, and a closed port fails fast.
    sock.connect(up).await?;
    sock.send(q).await?;
    let mut buf = vec![0u8; 65535];
    loop {
        let n = sock.recv(&mut buf).await?;
        if n >= 12 && buf[..2] == id.to_be_bytes() && buf[2] & 0x80 != 0 {
            buf.truncate(n);
            return Ok(buf);
        }
    }
}

async fn tcp(up: SocketAddr, q: &[u8], id: u16) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(up).await?;
    let len = u16::try_from(q.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(q);
    s.write_all(&framed).await?;
    loop {
        let n = s.read_u16().await? as usize;
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf).await?;
        if n >= 12 && buf[..2] == id.to_be_bytes() {
            return Ok(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_nameservers() {
        let text = "# comment\nsearch example.org\nnameserver 10.0.0.2\nnameserver fd00::53\n\
                    nameserver 127.0.0.53\nnameserver 127.0.0.1:5353\nnameserver [::1]:5300\n\
                    nameserver fe80::1%eth0\nnameserver 10.0.0.2\noptions ndots:5\n";
        let got = parse_resolv_conf("r", text).unwrap();
        let want: Vec<SocketAddr> = [
            "10.0.0.2:53",
            "[fd00::53]:53",
            "127.0.0.53:53",
            "127.0.0.1:5353",
            "[::1]:5300",
            "[fe80::1]:53",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(got, want);
        let err = parse_resolv_conf("/x/resolv.conf", "nameserver dns.example\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/x/resolv.conf:1: nameserver \"dns.example\" is not an IP address"
        );
    }

    #[test]
    fn own_addresses_are_not_upstreams() {
        let ups: Vec<SocketAddr> = ["127.0.0.1:53", "127.0.0.53:53", "10.0.0.2:53"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let f = Forwarder::new(ups.clone(), &["127.0.0.1:53".parse().unwrap()]);
        assert_eq!(f.upstreams(), &ups[1..]);
        let f = Forwarder::new(ups.clone(), &["0.0.0.0:53".parse().unwrap()]);
        assert_eq!(f.upstreams(), &ups[2..]);
        let f = Forwarder::new(ups.clone(), &["0.0.0.0:5353".parse().unwrap()]);
        assert_eq!(f.upstreams(), &ups[..]);
    }
}
