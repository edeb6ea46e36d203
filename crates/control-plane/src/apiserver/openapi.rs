//! OpenAPI documents for kubectl: `/openapi/v3` (an index naming one document per
//! group-version, each at a `?hash=` URL that never changes content) and `/openapi/v3/<gv>`
//! (the operations and component schemas of that group-version), plus `/openapi/v2` in JSON.
//!
//! kubectl reads the v3 documents for `explain`, for the patch strategies of client-side
//! `apply`, and to learn that the server validates fields itself (`--validate=strict`).
//! The documents are rendered once, on first use, from the catalogue and the k8s-openapi
//! types' schemas.

mod custom;
mod paths;
mod protobuf;
mod schemas;
mod v2;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::get;
use k8s_openapi::jiff::Timestamp;
use nodus_k8s::catalog::{self, ResourceInfo};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};

use crate::apiserver::discovery;
use paths::SubresourceBody;
use schemas::Components;

const JSON: &str = "application/json";
/// The media types of gnostic's protobuf Swagger 2.0 document. client-go asks with the `@`
/// form, which Go's mime parser rejects in a Content-Type: upstream answers with the other.
const V2_PROTOBUF_REQUESTED: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
/// The Kubernetes version whose API the documents describe.
const INFO_VERSION: &str = "v1.33.0";

/// The OpenAPI endpoints, stateless (`Router<()>`), ready to be merged into the API server.
///
/// Rendering starts in the background right away, so that kubectl's first `apply` or
/// `explain` does not wait for it.
pub fn router() -> Router {
    if DOCS_READY.get().is_none() {
        let spawned = std::thread::Builder::new()
            .name("openapi-render".into())
            .spawn(|| {
                let _ = DOCS_READY.set(documents());
            });
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "OpenAPI documents will be rendered on first request");
        }
    }
    Router::new()
        .route("/openapi/v2", get(v2_handler))
        .route("/openapi/v3", get(v3_index))
        .route("/openapi/v3/", get(v3_index))
        .route("/openapi/v3/{*path}", get(v3_document))
}

/// A rendered document and the hash clients cache it by.
struct Rendered {
    body: Vec<u8>,
    hash: String,
}

impl Rendered {
    fn new(doc: &Value) -> Rendered {
        // Serialising a Value cannot fail: its keys are strings already.
        Rendered::from_bytes(serde_json::to_vec(doc).unwrap_or_default())
    }

    fn from_bytes(body: Vec<u8>) -> Rendered {
        // Upstream names documents by the upper-case hex SHA-512 of their bytes.
        let hash = format!("{:X}", Sha512::digest(&body));
        Rendered { body, hash }
    }

    fn etag(&self) -> String {
        format!("\"{}\"", self.hash)
    }
}

struct Documents {
    v2: Rendered,
    v2_protobuf: Rendered,
    index: Rendered,
    /// Keyed by the index's path: `api/v1`, `apis/apps/v1`.
    group_versions: BTreeMap<String, Rendered>,
    /// ObjectMeta's schemas, for the documents of custom resources.
    meta_schemas: Map<String, Value>,
}

fn documents() -> &'static Documents {
    static DOCS: OnceLock<Documents> = OnceLock::new();
    DOCS.get_or_init(build)
}

/// The group-versions of the catalogue with their resources, in catalogue order.
fn group_versions() -> Vec<((&'static str, &'static str), Vec<&'static ResourceInfo>)> {
    let mut out: Vec<((&str, &str), Vec<&ResourceInfo>)> = Vec::new();
    for r in catalog::all() {
        let key = (r.group, r.version);
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, list)) => list.push(r),
            None => out.push((key, vec![r])),
        }
    }
    out
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The subresources of `r` whose bodies have a schema, for the paths of its document.
fn subresource_bodies(c: &Components, r: &ResourceInfo) -> Vec<SubresourceBody> {
    r.subresources
        .iter()
        .filter_map(|name| {
            let info = discovery::subresource_info(r, name);
            let kind = c.kinds.iter().find(|k| {
                k.group == info.group && k.version == info.version && k.kind == info.kind
            })?;
            Some(SubresourceBody {
                name,
                schema: kind.name.clone(),
                group: info.group,
                version: info.version,
                kind: info.kind,
                verbs: info.verbs,
            })
        })
        .collect()
}

fn security_scheme() -> Value {
    json!({
        "BearerToken": {
            "type": "apiKey",
            "description": "Bearer Token authentication",
            "name": "authorization",
            "in": "header",
        }
    })
}

fn build() -> Documents {
    let c = schemas::components();
    let mut rendered_gvs = BTreeMap::new();
    let mut index = Map::new();
    let mut all_paths = Map::new();
    for ((group, version), resources) in group_versions() {
        let mut paths = Map::new();
        let mut roots: Vec<String> = paths::common_schemas()
            .iter()
            .map(|s| (*s).to_string())
            .collect();
        for r in resources {
            let Some(kind) = c
                .kinds
                .iter()
                .find(|k| k.group == r.group && k.version == r.version && k.kind == r.kind)
            else {
                tracing::warn!(
                    group = r.group,
                    version = r.version,
                    kind = r.kind,
                    "no OpenAPI schema for catalogue kind"
                );
                continue;
            };
            let subs = subresource_bodies(&c, r);
            roots.push(kind.name.clone());
            roots.extend(kind.list_name.iter().cloned());
            roots.extend(subs.iter().map(|s| s.schema.clone()));
            paths::add_resource(&mut paths, r, &kind.name, kind.list_name.as_deref(), &subs);
        }
        let doc = json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": INFO_VERSION},
            "paths": paths,
            "components": {
                "schemas": schemas::closure(&c.schemas, roots),
                "securitySchemes": security_scheme(),
            },
        });
        all_paths.extend(paths);
        let rendered = Rendered::new(&doc);
        let path = gv_path(group, version);
        index.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", rendered.hash)}),
        );
        rendered_gvs.insert(path, rendered);
    }
    let v2 = v2::document(&all_paths, &c.schemas, INFO_VERSION, security_scheme());
    Documents {
        v2_protobuf: Rendered::from_bytes(protobuf::encode_document(&v2)),
        v2: Rendered::new(&v2),
        index: Rendered::new(&json!({"paths": index})),
        group_versions: rendered_gvs,
        meta_schemas: custom::meta_closure(&c.schemas),
    }
}

/// Renders the documents off the async executor the first time; later calls are free.
async fn docs() -> Option<&'static Documents> {
    if let Some(d) = DOCS_READY.get() {
        return Some(d);
    }
    let d = tokio::task::spawn_blocking(documents).await.ok()?;
    let _ = DOCS_READY.set(d);
    Some(d)
}

static DOCS_READY: OnceLock<&'static Documents> = OnceLock::new();

/// Whether the Accept header admits JSON (absent, `application/json`, or a wildcard).
fn accepts_json(headers: &HeaderMap) -> bool {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    if accept.trim().is_empty() {
        return true;
    }
    accept.split(',').any(|range| {
        let media = range
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        matches!(media.as_str(), "application/json" | "application/*" | "*/*")
    })
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
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
    let mut resp = Response::new(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
    resp
}

fn not_acceptable() -> Response {
    status(
        StatusCode::NOT_ACCEPTABLE,
        "NotAcceptable",
        "only the following media types are accepted: application/json",
    )
}

fn unavailable() -> Response {
    status(
        StatusCode::INTERNAL_SERVER_ERROR,
        "InternalError",
        "the OpenAPI documents could not be rendered",
    )
}

/// Serves a document with its ETag, answering a matching `If-None-Match` with 304.
fn serve(doc: &Rendered, headers: &HeaderMap) -> Response {
    serve_as(doc, headers, JSON)
}

fn serve_as(doc: &Rendered, headers: &HeaderMap, content_type: &'static str) -> Response {
    let etag = doc.etag();
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut resp = if unchanged {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        let mut r = Response::new(Body::from(doc.body.clone()));
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        r
    };
    if let Ok(v) = HeaderValue::from_str(&etag) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    // Protobuf and JSON share the URL upstream; caches must key on Accept too.
    resp.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    resp
}

/// The representation of `/openapi/v2` the Accept header asks for first.
fn v2_representation(headers: &HeaderMap) -> Option<&'static str> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Some(JSON);
    };
    if accept.trim().is_empty() {
        return Some(JSON);
    }
    accept.split(',').find_map(|range| {
        let media = range
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match media.as_str() {
            "application/json" | "application/*" | "*/*" => Some(JSON),
            V2_PROTOBUF | V2_PROTOBUF_REQUESTED => Some(V2_PROTOBUF),
            _ => None,
        }
    })
}

async fn v2_handler(headers: HeaderMap) -> Response {
    let Some(representation) = v2_representation(&headers) else {
        return status(
            StatusCode::NOT_ACCEPTABLE,
            "NotAcceptable",
            "only the following media types are accepted: application/json, application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        );
    };
    match docs().await {
        Some(d) if representation == JSON => serve(&d.v2, &headers),
        Some(d) => serve_as(&d.v2_protobuf, &headers, representation),
        None => unavailable(),
    }
}

async fn v3_index(headers: HeaderMap) -> Response {
    if !accepts_json(&headers) {
        return not_acceptable();
    }
    let Some(d) = docs().await else {
        return unavailable();
    };
    let custom = custom::documents(&d.meta_schemas);
    if custom.is_empty() {
        return serve(&d.index, &headers);
    }
    // The built-in index plus one entry per CRD-defined group-version.
    let mut index: Value = serde_json::from_slice(&d.index.body).unwrap_or_else(|_| json!({}));
    for (path, doc) in custom.iter() {
        index["paths"][path] =
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", doc.hash)});
    }
    serve(&Rendered::new(&index), &headers)
}

fn query_hash(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "hash").then(|| v.to_string())
    })
}

async fn v3_document(
    Path(path): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    if !accepts_json(&headers) {
        return not_acceptable();
    }
    let Some(d) = docs().await else {
        return unavailable();
    };
    let path = path.trim_end_matches('/');
    let custom = custom::documents(&d.meta_schemas);
    let Some(doc) = d.group_versions.get(path).or_else(|| custom.get(path)) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    let Some(hash) = query_hash(query.as_deref()) else {
        return serve(doc, &headers);
    };
    if hash != doc.hash {
        // A client holding an old index is sent to the current document, as upstream does.
        let mut resp = Response::new(Body::empty());
        *resp.status_mut() = StatusCode::MOVED_PERMANENTLY;
        if let Ok(v) = HeaderValue::from_str(&format!("/openapi/v3/{path}?hash={}", doc.hash)) {
            resp.headers_mut().insert(header::LOCATION, v);
        }
        return resp;
    }
    let mut resp = serve(doc, &headers);
    // The URL names the content: it can be cached for good.
    let h = resp.headers_mut();
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, immutable"),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let a_year = i64::try_from(now)
        .ok()
        .and_then(|s| Timestamp::from_second(s.saturating_add(365 * 24 * 3600)).ok());
    if let Some(a_year) = a_year
        && let Ok(v) = HeaderValue::from_str(&http_date(a_year))
    {
        h.insert(header::EXPIRES, v);
    }
    resp
}

/// An HTTP date (RFC 9110 IMF-fixdate).
fn http_date(t: Timestamp) -> String {
    t.strftime("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalogue_kind_has_a_schema_with_its_gvk() {
        let c = schemas::components();
        for r in catalog::all() {
            let kind = c
                .kinds
                .iter()
                .find(|k| k.group == r.group && k.version == r.version && k.kind == r.kind);
            let Some(kind) = kind else {
                panic!("no schema for {}/{} {}", r.group, r.version, r.kind);
            };
            let schema = &c.schemas[&kind.name];
            assert_eq!(
                schema["x-kubernetes-group-version-kind"][0]["kind"], r.kind,
                "{}",
                kind.name
            );
            if r.verbs.contains(&"list") {
                let list = kind.list_name.as_deref().unwrap_or_default();
                assert_eq!(
                    c.schemas[list]["x-kubernetes-group-version-kind"][0]["kind"],
                    format!("{}List", r.kind),
                    "{list}"
                );
            }
        }
    }

    #[test]
    fn every_reference_resolves_in_each_document() {
        let d = build();
        assert!(!d.group_versions.is_empty());
        for (path, doc) in &d.group_versions {
            let doc: Value = serde_json::from_slice(&doc.body).unwrap_or_default();
            let schemas = doc["components"]["schemas"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            assert!(!schemas.is_empty(), "{path} has no schemas");
            let dangling = schemas::dangling_refs(&doc, &schemas);
            assert!(dangling.is_empty(), "{path}: unresolved {dangling:?}");
        }
        let v2: Value = serde_json::from_slice(&d.v2.body).unwrap_or_default();
        let defs = v2["definitions"].as_object().cloned().unwrap_or_default();
        let text = v2.to_string();
        assert!(!text.contains("#/components/schemas/"));
        for name in ["io.k8s.api.core.v1.Pod", "io.k8s.api.apps.v1.Deployment"] {
            assert!(defs.contains_key(name), "{name} missing from v2");
        }
    }

    #[test]
    fn patch_operations_advertise_field_validation() {
        let d = build();
        let core = d.group_versions.get("api/v1").map(|r| r.body.clone());
        let doc: Value = serde_json::from_slice(&core.unwrap_or_default()).unwrap_or_default();
        let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Pod");
        let params: Vec<&str> = patch["parameters"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(params.contains(&"fieldValidation"), "{params:?}");
        let containers =
            &doc["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
        let pod = &doc["components"]["schemas"]["io.k8s.api.core.v1.Pod"];
        assert!(pod.get("required").is_none());
        let event = &doc["components"]["schemas"]["io.k8s.api.core.v1.Event"];
        assert_eq!(event["required"], json!(["involvedObject", "metadata"]));
        let secret_ref = &doc["components"]["schemas"]["io.k8s.api.core.v1.SecretKeySelector"];
        assert_eq!(secret_ref["required"], json!(["key"]));
    }

    #[test]
    fn http_dates_are_imf_fixdate() {
        let t: Timestamp = "1994-11-06T08:49:37Z".parse().unwrap_or_default();
        assert_eq!(http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
    }
}
