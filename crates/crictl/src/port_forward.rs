//! `crictl port-forward [-r spdy|websocket] POD [LOCAL_PORT:]REMOTE_PORT...`: listens on
//! 127.0.0.1 (and ::1 when available) and forwards each accepted connection to the pod,
//! printing client-go's lines ("Forwarding from 127.0.0.1:8080 -> 80", "Handling
//! connection for 8080"), until interrupted. A local port of 0 or an empty one
//! (`:80`) picks a free port.
//!
//! Over SPDY one connection to the streaming server carries every forwarded connection;
//! over WebSocket each forwarded connection asks for a URL of its own (the tokens are
//! single-use) and connects with `?port=`.

use crate::stream::{self, SpdyPortForward, Transport};
use crate::{Clients, CrictlError, rpc};
use clap::Args;
use cri::runtime::v1::PortForwardRequest;
use std::io::Write;
use std::sync::Arc;

#[derive(Debug, Args, Clone)]
pub struct PortForwardArgs {
    /// Transport protocol to use, one of: spdy|websocket.
    #[arg(short = 'r', long, value_enum, default_value_t = Transport::Spdy)]
    pub transport: Transport,
    /// The pod sandbox ID (a unique prefix is enough).
    pub pod: String,
    /// [LOCAL_PORT:]REMOTE_PORT, one or more.
    #[arg(required = true)]
    pub ports: Vec<String>,
}

/// Parses `[LOCAL:]REMOTE` (client-go's `parsePorts`): `8080` forwards 8080 to 8080,
/// `:80` and `0:80` a random local port to 80.
pub fn parse_port(spec: &str) -> Result<(u16, u16), String> {
    let (local, remote) = match spec.split_once(':') {
        Some((l, r)) => (if l.is_empty() { "0" } else { l }, r),
        None => (spec, spec),
    };
    let local: u16 = local
        .parse()
        .map_err(|e| format!("error parsing local port '{local}': {e}"))?;
    let remote: u16 = remote
        .parse()
        .map_err(|e| format!("error parsing remote port '{remote}': {e}"))?;
    if remote == 0 {
        return Err(format!("remote port must be > 0: {spec}"));
    }
    Ok((local, remote))
}

async fn request_url(c: &Clients, pod: &str, ports: &[u16]) -> Result<String, CrictlError> {
    let resp = c
        .runtime
        .clone()
        .port_forward(PortForwardRequest {
            pod_sandbox_id: pod.to_string(),
            port: ports.iter().map(|p| i32::from(*p)).collect(),
        })
        .await
        .map_err(rpc("port forward"))?
        .into_inner();
    Ok(resp.url)
}

pub async fn run(
    c: &Clients,
    args: PortForwardArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    let mut pairs = Vec::new();
    for p in &args.ports {
        pairs.push(parse_port(p).map_err(CrictlError::Usage)?);
    }
    let remotes: Vec<u16> = pairs.iter().map(|(_, r)| *r).collect();
    let spdy = match args.transport {
        Transport::Spdy => {
            let url = request_url(c, &args.pod, &remotes).await?;
            let conn = stream::dial(&url)
                .await
                .map_err(|e| CrictlError::Other(format!("port forward: {e}")))?;
            Some(Arc::new(
                SpdyPortForward::connect(conn, &url)
                    .await
                    .map_err(|e| CrictlError::Other(format!("port forward: {e}")))?,
            ))
        }
        Transport::Websocket => None,
    };
    let (notes_tx, mut notes) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut listeners = Vec::new();
    for (local, remote) in pairs {
        let v4 = tokio::net::TcpListener::bind(("127.0.0.1", local))
            .await
            .map_err(|e| {
                CrictlError::Other(format!(
                    "port forward: unable to listen on port {local}: {e}"
                ))
            })?;
        let port = v4.local_addr().map(|a| a.port()).unwrap_or(local);
        writeln!(out, "Forwarding from 127.0.0.1:{port} -> {remote}")
            .and_then(|()| out.flush())
            .map_err(|e| CrictlError::Other(e.to_string()))?;
        listeners.push((v4, port, remote));
        if let Ok(v6) = tokio::net::TcpListener::bind(("::1", port)).await {
            writeln!(out, "Forwarding from [::1]:{port} -> {remote}")
                .and_then(|()| out.flush())
                .map_err(|e| CrictlError::Other(e.to_string()))?;
            listeners.push((v6, port, remote));
        }
    }
    for (l, local, remote) in listeners {
        let spdy = spdy.clone();
        let notes = notes_tx.clone();
        let clients = c.clone();
        let pod = args.pod.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = l.accept().await {
                let _ = notes.send(format!("Handling connection for {local}"));
                let spdy = spdy.clone();
                let notes = notes.clone();
                let clients = clients.clone();
                let pod = pod.clone();
                tokio::spawn(async move {
                    let r = match spdy {
                        Some(pf) => pf.forward(remote, sock).await,
                        None => match request_url(&clients, &pod, &[remote]).await {
                            Ok(url) => match stream::dial(&url).await {
                                Ok(conn) => stream::ws_port_forward(conn, &url, remote, sock).await,
                                Err(e) => Err(e),
                            },
                            Err(e) => Err(stream::StreamError::Remote(e.to_string())),
                        },
                    };
                    if let Err(e) = r {
                        let _ = notes.send(format!("E: {e}"));
                    }
                });
            }
        });
    }
    drop(notes_tx);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            n = notes.recv() => match n {
                Some(n) if n.starts_with("E: ") => eprintln!("{}", &n[3..]),
                Some(n) => {
                    let _ = writeln!(out, "{n}").and_then(|()| out.flush());
                }
                None => return Ok(()),
            },
            _ = async {
                match &spdy {
                    Some(pf) => loop {
                        if pf.is_closed() {
                            return;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    },
                    None => std::future::pending().await,
                }
            } => {
                return Err(CrictlError::Other(
                    "port forward: lost connection to pod".into(),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_specs() {
        assert_eq!(parse_port("8080"), Ok((8080, 8080)));
        assert_eq!(parse_port("9000:80"), Ok((9000, 80)));
        assert_eq!(parse_port(":80"), Ok((0, 80)));
        assert_eq!(parse_port("0:80"), Ok((0, 80)));
        assert!(parse_port("x:80").is_err());
        assert!(parse_port("80:0").is_err());
    }
}
