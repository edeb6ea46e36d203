//! API discovery: the documents kubectl reads to learn which groups, versions and resources
//! the server has (`/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`, and the
//! aggregated `apidiscovery.k8s.io/v2` form of `/api` and `/apis` that client-go asks for
//! first).
//!
//! Everything is derived from `nodus_k8s::catalog` (built-in and CRD-defined resources); the
//! `/version` endpoint is not here.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::Response;
use axum::routing::get;
use base64::Engine;
use nodus_k8s::catalog::{self, ResourceInfo};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// Content type of the aggregated discovery document, as upstream writes it.
const AGGREGATED_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const AGGREGATED_V2BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
const JSON: &str = "application/json";

/// Where API groups appear in `/apis`: upstream orders groups by their APIService priority,
/// and `kubectl api-resources` prints them in that order.
const GROUP_ORDER: &[&str] = &[
    "apiregistration.k8s.io",
    "apps",
    "events.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "networking.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "storage.k8s.io",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "scheduling.k8s.io",
    "coordination.k8s.io",
    "node.k8s.io",
    "discovery.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "resource.k8s.io",
];

/// The discovery endpoints, stateless (`Router<()>`), ready to be merged into the API server.
pub fn router() -> Router {
    Router::new()
        .route("/api", get(api))
        .route("/api/", get(api))
        .route("/api/v1", get(core_v1))
        .route("/api/v1/", get(core_v1))
        .route("/apis", get(apis))
        .route("/apis/", get(apis))
        .route("/apis/{group}", get(group))
        .route("/apis/{group}/", get(group))
        .route("/apis/{group}/{version}", get(group_version))
        .route("/apis/{group}/{version}/", get(group_version))
}

/// A group's served versions, most preferred first.
#[derive(Debug)]
struct Group {
    name: &'static str,
    versions: Vec<&'static str>,
}

/// The catalogue, the resources served without being stored (`metrics.k8s.io`, the
/// group an aggregated metrics-server serves upstream) and those of available aggregated
/// APIs.
fn served() -> impl Iterator<Item = &'static ResourceInfo> {
    catalog::served()
        .into_iter()
        .chain(crate::apiserver::metrics_api::RESOURCES.iter())
        .chain(crate::apiserver::aggregator::discovered())
}

/// The groups of the catalogue (core group excluded) in upstream's order.
fn named_groups() -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for r in served().filter(|r| !r.group.is_empty()) {
        match groups.iter_mut().find(|g| g.name == r.group) {
            Some(g) if !g.versions.contains(&r.version) => g.versions.push(r.version),
            Some(_) => {}
            None => groups.push(Group {
                name: r.group,
                versions: vec![r.version],
            }),
        }
    }
    for g in &mut groups {
        g.versions
            .sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
    }
    groups.sort_by_key(|g| {
        let rank = GROUP_ORDER
            .iter()
            .position(|n| *n == g.name)
            .unwrap_or(GROUP_ORDER.len());
        (rank, g.name)
    });
    groups
}

/// Kube-aware version order: GA above beta above alpha, higher numbers first within each.
fn version_priority(version: &str) -> (u8, u32, u32) {
    let rest = version.strip_prefix('v').unwrap_or(version);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    let (stability, minor_str) = if tail.is_empty() {
        (3, "")
    } else if let Some(m) = tail.strip_prefix("beta") {
        (2, m)
    } else if let Some(m) = tail.strip_prefix("alpha") {
        (1, m)
    } else {
        (0, "")
    };
    (stability, major, minor_str.parse().unwrap_or(0))
}

fn resources_of(group: &str, version: &str) -> Vec<&'static ResourceInfo> {
    let mut list: Vec<&'static ResourceInfo> = served()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    list.sort_by_key(|r| r.plural);
    list
}

/// What a subresource answers with and which verbs it takes, as upstream registers them.
pub(crate) struct SubresourceInfo {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: String,
    pub verbs: &'static [&'static str],
}

pub(crate) fn subresource_info(parent: &ResourceInfo, name: &str) -> SubresourceInfo {
    const GET_PATCH_UPDATE: &[&str] = &["get", "patch", "update"];
    const CREATE: &[&str] = &["create"];
    const CREATE_GET: &[&str] = &["create", "get"];
    let own = |verbs| SubresourceInfo {
        group: parent.group,
        version: parent.version,
        kind: parent.kind.to_string(),
        verbs,
    };
    let other = |group, version, kind: &str, verbs| SubresourceInfo {
        group,
        version,
        kind: kind.to_string(),
        verbs,
    };
    match name {
        "status" | "ephemeralcontainers" | "resize" | "approval" => own(GET_PATCH_UPDATE),
        "scale" => other("autoscaling", "v1", "Scale", GET_PATCH_UPDATE),
        "binding" => other("", "v1", "Binding", CREATE),
        "eviction" => other("policy", "v1", "Eviction", CREATE),
        "token" => other("authentication.k8s.io", "v1", "TokenRequest", CREATE),
        "log" => own(&["get"]),
        "finalize" => own(&["update"]),
        "exec" => other(parent.group, parent.version, "PodExecOptions", CREATE_GET),
        "attach" => other(parent.group, parent.version, "PodAttachOptions", CREATE_GET),
        "portforward" => other(
            parent.group,
            parent.version,
            "PodPortForwardOptions",
            CREATE_GET,
        ),
        "proxy" => other(
            parent.group,
            parent.version,
            &format!("{}ProxyOptions", parent.kind),
            &["create", "delete", "get", "patch", "update"],
        ),
        _ => own(&["get"]),
    }
}

/// Upstream's storageVersionHash: the first 8 bytes of sha256("<group>/<version>/<kind>").
fn storage_version_hash(r: &ResourceInfo) -> String {
    let digest = Sha256::digest(format!("{}/{}/{}", r.group, r.version, r.kind).as_bytes());
    base64::engine::general_purpose::STANDARD.encode(&digest[..8])
}

fn strings(items: &[&str]) -> Value {
    Value::Array(
        items
            .iter()
            .map(|s| Value::String((*s).to_string()))
            .collect(),
    )
}

/// The legacy `APIResourceList` of one group-version: each resource, then its subresources
/// as `<plural>/<sub>` entries, sorted by name as upstream lists them.
fn resource_list(group: &str, version: &str) -> Value {
    let mut entries: Vec<(String, Value)> = Vec::new();
    for r in resources_of(group, version) {
        let mut e = Map::new();
        e.insert("name".into(), json!(r.plural));
        e.insert("singularName".into(), json!(r.singular));
        e.insert("namespaced".into(), json!(r.namespaced));
        e.insert("kind".into(), json!(r.kind));
        e.insert("verbs".into(), strings(r.verbs));
        if !r.short_names.is_empty() {
            e.insert("shortNames".into(), strings(r.short_names));
        }
        if !r.categories.is_empty() {
            e.insert("categories".into(), strings(r.categories));
        }
        e.insert("storageVersionHash".into(), json!(storage_version_hash(r)));
        entries.push((r.plural.to_string(), Value::Object(e)));
        for sub in r.subresources {
            let info = subresource_info(r, sub);
            let name = format!("{}/{}", r.plural, sub);
            let mut e = Map::new();
            e.insert("name".into(), json!(name));
            e.insert("singularName".into(), json!(""));
            e.insert("namespaced".into(), json!(r.namespaced));
            if info.group != group || info.version != version {
                e.insert("group".into(), json!(info.group));
                e.insert("version".into(), json!(info.version));
            }
            e.insert("kind".into(), json!(info.kind));
            e.insert("verbs".into(), strings(info.verbs));
            entries.push((name, Value::Object(e)));
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut doc = Map::new();
    doc.insert("kind".into(), json!("APIResourceList"));
    // The core group's list carries no apiVersion upstream; named groups' lists do.
    if !group.is_empty() {
        doc.insert("apiVersion".into(), json!("v1"));
    }
    doc.insert("groupVersion".into(), json!(group_version));
    doc.insert(
        "resources".into(),
        Value::Array(entries.into_iter().map(|(_, v)| v).collect()),
    );
    Value::Object(doc)
}

fn group_version_for_discovery(group: &str, version: &str) -> Value {
    json!({"groupVersion": format!("{group}/{version}"), "version": version})
}

fn api_group(g: &Group) -> Value {
    let versions: Vec<Value> = g
        .versions
        .iter()
        .map(|v| group_version_for_discovery(g.name, v))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": g.name, "versions": versions, "preferredVersion": preferred})
}

fn api_group_list(groups: &[Group]) -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups.iter().map(api_group).collect::<Vec<_>>(),
    })
}

fn aggregated_resources(group: &str, version: &str) -> Vec<Value> {
    resources_of(group, version)
        .into_iter()
        .map(|r| {
            let mut e = Map::new();
            e.insert("resource".into(), json!(r.plural));
            e.insert(
                "responseKind".into(),
                json!({"group": r.group, "version": r.version, "kind": r.kind}),
            );
            e.insert(
                "scope".into(),
                json!(if r.namespaced {
                    "Namespaced"
                } else {
                    "Cluster"
                }),
            );
            e.insert("singularResource".into(), json!(r.singular));
            e.insert("verbs".into(), strings(r.verbs));
            if !r.short_names.is_empty() {
                e.insert("shortNames".into(), strings(r.short_names));
            }
            if !r.categories.is_empty() {
                e.insert("categories".into(), strings(r.categories));
            }
            let mut subs: Vec<&str> = r.subresources.to_vec();
            subs.sort_unstable();
            if !subs.is_empty() {
                let subs: Vec<Value> = subs
                    .into_iter()
                    .map(|s| {
                        let info = subresource_info(r, s);
                        json!({
                            "subresource": s,
                            "responseKind": {
                                "group": info.group,
                                "version": info.version,
                                "kind": info.kind,
                            },
                            "verbs": strings(info.verbs),
                        })
                    })
                    .collect();
                e.insert("subresources".into(), Value::Array(subs));
            }
            Value::Object(e)
        })
        .collect()
}

fn aggregated_group(name: Option<&str>, versions: &[&str]) -> Value {
    let group = name.unwrap_or("");
    let mut metadata = Map::new();
    if let Some(n) = name {
        metadata.insert("name".into(), json!(n));
    }
    metadata.insert("creationTimestamp".into(), Value::Null);
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| {
            json!({
                "version": v,
                "resources": aggregated_resources(group, v),
                "freshness": "Current",
            })
        })
        .collect();
    json!({"metadata": metadata, "versions": versions})
}

fn aggregated_list(api_version: &str, items: Vec<Value>) -> Value {
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": api_version,
        "metadata": {},
        "items": items,
    })
}

/// An aggregated document rendered in both versions client-go understands, with its ETag.
struct Aggregated {
    v2: Vec<u8>,
    v2beta1: Vec<u8>,
    etag: String,
}

impl Aggregated {
    fn new(items: Vec<Value>) -> Aggregated {
        let v2 = render(&aggregated_list("apidiscovery.k8s.io/v2", items.clone()));
        let v2beta1 = render(&aggregated_list("apidiscovery.k8s.io/v2beta1", items));
        let etag = format!("\"{:X}\"", Sha256::digest(&v2));
        Aggregated { v2, v2beta1, etag }
    }
}

/// Every discovery document, rendered once per state of the catalogue and of the available
/// aggregated APIs (they change when CRDs and APIServices do).
struct Documents {
    core_v1: Vec<u8>,
    apis: Vec<u8>,
    groups: BTreeMap<&'static str, Vec<u8>>,
    group_versions: BTreeMap<(&'static str, &'static str), Vec<u8>>,
    aggregated_api: Aggregated,
    aggregated_apis: Aggregated,
}

fn render(v: &Value) -> Vec<u8> {
    // Serialising a Value cannot fail: its keys are strings already.
    serde_json::to_vec(v).unwrap_or_default()
}

fn documents() -> Arc<Documents> {
    type Cache = Option<((u64, u64), Arc<Documents>)>;
    static DOCS: RwLock<Cache> = RwLock::new(None);
    let generation = (
        catalog::generation(),
        crate::apiserver::aggregator::generation(),
    );
    if let Some((g, d)) = &*DOCS.read().unwrap_or_else(|e| e.into_inner())
        && *g == generation
    {
        return d.clone();
    }
    let docs = Arc::new(render_documents());
    *DOCS.write().unwrap_or_else(|e| e.into_inner()) = Some((generation, docs.clone()));
    docs
}

fn render_documents() -> Documents {
    {
        let groups = named_groups();
        let mut group_docs = BTreeMap::new();
        let mut gv_docs = BTreeMap::new();
        for g in &groups {
            let mut doc = api_group(g);
            if let Value::Object(m) = &mut doc {
                m.insert("kind".into(), json!("APIGroup"));
                m.insert("apiVersion".into(), json!("v1"));
            }
            group_docs.insert(g.name, render(&doc));
            for v in &g.versions {
                gv_docs.insert((g.name, *v), render(&resource_list(g.name, v)));
            }
        }
        let core_versions: Vec<&str> = if catalog::all().iter().any(|r| r.group.is_empty()) {
            vec!["v1"]
        } else {
            Vec::new()
        };
        let aggregated_apis = groups
            .iter()
            .map(|g| aggregated_group(Some(g.name), &g.versions))
            .collect();
        Documents {
            core_v1: render(&resource_list("", "v1")),
            apis: render(&api_group_list(&groups)),
            groups: group_docs,
            group_versions: gv_docs,
            aggregated_api: Aggregated::new(vec![aggregated_group(None, &core_versions)]),
            aggregated_apis: Aggregated::new(aggregated_apis),
        }
    }
}

/// Which representation of `/api` or `/apis` the client asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wanted {
    AggregatedV2,
    AggregatedV2Beta1,
    Legacy,
}

/// Picks the first media range of the Accept header the server can produce, in the
/// client's order (client-go lists aggregated v2, then v2beta1, then plain JSON).
fn negotiate(headers: &HeaderMap) -> Option<Wanted> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Some(Wanted::Legacy);
    };
    if accept.trim().is_empty() {
        return Some(Wanted::Legacy);
    }
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let mut params: BTreeMap<String, String> = BTreeMap::new();
        for p in parts {
            if let Some((k, v)) = p.split_once('=') {
                params.insert(
                    k.trim().to_ascii_lowercase(),
                    v.trim().trim_matches('"').to_string(),
                );
            }
        }
        let json_like = matches!(media.as_str(), "application/json" | "application/*" | "*/*");
        if !json_like {
            continue;
        }
        let g = params.get("g").map(String::as_str);
        let v = params.get("v").map(String::as_str);
        let as_kind = params.get("as").map(String::as_str);
        match (g, v, as_kind) {
            (None, None, None) => return Some(Wanted::Legacy),
            (Some("apidiscovery.k8s.io"), Some("v2"), Some("APIGroupDiscoveryList")) => {
                return Some(Wanted::AggregatedV2);
            }
            (Some("apidiscovery.k8s.io"), Some("v2beta1"), Some("APIGroupDiscoveryList")) => {
                return Some(Wanted::AggregatedV2Beta1);
            }
            _ => continue,
        }
    }
    None
}

fn json_response(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// A metav1 Status body, as upstream answers unknown discovery paths.
fn status_response(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {},
        "code": code.as_u16(),
    });
    json_response(code, JSON, render(&body))
}

fn not_found() -> Response {
    status_response(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn not_acceptable() -> Response {
    status_response(
        StatusCode::NOT_ACCEPTABLE,
        "NotAcceptable",
        "only the following media types are accepted: application/json, application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
    )
}

fn aggregated_response(doc: &Aggregated, wanted: Wanted, headers: &HeaderMap) -> Response {
    let etag_matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == doc.etag));
    let (content_type, body) = match wanted {
        Wanted::AggregatedV2Beta1 => (AGGREGATED_V2BETA1, doc.v2beta1.clone()),
        _ => (AGGREGATED_V2, doc.v2.clone()),
    };
    let mut resp = if etag_matches {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        json_response(StatusCode::OK, content_type, body)
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&doc.etag) {
        h.insert(header::ETAG, v);
    }
    // Caches keyed on the URL alone would otherwise hand a legacy client the aggregated form.
    h.insert(header::VARY, HeaderValue::from_static("Accept"));
    resp
}

/// `serverAddressByClientCIDRs` names the address clients reach us on: the authority this
/// client used, from the HTTP/2 `:authority` (kept in the URI) or the HTTP/1.1 Host header.
fn server_address(uri: &Uri, headers: &HeaderMap) -> String {
    uri.authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .filter(|h| !h.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "127.0.0.1:6443".to_string())
}

async fn api(uri: Uri, headers: HeaderMap) -> Response {
    let docs = documents();
    match negotiate(&headers) {
        Some(Wanted::Legacy) => {
            let versions: Vec<&str> = if catalog::all().iter().any(|r| r.group.is_empty()) {
                vec!["v1"]
            } else {
                Vec::new()
            };
            let body = json!({
                "kind": "APIVersions",
                "versions": versions,
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address(&uri, &headers)}
                ],
            });
            json_response(StatusCode::OK, JSON, render(&body))
        }
        Some(w) => aggregated_response(&docs.aggregated_api, w, &headers),
        None => not_acceptable(),
    }
}

async fn core_v1() -> Response {
    json_response(StatusCode::OK, JSON, documents().core_v1.clone())
}

async fn apis(headers: HeaderMap) -> Response {
    let docs = documents();
    match negotiate(&headers) {
        Some(Wanted::Legacy) => json_response(StatusCode::OK, JSON, docs.apis.clone()),
        Some(w) => aggregated_response(&docs.aggregated_apis, w, &headers),
        None => not_acceptable(),
    }
}

async fn group(Path(group): Path<String>) -> Response {
    match documents().groups.get(group.as_str()) {
        Some(body) => json_response(StatusCode::OK, JSON, body.clone()),
        None => not_found(),
    }
}

async fn group_version(Path((group, version)): Path<(String, String)>) -> Response {
    match documents()
        .group_versions
        .get(&(group.as_str(), version.as_str()))
    {
        Some(body) => json_response(StatusCode::OK, JSON, body.clone()),
        None => not_found(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(header::ACCEPT, v);
        }
        h
    }

    #[test]
    fn negotiation_follows_client_order() {
        let client_go = format!("{AGGREGATED_V2},{AGGREGATED_V2BETA1},{JSON}");
        assert_eq!(negotiate(&accept(&client_go)), Some(Wanted::AggregatedV2));
        assert_eq!(
            negotiate(&accept(&format!("{AGGREGATED_V2BETA1},{JSON}"))),
            Some(Wanted::AggregatedV2Beta1)
        );
        assert_eq!(negotiate(&accept(JSON)), Some(Wanted::Legacy));
        assert_eq!(negotiate(&HeaderMap::new()), Some(Wanted::Legacy));
        assert_eq!(
            negotiate(&accept("application/vnd.kubernetes.protobuf")),
            None
        );
    }

    #[test]
    fn storage_version_hash_matches_upstream() {
        let pods = catalog::by_plural("", "v1", "pods");
        assert_eq!(
            pods.map(storage_version_hash).as_deref(),
            Some("xPOwRZ+Yhw8=")
        );
        let deploy = catalog::by_plural("apps", "v1", "deployments");
        assert_eq!(
            deploy.map(storage_version_hash).as_deref(),
            Some("8aSe+NMegvE=")
        );
    }

    #[test]
    fn core_list_has_subresources_with_their_kinds() {
        let list = resource_list("", "v1");
        let resources = list["resources"].as_array().cloned().unwrap_or_default();
        let find = |name: &str| resources.iter().find(|r| r["name"] == name).cloned();
        let eviction = find("pods/eviction").unwrap_or_default();
        assert_eq!(eviction["group"], "policy");
        assert_eq!(eviction["kind"], "Eviction");
        assert_eq!(find("pods/status").unwrap_or_default()["kind"], "Pod");
        assert!(list.get("apiVersion").is_none());
        let names: Vec<&str> = resources
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
    }

    #[test]
    fn versions_sort_like_kube() {
        let mut v = vec!["v1beta1", "v2", "v1alpha1", "v1", "v1beta2"];
        v.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        assert_eq!(v, ["v2", "v1", "v1beta2", "v1beta1", "v1alpha1"]);
    }
}
