//! The connection to etcd: gRPC channels (plain or TLS with a client certificate, as
//! kube-apiserver's `--etcd-cafile/--etcd-certfile/--etcd-keyfile`), the request bound
//! and the bridge from the synchronous [`Store`](crate::storage::Store) calls to the async
//! client, which runs on a runtime of its own.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint, Uri};

use super::pb::etcdserverpb::StatusRequest;
use super::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::storage::StoreError;

/// kube-apiserver's etcd flags.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// `--etcd-servers`: client URLs (`http://127.0.0.1:2379`).
    pub servers: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// `--etcd-prefix`: where every key lives (default `/registry`).
    pub prefix: String,
    /// The longest one etcd request may take before the API request fails with 504
    /// (upstream's `--request-timeout`).
    pub request_timeout: Duration,
    /// `--event-ttl`: how long Events are kept; etcd deletes them when their lease ends.
    pub event_ttl: Duration,
}

/// kube-apiserver's default `--event-ttl`.
pub const DEFAULT_EVENT_TTL: Duration = Duration::from_secs(3600);

pub const DEFAULT_PREFIX: &str = "/registry";

impl EtcdConfig {
    pub fn new(servers: Vec<String>) -> EtcdConfig {
        EtcdConfig {
            servers,
            ca_file: None,
            cert_file: None,
            key_file: None,
            prefix: DEFAULT_PREFIX.to_string(),
            request_timeout: Duration::from_secs(60),
            event_ttl: DEFAULT_EVENT_TTL,
        }
    }
}

/// How long connecting at start may take per server.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Maps a gRPC status to the store's errors: transport failures are the storage being
/// unavailable (503), deadlines a timeout (504).
pub(crate) fn status_error(s: tonic::Status) -> StoreError {
    use tonic::Code;
    match s.code() {
        Code::Unavailable => StoreError::Unavailable(format!("etcd: {}", with_causes(&s))),
        Code::Unknown | Code::Cancelled if is_transport(&s) => {
            StoreError::Unavailable(format!("etcd: {}", with_causes(&s)))
        }
        Code::DeadlineExceeded => StoreError::Timeout,
        _ => StoreError::Backend(format!("etcd: {}", s.message())),
    }
}

/// A gRPC failure's message with its causes ("tcp connect error: Connection refused").
fn with_causes(s: &tonic::Status) -> String {
    let mut out = s.message().to_string();
    let mut cause = std::error::Error::source(s);
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

fn is_transport(s: &tonic::Status) -> bool {
    let m = s.message();
    m.contains("transport") || m.contains("connect") || m.contains("h2")
}

/// etcd's ErrCompacted text ("mvcc: required revision has been compacted").
pub(crate) fn is_compacted(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::OutOfRange && s.message().contains("compacted")
}

/// A channel per `cfg.servers` URL (each connects lazily and reconnects by itself when its
/// member comes back after an outage), and the index of the first that answers a Status
/// request. Every URL must parse; at least one member must answer.
pub(crate) async fn connect(cfg: &EtcdConfig) -> Result<(Vec<Channel>, usize), StoreError> {
    if cfg.servers.is_empty() {
        return Err(StoreError::Unavailable("--etcd-servers is empty".into()));
    }
    let tls = tls_config(cfg)?;
    let channels = cfg
        .servers
        .iter()
        .map(|server| {
            channel(server, tls.clone())
                .map_err(|e| StoreError::Backend(format!("--etcd-servers {server}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut errors = Vec::new();
    for (i, ch) in channels.iter().enumerate() {
        match probe(ch).await {
            Ok(()) => return Ok((channels, i)),
            Err(e) => errors.push(format!("{}: {e}", cfg.servers[i])),
        }
    }
    Err(StoreError::Unavailable(format!(
        "cannot reach any of --etcd-servers {}: {}",
        cfg.servers.join(","),
        errors.join("; ")
    )))
}

/// Whether the member behind `ch` answers a Status request within [`DIAL_TIMEOUT`].
async fn probe(ch: &Channel) -> Result<(), String> {
    let mut m = MaintenanceClient::new(ch.clone());
    match tokio::time::timeout(DIAL_TIMEOUT, m.status(StatusRequest {})).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(s)) => Err(with_causes(&s)),
        Err(_) => Err(format!("no answer within {DIAL_TIMEOUT:?}")),
    }
}

fn channel(server: &str, tls: Option<Arc<rustls::ClientConfig>>) -> Result<Channel, String> {
    let uri: Uri = server
        .parse()
        .map_err(|e| format!("not a URL ({e}); expected e.g. http://127.0.0.1:2379"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err("the scheme must be http or https".into()),
    };
    // The gRPC layer speaks plain HTTP/2 to the connector's stream; TLS is ours.
    let plain = format!(
        "http://{}",
        uri.authority().map(|a| a.as_str()).unwrap_or_default()
    );
    let ep = Endpoint::from_shared(plain)
        .map_err(|e| e.to_string())?
        .connect_timeout(DIAL_TIMEOUT)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    match (https, tls) {
        (false, _) => Ok(ep.connect_lazy()),
        (true, None) => {
            Err("https needs --etcd-cafile (and --etcd-certfile/--etcd-keyfile)".into())
        }
        (true, Some(tls)) => Ok(ep.connect_with_connector_lazy(TlsConnector(tls))),
    }
}

fn read(path: &Option<PathBuf>, flag: &str) -> Result<Option<Vec<u8>>, StoreError> {
    path.as_ref()
        .map(|p| {
            std::fs::read(p)
                .map_err(|e| StoreError::Backend(format!("{flag} {}: {e}", p.display())))
        })
        .transpose()
}

fn tls_config(cfg: &EtcdConfig) -> Result<Option<Arc<rustls::ClientConfig>>, StoreError> {
    let ca = read(&cfg.ca_file, "--etcd-cafile")?;
    let cert = read(&cfg.cert_file, "--etcd-certfile")?;
    let key = read(&cfg.key_file, "--etcd-keyfile")?;
    let Some(ca) = ca else {
        return Ok(None);
    };
    let bad = |flag: &str, e: &dyn std::fmt::Display| StoreError::Backend(format!("{flag}: {e}"));
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca.as_slice()) {
        let c = c.map_err(|e| bad("--etcd-cafile", &e))?;
        roots.add(c).map_err(|e| bad("--etcd-cafile", &e))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("tls", &e))?
        .with_root_certificates(roots);
    let mut config = match (cert, key) {
        (Some(cert), Some(key)) => {
            let chain = rustls_pemfile::certs(&mut cert.as_slice())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad("--etcd-certfile", &e))?;
            let key = rustls_pemfile::private_key(&mut key.as_slice())
                .map_err(|e| bad("--etcd-keyfile", &e))?
                .ok_or_else(|| bad("--etcd-keyfile", &"no private key"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| bad("--etcd-certfile", &e))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(StoreError::Backend(
                "--etcd-certfile and --etcd-keyfile go together".into(),
            ));
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Some(Arc::new(config)))
}

/// Dials TCP and runs TLS over it, naming the server by the URL's host.
#[derive(Clone)]
struct TlsConnector(Arc<rustls::ClientConfig>);

impl tower::Service<Uri> for TlsConnector {
    type Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let config = self.0.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or("127.0.0.1").to_string();
            let port = uri.port_u16().unwrap_or(2379);
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            let name = rustls::pki_types::ServerName::try_from(
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string(),
            )
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        })
    }
}
