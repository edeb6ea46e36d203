//! APIService aggregation, as upstream's kube-aggregator: a group-version whose APIService
//! names a Service (`spec.service`) is served by that Service's backend, an extension API
//! server, and this server proxies `/apis/<group>/<version>/…` to it.
//!
//! - **The proxy** ([`intercept`], after authentication): the Service's port is resolved to
//!   a ready endpoint of its EndpointSlices, the request goes there over TLS checked against
//!   the APIService's `caBundle` for the name `<service>.<namespace>.svc` (or not checked with
//!   `insecureSkipTLSVerify`), presenting the front proxy's client certificate, with the
//!   caller's identity in `X-Remote-User`, `X-Remote-Group` and `X-Remote-Extra-*` and its
//!   credentials removed; the answer, watches included, is streamed back. Authorization is
//!   the extension server's, as upstream (it asks this server with SubjectAccessReviews).
//! - **What extension servers trust** ([`publish_authentication`]): the
//!   `kube-system/extension-apiserver-authentication` ConfigMap names the cluster CA for
//!   client certificates and the front proxy's CA, allowed name and header names, as
//!   upstream's ClusterAuthenticationTrustController keeps it.
//! - **Availability** ([`run`]): every few seconds each such APIService's backend is asked
//!   for its discovery document; its `Available` condition says why not
//!   (`ServiceNotFound`, `MissingEndpoints`, `FailedDiscoveryCheck`) or `Passed`, and the
//!   resources of the available ones join this server's discovery (both formats, so
//!   `kubectl api-resources` and `kubectl get <resource>` find them). A request for an
//!   unavailable one is 503.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use http::{HeaderValue, StatusCode, header};
use nodus_k8s::catalog::{self, ResourceInfo};
use serde_json::{Value, json};

use crate::apiserver::authn::User;
use crate::apiserver::state::{ApiState, SharedState};
use crate::pki::{FRONT_PROXY_CLIENT, FrontProxy};
use crate::storage::Mutation;

const PREFIX: &str = "/apiregistration.k8s.io/apiservices/";
/// How often backends are checked.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The API server's identity towards extension API servers.
#[derive(Default)]
pub struct Aggregator {
    identity: Option<reqwest::Identity>,
}

impl Aggregator {
    pub fn new(front_proxy: &FrontProxy) -> Aggregator {
        let pem = format!(
            "{}\n{}",
            front_proxy.client_cert_pem, front_proxy.client_key_pem
        );
        Aggregator {
            identity: reqwest::Identity::from_pem(pem.as_bytes())
                .map_err(|e| tracing::warn!(error = %e, "no front-proxy client identity"))
                .ok(),
        }
    }
}

/// Resources of the available aggregated group-versions, for discovery.
static DISCOVERED: RwLock<Vec<&'static ResourceInfo>> = RwLock::new(Vec::new());
/// Per group-version: the resource list its backend last gave (as text) and its entries.
type Listed = HashMap<(String, String), (String, Vec<&'static ResourceInfo>)>;
/// What each group-version's backend last listed, so an unchanged list is not leaked again.
static LISTED: Mutex<Option<Listed>> = Mutex::new(None);

/// Bumped whenever [`DISCOVERED`] changes, so discovery renders its documents again.
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) fn generation() -> u64 {
    GENERATION.load(std::sync::atomic::Ordering::SeqCst)
}

/// The resources the available aggregated APIs serve.
pub(crate) fn discovered() -> Vec<&'static ResourceInfo> {
    DISCOVERED.read().map(|d| d.clone()).unwrap_or_default()
}

/// `/apis/<group>/<version>[/…]`.
fn group_version(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/apis/")?;
    let mut parts = rest.split('/');
    let group = parts.next().filter(|g| !g.is_empty())?;
    let version = parts.next().filter(|v| !v.is_empty())?;
    Some((group, version))
}

fn served_here(group: &str, version: &str) -> bool {
    catalog::served()
        .into_iter()
        .chain(crate::apiserver::metrics_api::RESOURCES.iter())
        .any(|i| i.group == group && i.version == version)
}

/// The APIService of `group`/`version` when it names a Service.
fn api_service(st: &ApiState, group: &str, version: &str) -> Option<Value> {
    let key = format!("{PREFIX}{version}.{group}");
    let stored = st.listers.api_services.get(&key).ok()??;
    // Most group-versions have a Local APIService: only a proxied one is copied.
    stored
        .object
        .pointer("/spec/service")
        .is_some_and(Value::is_object)
        .then(|| (*stored.object).clone())
}

fn available(svc: &Value) -> bool {
    svc.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Available" && c["status"] == "True")
}

/// Proxies requests for aggregated group-versions; everything else goes on.
pub async fn intercept(State(st): State<SharedState>, req: Request, next: Next) -> Response {
    let target = group_version(req.uri().path())
        .filter(|(g, v)| !served_here(g, v))
        .and_then(|(g, v)| api_service(&st, g, v));
    match target {
        None => next.run(req).await,
        Some(svc) if !available(&svc) => unavailable(),
        Some(svc) => proxy(&st, &svc, req).await,
    }
}

fn unavailable() -> Response {
    let mut r = Response::new(Body::from("service unavailable\n"));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Where a backend answers: the name its certificate carries and the endpoint's address.
struct Backend {
    host: String,
    addr: SocketAddr,
}

/// Why a backend cannot be reached: (reason, message) as upstream's availability
/// controller words them.
type Unreachable = (&'static str, String);

fn resolve(st: &ApiState, svc: &Value) -> Result<Backend, Unreachable> {
    let s = &svc["spec"]["service"];
    let ns = s["namespace"].as_str().unwrap_or("");
    let name = s["name"].as_str().unwrap_or("");
    let port = s["port"].as_i64().unwrap_or(443);
    let missing = || {
        (
            "ServiceNotFound",
            format!("service/{name} in \"{ns}\" is not present"),
        )
    };
    let service = st
        .store
        .get(&format!("/core/services/{ns}/{name}"))
        .ok()
        .flatten()
        .ok_or_else(missing)?;
    let port_name = service
        .object
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_i64() == Some(port))
        .map(|p| p["name"].as_str().unwrap_or("").to_string())
        .ok_or_else(|| {
            (
                "ServicePortError",
                format!("service/{name} in \"{ns}\" is not listening on port {port}"),
            )
        })?;
    let no_endpoints = || {
        (
            "MissingEndpoints",
            format!(
                "endpoints for service/{name} in \"{ns}\" have no addresses with port name \"{port_name}\""
            ),
        )
    };
    let (slices, _) = st
        .store
        .list(&format!("/discovery.k8s.io/endpointslices/{ns}/"))
        .map_err(|_| no_endpoints())?;
    for slice in slices.iter().map(|s| &*s.object).filter(|o| {
        o.pointer("/metadata/labels/kubernetes.io~1service-name")
            .and_then(Value::as_str)
            == Some(name)
    }) {
        let Some(target_port) = slice["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or("") == port_name)
            .and_then(|p| p["port"].as_u64())
        else {
            continue;
        };
        let ready = slice["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e.pointer("/conditions/ready") != Some(&json!(false)))
            .filter_map(|e| e["addresses"][0].as_str())
            .find_map(|a| a.parse::<std::net::IpAddr>().ok());
        if let Some(ip) = ready {
            return Ok(Backend {
                host: format!("{name}.{ns}.svc"),
                addr: SocketAddr::new(ip, target_port as u16),
            });
        }
    }
    Err(no_endpoints())
}

fn client(st: &ApiState, svc: &Value, backend: &Backend) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .resolve(&backend.host, backend.addr)
        .connect_timeout(Duration::from_secs(5));
    if svc.pointer("/spec/insecureSkipTLSVerify") == Some(&json!(true)) {
        b = b.danger_accept_invalid_certs(true);
    } else {
        let bundle = svc
            .pointer("/spec/caBundle")
            .and_then(Value::as_str)
            .unwrap_or("");
        let pem = base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .map_err(|e| format!("spec.caBundle: {e}"))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("spec.caBundle: {e}"))?
        {
            b = b.add_root_certificate(cert);
        }
    }
    if let Some(id) = &st.aggregator.identity {
        b = b.identity(id.clone());
    }
    b.build().map_err(|e| e.to_string())
}

async fn proxy(st: &ApiState, svc: &Value, req: Request) -> Response {
    let user = req
        .extensions()
        .get::<User>()
        .cloned()
        .unwrap_or_else(User::anonymous);
    let backend = match resolve(st, svc) {
        Ok(b) => b,
        Err(_) => return unavailable(),
    };
    let client = match client(st, svc, &backend) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "aggregated API: no client");
            return unavailable();
        }
    };
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let url = format!("https://{}:{}{path}", backend.host, backend.addr.port());
    let body = match axum::body::to_bytes(body, 3 * 1024 * 1024).await {
        Ok(b) => b,
        Err(_) => return StatusCode::PAYLOAD_TOO_LARGE.into_response(),
    };
    let mut out = client.request(parts.method, url).body(body);
    for h in [header::ACCEPT, header::CONTENT_TYPE] {
        if let Some(v) = parts.headers.get(&h) {
            out = out.header(h, v);
        }
    }
    out = out.header("X-Remote-User", user.name.as_str());
    for g in &user.groups {
        out = out.header("X-Remote-Group", g.as_str());
    }
    for (k, vs) in &user.extra {
        let name = format!("X-Remote-Extra-{}", nodus_serving::query::percent_encode(k));
        for v in vs {
            out = out.header(name.as_str(), v.as_str());
        }
    }
    let resp = match out.send().await {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(error = %e, "aggregated API unreachable");
            return unavailable();
        }
    };
    let status = resp.status();
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let mut r = Response::new(Body::from_stream(resp.bytes_stream()));
    *r.status_mut() = status;
    if let Some(ct) = content_type {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    r
}

/// Keeps `kube-system/extension-apiserver-authentication` naming the CAs and headers an
/// extension API server checks this server's requests with.
pub fn publish_authentication(st: &ApiState, client_ca_pem: &str, front_proxy: &FrontProxy) {
    let data = json!({
        "client-ca-file": client_ca_pem,
        "requestheader-client-ca-file": front_proxy.ca_pem,
        "requestheader-allowed-names": format!("[\"{FRONT_PROXY_CLIENT}\"]"),
        "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
        "requestheader-group-headers": "[\"X-Remote-Group\"]",
        "requestheader-username-headers": "[\"X-Remote-User\"]",
    });
    let key = "/core/configmaps/kube-system/extension-apiserver-authentication";
    let _ = st.store.mutate(key, &mut |cur| {
        let Some(cur) = cur else {
            let Ok((_, obj)) = crate::controllers::objects::prepare(
                "",
                "configmaps",
                Some("kube-system"),
                json!({"metadata": {"name": "extension-apiserver-authentication"}, "data": data}),
            ) else {
                return Ok(Mutation::Keep);
            };
            return Ok(Mutation::Put(obj));
        };
        if cur.object.get("data") == Some(&data) {
            return Ok(Mutation::Keep);
        }
        let mut new = (*cur.object).clone();
        new["data"] = data.clone();
        Ok(Mutation::Put(new))
    });
}

/// The availability controller: checks every APIService that names a Service.
pub async fn run(st: SharedState) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    loop {
        tick.tick().await;
        let Ok((all, _)) = st.store.list(PREFIX) else {
            continue;
        };
        let mut resources = Vec::new();
        let mut conditions = Vec::new();
        for svc in all.iter().map(|s| &*s.object) {
            if !svc.pointer("/spec/service").is_some_and(Value::is_object) {
                continue;
            }
            let group = svc
                .pointer("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or("");
            let version = svc
                .pointer("/spec/version")
                .and_then(Value::as_str)
                .unwrap_or("");
            let name = svc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let (status, reason, message) = match check(&st, svc, group, version).await {
                Ok(list) => {
                    resources.extend(discovery_entries(group, version, &list));
                    ("True", "Passed", "all checks passed".to_string())
                }
                Err((reason, message)) => ("False", reason, message),
            };
            conditions.push((name.to_string(), status, reason, message));
        }
        // Discovery first: a client that sees Available=True finds the resources listed.
        if let Ok(mut d) = DISCOVERED.write() {
            let same = d.len() == resources.len()
                && d.iter().zip(&resources).all(|(a, b)| std::ptr::eq(*a, *b));
            if !same {
                *d = resources;
                GENERATION.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        for (name, status, reason, message) in conditions {
            set_available(&st, &name, status, reason, &message);
        }
    }
}

/// The backend's discovery document of `group`/`version`.
async fn check(
    st: &ApiState,
    svc: &Value,
    group: &str,
    version: &str,
) -> Result<Value, Unreachable> {
    let backend = resolve(st, svc)?;
    let url = format!(
        "https://{}:{}/apis/{group}/{version}",
        backend.host,
        backend.addr.port()
    );
    let failed = |e: String| {
        (
            "FailedDiscoveryCheck",
            format!("failing or missing response from {url}: {e}"),
        )
    };
    let client = client(st, svc, &backend).map_err(failed)?;
    let resp = tokio::time::timeout(
        Duration::from_secs(5),
        client
            .get(&url)
            .header("X-Remote-User", "system:kube-aggregator")
            .header("X-Remote-Group", "system:masters")
            .send(),
    )
    .await
    .map_err(|_| failed("timeout".into()))?
    .map_err(|e| failed(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(failed(format!(
            "bad status from {url}: {}",
            resp.status().as_u16()
        )));
    }
    resp.json::<Value>()
        .await
        .map_err(|e| failed(e.to_string()))
}

/// The backend's APIResourceList as catalogue entries (leaked once per distinct list).
fn discovery_entries(group: &str, version: &str, list: &Value) -> Vec<&'static ResourceInfo> {
    let text = list["resources"].to_string();
    let mut listed = LISTED.lock().unwrap_or_else(|e| e.into_inner());
    let listed = listed.get_or_insert_with(HashMap::new);
    let gv = (group.to_string(), version.to_string());
    if let Some((seen, entries)) = listed.get(&gv)
        && *seen == text
    {
        return entries.clone();
    }
    let items: Vec<&Value> = list["resources"].as_array().into_iter().flatten().collect();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let mut entries = Vec::new();
    for r in items
        .iter()
        .filter(|r| r["name"].as_str().is_some_and(|n| !n.contains('/')))
    {
        let plural = r["name"].as_str().unwrap_or("");
        let subresources: Vec<String> = items
            .iter()
            .filter_map(|s| s["name"].as_str()?.strip_prefix(&format!("{plural}/")))
            .map(str::to_string)
            .collect();
        let info = ResourceInfo {
            group: catalog::intern(group),
            version: catalog::intern(version),
            kind: catalog::intern(r["kind"].as_str().unwrap_or("")),
            plural: catalog::intern(plural),
            singular: catalog::intern(r["singularName"].as_str().unwrap_or("")),
            namespaced: r["namespaced"].as_bool().unwrap_or(false),
            short_names: catalog::intern_list(&strings(&r["shortNames"])),
            categories: catalog::intern_list(&strings(&r["categories"])),
            verbs: catalog::intern_list(&strings(&r["verbs"])),
            subresources: catalog::intern_list(&subresources),
            custom: false,
        };
        entries.push(&*Box::leak(Box::new(info)));
    }
    listed.insert(gv, (text, entries.clone()));
    entries
}

/// Writes the `Available` condition when it changed.
fn set_available(st: &ApiState, name: &str, status: &str, reason: &str, message: &str) {
    let key = format!("{PREFIX}{name}");
    let _ = st.store.mutate(&key, &mut |cur| {
        let Some(cur) = cur else {
            return Ok(Mutation::Keep);
        };
        let old = cur
            .object
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| c["type"] == "Available"))
            .cloned();
        if old.as_ref().is_some_and(|c| {
            c["status"] == status && c["reason"] == reason && c["message"] == message
        }) {
            return Ok(Mutation::Keep);
        }
        let since = match &old {
            Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
            _ => json!(crate::apiserver::rest::now_rfc3339()),
        };
        let mut new = (*cur.object).clone();
        new["status"]["conditions"] = json!([{
            "type": "Available", "status": status, "lastTransitionTime": since,
            "reason": reason, "message": message,
        }]);
        Ok(Mutation::Put(new))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_group_version_paths_are_aggregated() {
        assert_eq!(
            group_version("/apis/wardle.example.com/v1alpha1/namespaces/ns/flunders"),
            Some(("wardle.example.com", "v1alpha1"))
        );
        assert_eq!(
            group_version("/apis/wardle.example.com/v1alpha1"),
            Some(("wardle.example.com", "v1alpha1"))
        );
        assert_eq!(group_version("/apis/wardle.example.com"), None);
        assert_eq!(group_version("/api/v1/pods"), None);
        assert!(served_here("apps", "v1"));
        assert!(served_here("metrics.k8s.io", "v1beta1"));
        assert!(!served_here("wardle.example.com", "v1alpha1"));
    }

    #[test]
    fn a_backends_resource_list_becomes_discovery_entries() {
        let list = json!({"resources": [
            {"name": "flunders", "singularName": "flunder", "namespaced": true, "kind": "Flunder",
             "verbs": ["get", "list"], "shortNames": ["fl"]},
            {"name": "flunders/status", "namespaced": true, "kind": "Flunder", "verbs": ["get"]},
        ]});
        let e = discovery_entries("wardle.example.com", "v1alpha1", &list);
        assert_eq!(e.len(), 1);
        assert_eq!(
            (
                e[0].kind,
                e[0].plural,
                e[0].namespaced,
                e[0].short_names,
                e[0].subresources
            ),
            ("Flunder", "flunders", true, &["fl"][..], &["status"][..])
        );
        let again = discovery_entries("wardle.example.com", "v1alpha1", &list);
        assert!(
            std::ptr::eq(e[0], again[0]),
            "an unchanged list is not leaked again"
        );
    }
}
