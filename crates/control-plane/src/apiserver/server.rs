//! The HTTPS server: rustls with optional client certificates, authentication middleware,
//! health and version endpoints, `/metrics`, discovery/OpenAPI routers, `metrics.k8s.io` and
//! the REST fallback.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::apiserver::authn::{self, User};
use crate::apiserver::authz;
use crate::apiserver::rest::{self, ApiError};
use crate::apiserver::state::{ApiConfig, ApiState, SharedState};
use crate::apiserver::{
    bootstrap, controllers, discovery, inflight, metrics, metrics_api, oidc, openapi, protobuf,
};
use crate::pki;
use crate::storage::{EmbeddedStore, EtcdStore, StorageBackend, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("pki: {0}")]
    Pki(#[from] pki::PkiError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("tls: {0}")]
    Tls(String),
    #[error("listening on {addr}: {err}")]
    Bind {
        addr: SocketAddr,
        err: std::io::Error,
    },
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error(
        "{0} reaches the objects through the API server: give --kubeconfig (or --etcd-servers; the embedded store is a file only the API server's process may hold)"
    )]
    EmbeddedStoreNotShared(&'static str),
    #[error(
        "kube-apiserver keeps the objects itself: --kubeconfig is for the components that reach it"
    )]
    ApiServerOverApi,
    #[error("no cluster CA in {0}: start kube-apiserver with this --data-dir first")]
    NoClusterCa(PathBuf),
}

/// How to start the control plane.
#[derive(Clone, Debug)]
pub struct ControlPlaneConfig {
    pub data_dir: PathBuf,
    pub bind_address: IpAddr,
    /// `--advertise-address`: the `kubernetes` Service's endpoint (default: the bind address;
    /// for an unspecified one, the address of the host's default-route interface).
    pub advertise_address: Option<IpAddr>,
    /// The API server's HTTPS port, 0 picks a free one. A split kube-controller-manager or
    /// kube-scheduler serves its health paths here instead (0: not at all).
    pub secure_port: u16,
    pub api: ApiConfig,
    /// The scheduler and controllers run beside the API server.
    pub controllers: crate::controllers::ControllersConfig,
    /// The embedded store (default) or etcd.
    pub storage: StorageBackend,
    /// How long to keep retrying an etcd that does not answer yet at start: zero fails at
    /// once; a component started beside its etcd (kubeadm's static pods start together)
    /// waits for it, as kube-apiserver does.
    pub store_wait: std::time::Duration,
}

impl ControlPlaneConfig {
    pub fn new(data_dir: impl Into<PathBuf>, bind_address: IpAddr, secure_port: u16) -> Self {
        ControlPlaneConfig {
            data_dir: data_dir.into(),
            bind_address,
            advertise_address: None,
            secure_port,
            api: ApiConfig::default(),
            controllers: Default::default(),
            storage: StorageBackend::Embedded,
            store_wait: std::time::Duration::ZERO,
        }
    }
}

/// A running control plane.
pub struct ServerHandle {
    pub addr: SocketAddr,
    pub url: String,
    pub kubeconfig: PathBuf,
    pub data_dir: PathBuf,
    running: Running,
}

impl ServerHandle {
    pub fn store(&self) -> Arc<dyn Store> {
        self.running.state.store.clone()
    }

    /// Stops serving, ends every connection and controller, and closes the store.
    pub async fn shutdown(self) {
        self.running.shutdown().await
    }
}

/// kube-controller-manager or kube-scheduler in a process of its own
/// ([`start_components`]): no API served, the objects read and written in etcd.
pub struct ComponentsHandle {
    running: Running,
}

impl ComponentsHandle {
    /// Stops the components (releasing their Leases) and closes the store.
    pub async fn shutdown(self) {
        self.running.shutdown().await
    }
}

/// What a started process runs: its state, tasks and leader-election loops.
struct Running {
    state: SharedState,
    tasks: JoinSet<()>,
    /// The leader-election loops, which release their Leases when `stop` turns true.
    electors: JoinSet<()>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Running {
    async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        // The electors stop their components and release the Leases (bounded: a store
        // that does not answer must not hold the shutdown up).
        let released = async { while self.electors.join_next().await.is_some() {} };
        if tokio::time::timeout(std::time::Duration::from_secs(8), released)
            .await
            .is_err()
        {
            self.electors.abort_all();
        }
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        // Connection tasks hold clones of the state; wait until they are all dropped so the
        // store file is closed when this returns (a restart in the same process reopens it).
        for _ in 0..500 {
            if Arc::strong_count(&self.state) == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

#[derive(Clone)]
struct ConnUser(Option<User>);

fn tls_config(p: &pki::Pki) -> Result<rustls::ServerConfig, ServerError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = |e: &dyn std::fmt::Display| ServerError::Tls(e.to_string());
    let certs: Vec<CertificateDer<'static>> =
        rustls_pemfile::certs(&mut p.serving_cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| tls(&e))?;
    let key: PrivateKeyDer<'static> =
        rustls_pemfile::private_key(&mut p.serving_key_pem.as_bytes())
            .map_err(|e| tls(&e))?
            .ok_or_else(|| ServerError::Tls("no private key in apiserver.key".into()))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut p.ca_cert_pem.as_bytes()) {
        roots.add(c.map_err(|e| tls(&e))?).map_err(|e| tls(&e))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| tls(&e))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| tls(&e))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The client side of apiserver → kubelet connections.
fn kubelet_tls(p: &pki::Pki) -> Result<rustls::ClientConfig, ServerError> {
    let tls = |e: &dyn std::fmt::Display| ServerError::Tls(e.to_string());
    let (cert, key) = pki::kubelet_client_cert(p)?;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut p.ca_cert_pem.as_bytes()) {
        roots.add(c.map_err(|e| tls(&e))?).map_err(|e| tls(&e))?;
    }
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| tls(&e))?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key.as_bytes())
        .map_err(|e| tls(&e))?
        .ok_or_else(|| ServerError::Tls("no key in apiserver-kubelet-client.key".into()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| tls(&e))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

fn health(path: &str, verbose: bool) -> Response {
    let name = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("healthz");
    let body = if verbose {
        let checks = [
            "ping",
            "log",
            "etcd",
            "poststarthook/start-apiserver-admission-initializer",
            "poststarthook/bootstrap-controller",
        ];
        let mut s: String = checks.iter().map(|c| format!("[+]{c} ok\n")).collect();
        s.push_str(&format!("{name} check passed\n"));
        s
    } else {
        "ok".to_string()
    };
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn health_handler(uri: Uri) -> Response {
    let verbose = uri.query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    });
    health(uri.path(), verbose)
}

async fn version() -> Response {
    rest::json_response(
        200,
        &json!({
            "major": "1", "minor": "33", "gitVersion": "v1.33.0+nodus",
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0 (nodus is written in Rust)",
            "compiler": "rustc", "platform": "linux/amd64",
        }),
        &[],
    )
}

/// Authenticates every request, applies impersonation, and authorizes the paths the REST
/// handlers do not serve as resources (the REST handlers authorize their own).
async fn authenticate(State(st): State<SharedState>, mut req: Request, next: Next) -> Response {
    let conn = req.extensions().get::<ConnUser>().and_then(|c| c.0.clone());
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let user = match (bearer, conn) {
        (Some(token), _) => match authn::authenticate_token(&st, &token) {
            Some(u) => u,
            None => return ApiError(nodus_k8s::status::unauthorized()).into_response(),
        },
        (None, Some(u)) => u,
        (None, None) => User::anonymous(),
    };
    let user = match authn::impersonation::impersonate(&st, user, req.headers()) {
        Ok(u) => u,
        Err(status) => return ApiError(status).into_response(),
    };
    // Resource paths reach the authorizer in the REST handlers; every other path here.
    if let Some(refused) =
        authz::authorize_path(&st, &user, req.method().as_str(), req.uri().path())
    {
        return ApiError(refused).into_response();
    }
    req.extensions_mut().insert(user);
    next.run(req).await
}

async fn fallback(st: SharedState, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let user = parts
        .extensions
        .get::<User>()
        .cloned()
        .unwrap_or_else(User::anonymous);
    if let Some(r) = metrics_api::handle(&st, &user, &parts.method, &parts.uri) {
        return r;
    }
    let path = parts.uri.path();
    if !(path.starts_with("/api/") || path.starts_with("/apis/")) {
        let mut r = Response::new(Body::from("404 page not found\n"));
        *r.status_mut() = StatusCode::NOT_FOUND;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return r;
    }
    let bytes: Bytes = match axum::body::to_bytes(body, 3 * 1024 * 1024).await {
        Ok(b) => b,
        Err(_) => {
            let s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "the server has received a request that is too large", "reason": "RequestEntityTooLarge", "code": 413});
            return ApiError(s).into_response();
        }
    };
    let mut headers: HeaderMap = parts.headers;
    // client-go's typed clients send built-in kinds as protobuf; handlers read JSON.
    let bytes = match protobuf::request_to_json(&mut headers, bytes) {
        Ok(b) => b,
        Err(e) => {
            return ApiError(nodus_k8s::status::bad_request(&e.to_string())).into_response();
        }
    };
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let resp = rest::handle(st, user, parts.method, parts.uri, headers, bytes, upgrade).await;
    protobuf::negotiate_response(accept.as_deref(), resp).await
}

fn router(st: SharedState) -> Router {
    let fb = st.clone();
    let inflight = inflight::InFlight::new(
        st.config.max_requests_inflight,
        st.config.max_mutating_requests_inflight,
    );
    Router::new()
        .route("/healthz", get(health_handler))
        .route("/healthz/{*check}", get(health_handler))
        .route("/livez", get(health_handler))
        .route("/livez/{*check}", get(health_handler))
        .route("/readyz", get(health_handler))
        .route("/readyz/{*check}", get(health_handler))
        .route("/version", get(version))
        .route("/version/", get(version))
        .merge(discovery::router())
        .merge(openapi::router())
        .merge(rest::reviews::router(st.clone()))
        .merge(oidc::router(st.clone()))
        .merge(
            Router::new()
                .route("/metrics", get(metrics::handler))
                .with_state(st.clone()),
        )
        .fallback(move |req: Request| fallback(fb.clone(), req))
        .layer(DefaultBodyLimit::max(3 * 1024 * 1024))
        .layer(middleware::from_fn_with_state(
            st.clone(),
            super::aggregator::intercept,
        ))
        .layer(middleware::from_fn_with_state(inflight, inflight::limit))
        .layer(middleware::from_fn_with_state(
            st.clone(),
            metrics::instrument,
        ))
        .layer(middleware::from_fn_with_state(st, authenticate))
}

/// The `kubernetes` Service's endpoint, as upstream's kube-apiserver picks it: the flag,
/// else the bind address, else (bound to the unspecified address) the host's own address, so
/// that pods reach the API server through the Service; loopback only on a host without one.
fn advertise_address(cfg: &ControlPlaneConfig) -> IpAddr {
    if let Some(a) = cfg.advertise_address {
        return a;
    }
    if !cfg.bind_address.is_unspecified() {
        return cfg.bind_address;
    }
    nodus_serving::hostaddr::choose_host_ip().unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// Opens the store the flags choose. The embedded one is a file only one process may hold.
fn open_store(cfg: &ControlPlaneConfig) -> Result<Arc<dyn Store>, ServerError> {
    Ok(match &cfg.storage {
        StorageBackend::Embedded => {
            let store_path = cfg.data_dir.join("store.redb");
            Arc::new(tokio::task::block_in_place(|| {
                EmbeddedStore::open_with(&store_path, cfg.api.watch_history)
            })?)
        }
        StorageBackend::Etcd(etcd) => {
            let deadline = std::time::Instant::now() + cfg.store_wait;
            let store = loop {
                match EtcdStore::connect(etcd) {
                    Err(StoreError::Unavailable(why)) if std::time::Instant::now() < deadline => {
                        tracing::info!(reason = %why, "waiting for etcd");
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                    r => break r?,
                }
            };
            tracing::info!(server = store.server(), prefix = %etcd.prefix, "storing objects in etcd");
            Arc::new(crate::storage::Cacher::new(Arc::new(store)))
        }
        StorageBackend::Api(kubeconfig) => {
            let store = tokio::task::block_in_place(|| {
                crate::storage::RestStore::connect(kubeconfig, cfg.store_wait)
            })?;
            tracing::info!(
                server = store.server(),
                "reaching the objects through the API server"
            );
            Arc::new(store)
        }
    })
}

/// Starts the scheduler and the controllers: on `tasks` at once without leader election,
/// else each under its Lease, with the electors returned.
fn spawn_components(
    st: &SharedState,
    cfg: &ControlPlaneConfig,
    controllers_cfg: crate::controllers::ControllersConfig,
    tasks: &mut JoinSet<()>,
    stop: &tokio::sync::watch::Sender<bool>,
) -> JoinSet<()> {
    use crate::leaderelection::{self, Component};
    let mut electors = JoinSet::new();
    let le = controllers_cfg.leader_election.clone();
    if !le.leader_elect {
        if controllers_cfg.scheduler {
            crate::controllers::spawn_scheduler(st, tasks);
        }
        if controllers_cfg.controllers {
            crate::controllers::spawn_controllers(st, &controllers_cfg, tasks);
        }
        return electors;
    }
    if matches!(cfg.storage, StorageBackend::Embedded) {
        leaderelection::release_stale(st, &le.resource_namespace);
    }
    let identity = leaderelection::identity();
    tracing::info!(identity = %identity, "leader election on");
    if controllers_cfg.scheduler {
        let s = st.clone();
        electors.spawn(leaderelection::run(
            st.clone(),
            Component::Scheduler,
            le.clone(),
            identity.clone(),
            Box::new(move |t| crate::controllers::spawn_scheduler(&s, t)),
            stop.subscribe(),
        ));
    }
    if controllers_cfg.controllers {
        let s = st.clone();
        let c = controllers_cfg.clone();
        electors.spawn(leaderelection::run(
            st.clone(),
            Component::ControllerManager,
            le,
            identity,
            Box::new(move |t| crate::controllers::spawn_controllers(&s, &c, t)),
            stop.subscribe(),
        ));
    }
    electors
}

/// The state every request and controller shares.
fn shared_state(
    cfg: &ControlPlaneConfig,
    store: Arc<dyn Store>,
    pki: &pki::Pki,
    advertise: IpAddr,
    port: u16,
    front_proxy: Option<&pki::FrontProxy>,
) -> Result<SharedState, ServerError> {
    let sa_keys = authn::serviceaccount::Keys::from_pkcs8(&pki::service_account_key(&pki.dir)?)
        .map_err(pki::PkiError::Invalid)?;
    let token_path = cfg.data_dir.join("tokens.csv");
    nodus_serving::private::restrict_file(&token_path).map_err(|err| ServerError::Io {
        path: token_path.clone(),
        err,
    })?;
    let tokens = authn::load_token_file(&token_path).map_err(|err| ServerError::Io {
        path: token_path,
        err,
    })?;
    let mut api = cfg.api.clone();
    api.secure_port = port;
    api.advertise_address = advertise;
    let st: SharedState = Arc::new(ApiState {
        store: store.clone(),
        config: api,
        tokens,
        authz: authz::Chain::new(&cfg.api.authorization_modes, store.clone()),
        ca_pem: pki.ca_cert_pem.clone(),
        kubelet_tls: kubelet_tls(pki)
            .map(Arc::new)
            .map_err(|e| tracing::warn!(error = %e, "no TLS client for kubelets"))
            .ok(),
        sa_keys: Arc::new(sa_keys),
        alloc_lock: tokio::sync::Mutex::new(()),
        metrics: Default::default(),
        resource_metrics: Default::default(),
        listers: crate::apiserver::listers::Listers::new(store.clone()),
        aggregator: front_proxy
            .map(super::aggregator::Aggregator::new)
            .unwrap_or_default(),
    });
    Ok(st)
}

/// Signs CSRs with the cluster CA unless the flags name another signer.
fn with_signer(
    mut controllers: crate::controllers::ControllersConfig,
    pki: &pki::Pki,
) -> crate::controllers::ControllersConfig {
    if controllers.cluster_signing_cert_file.is_none() {
        controllers.cluster_signing_cert_file = Some(pki.ca_cert_path());
        controllers.cluster_signing_key_file = Some(pki.dir.join("ca.key"));
    }
    controllers
}

/// Starts the controllers or the scheduler (as `cfg.controllers` selects) without the API
/// server, as kube-controller-manager and kube-scheduler run in static pods of their own.
/// They share the API server's etcd and PKI; its data dir must hold the cluster CA.
pub async fn start_components(
    cfg: ControlPlaneConfig,
    name: &'static str,
) -> Result<ComponentsHandle, ServerError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if matches!(cfg.storage, StorageBackend::Embedded) {
        return Err(ServerError::EmbeddedStoreNotShared(name));
    }
    let pki_dir = cfg.data_dir.join("pki");
    if !pki_dir.join("ca.crt").exists() || !pki_dir.join("ca.key").exists() {
        return Err(ServerError::NoClusterCa(pki_dir));
    }
    let store = open_store(&cfg)?;
    // No addresses: the API server's serving certificate is its own to renew.
    let pki = pki::ensure(&cfg.data_dir, &[])?;
    let advertise = advertise_address(&cfg);
    let st = shared_state(&cfg, store, &pki, advertise, cfg.secure_port, None)?;
    let (stop, _) = tokio::sync::watch::channel(false);
    let mut tasks = JoinSet::new();
    if cfg.controllers.controllers {
        // The CRD registry, so garbage collection and quotas see custom kinds.
        super::crd::sync(&st);
        tasks.spawn(super::crd::run(st.clone()));
    }
    let controllers_cfg = with_signer(cfg.controllers.clone(), &pki);
    let electors = spawn_components(&st, &cfg, controllers_cfg, &mut tasks, &stop);
    if cfg.secure_port != 0 {
        let mut stopped = stop.subscribe();
        let shutdown = async move {
            let _ = stopped.changed().await;
        };
        let addr = SocketAddr::new(cfg.bind_address, cfg.secure_port);
        crate::healthz::serve(addr, name, shutdown).await?;
    }
    tracing::info!(component = name, "started");
    nodus_serving::sd_notify::ready(nodus_serving::sd_notify::Component::ControlPlane);
    Ok(ComponentsHandle {
        running: Running {
            state: st,
            tasks,
            electors,
            stop,
        },
    })
}

/// The cluster CA, service-account key and the API server's serving certificate (naming
/// the bind, advertised and first service addresses) in the data dir, made where missing:
/// what [`start`] serves with, and what `nodus up` needs before the API server runs in a
/// static pod (a node's credentials are issued from this CA).
pub fn ensure_pki(cfg: &ControlPlaneConfig) -> Result<pki::Pki, ServerError> {
    nodus_serving::private::create_dir(&cfg.data_dir).map_err(|err| ServerError::Io {
        path: cfg.data_dir.clone(),
        err,
    })?;
    let service_ip = crate::apiserver::admission::first_service_ip(cfg.api.service_cidr);
    let pki = pki::ensure(
        &cfg.data_dir,
        &[
            cfg.bind_address,
            advertise_address(cfg),
            IpAddr::V4(service_ip),
        ],
    )?;
    // Made here, before any component starts: kube-apiserver, kube-controller-manager and
    // kube-scheduler start together in their static pods, and each would otherwise create
    // a missing key on first use, racing the others (the API server lost its kubelet client
    // credentials to a certificate written beside another process's key).
    pki::service_account_key(&pki.dir)?;
    pki::kubelet_client_cert(&pki)?;
    pki::front_proxy(&pki.dir)?;
    Ok(pki)
}

/// Starts the API server and built-in controllers; returns once it is listening.
pub async fn start(cfg: ControlPlaneConfig) -> Result<ServerHandle, ServerError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if matches!(cfg.storage, StorageBackend::Api(_)) {
        return Err(ServerError::ApiServerOverApi);
    }
    // The data dir holds the store (every Secret), keys and tokens: root's alone.
    nodus_serving::private::create_dir(&cfg.data_dir).map_err(|err| ServerError::Io {
        path: cfg.data_dir.clone(),
        err,
    })?;
    // The store first: a data dir whose store another process holds must fail before
    // anything in it (certificates, admin.kubeconfig, tokens) is rewritten.
    let store = open_store(&cfg)?;
    let advertise = advertise_address(&cfg);
    let pki = ensure_pki(&cfg)?;
    let addr = SocketAddr::new(cfg.bind_address, cfg.secure_port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|err| ServerError::Bind { addr, err })?;
    let addr = listener
        .local_addr()
        .map_err(|err| ServerError::Bind { addr, err })?;
    let host = if cfg.bind_address.is_unspecified() {
        IpAddr::from([127, 0, 0, 1])
    } else {
        cfg.bind_address
    };
    let url = match host {
        IpAddr::V6(v6) => format!("https://[{v6}]:{}", addr.port()),
        IpAddr::V4(v4) => format!("https://{v4}:{}", addr.port()),
    };
    let kubeconfig = pki::write_admin_kubeconfig(&cfg.data_dir, &pki, &url)?;
    let front_proxy = pki::front_proxy(&pki.dir)?;
    let st = shared_state(
        &cfg,
        store,
        &pki,
        advertise,
        addr.port(),
        Some(&front_proxy),
    )?;
    bootstrap::ensure(&st)?;
    authz::policy::reconcile(&st)?;
    super::aggregator::publish_authentication(&st, &pki.ca_cert_pem, &front_proxy);
    crate::controllers::bootstrapsigner::ensure_cluster_info(&st, &url, &pki.ca_cert_pem)?;
    controllers::sweep(&st);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    // CRDs stored before a restart are served before the first request.
    super::crd::sync(&st);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(&pki)?));
    let app = router(st.clone());
    let mut tasks = JoinSet::new();
    tasks.spawn(super::crd::run(st.clone()));
    tasks.spawn(super::apfconfig::run(st.clone()));
    tasks.spawn(metrics_api::run(st.clone()));
    tasks.spawn(super::aggregator::run(st.clone()));
    if !cfg.controllers.controllers {
        // kube-controller-manager runs apart and reaches the store through this server.
        tasks.spawn(controllers::compact(st.clone()));
    }
    let controllers_cfg = with_signer(cfg.controllers.clone(), &pki);
    let electors = spawn_components(&st, &cfg, controllers_cfg, &mut tasks, &stop);
    let limits = st.config.serving;
    tasks.spawn(async move {
        let service = move |cert: Option<CertificateDer<'static>>| {
            let conn_user = ConnUser(cert.as_ref().and_then(|c| authn::user_from_cert(c)));
            let app = app.clone();
            move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(conn_user.clone());
                app.clone().oneshot(req.map(Body::new))
            }
        };
        let shutdown = async move {
            let _ = stopped.changed().await;
        };
        nodus_serving::conn::serve(listener, Some(acceptor), limits, service, shutdown).await;
    });
    tracing::info!(url = %url, kubeconfig = %kubeconfig.display(), "API server listening");
    nodus_serving::sd_notify::ready(nodus_serving::sd_notify::Component::ControlPlane);
    Ok(ServerHandle {
        addr,
        url,
        kubeconfig,
        data_dir: cfg.data_dir,
        running: Running {
            state: st,
            tasks,
            electors,
            stop,
        },
    })
}
