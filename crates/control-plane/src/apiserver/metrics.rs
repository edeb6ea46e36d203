//! The API server's `/metrics` (upstream's apiserver/pkg/endpoints/metrics and the storage
//! and in-flight gauges): `apiserver_request_total`, `apiserver_request_duration_seconds`,
//! `apiserver_current_inflight_requests`, `apiserver_storage_objects` and
//! `apiserver_watch_events_total`, with upstream's names, labels and buckets, written with the
//! shared text encoder (`nodus_serving::prometheus`). Authorized as upstream's `/metrics`
//! nonResourceURL (the `system:monitoring` role).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use nodus_serving::prometheus::{self, Histogram, Kind};

use crate::apiserver::inflight;
use crate::apiserver::rest::{self, path};
use crate::apiserver::state::SharedState;

/// upstream's requestLatencies buckets (seconds).
const REQUEST_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

/// The labels a request is counted under, in upstream's order (without `code`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RequestLabels {
    verb: &'static str,
    dry_run: String,
    group: String,
    version: String,
    resource: String,
    subresource: String,
    scope: &'static str,
}

impl RequestLabels {
    fn pairs(&self) -> [(&'static str, &str); 8] {
        [
            ("verb", self.verb),
            ("dry_run", &self.dry_run),
            ("group", &self.group),
            ("version", &self.version),
            ("resource", &self.resource),
            ("subresource", &self.subresource),
            ("scope", self.scope),
            ("component", "apiserver"),
        ]
    }
}

/// The API server's own metrics.
#[derive(Default)]
pub struct ApiMetrics {
    requests: Mutex<BTreeMap<(RequestLabels, u16), u64>>,
    durations: Mutex<BTreeMap<RequestLabels, Histogram>>,
    inflight_read_only: AtomicI64,
    inflight_mutating: AtomicI64,
    /// (group, version, resource) → events sent to watchers.
    watch_events: Mutex<BTreeMap<(String, String, String), u64>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ApiMetrics {
    fn record(&self, labels: RequestLabels, code: u16, seconds: Option<f64>) {
        if let Some(s) = seconds {
            lock(&self.durations)
                .entry(labels.clone())
                .or_insert_with(|| Histogram::new(REQUEST_BUCKETS))
                .observe(s);
        }
        *lock(&self.requests).entry((labels, code)).or_default() += 1;
    }

    /// One event sent on a watch of `t`'s resource.
    pub(crate) fn watch_event(&self, t: &path::Target) {
        let key = (
            t.info.group.to_string(),
            t.info.version.to_string(),
            t.info.plural.to_string(),
        );
        *lock(&self.watch_events).entry(key).or_default() += 1;
    }

    /// The text format of every family; `objects` are the stored counts per resource.
    fn encode(&self, objects: &[(String, usize)]) -> String {
        let mut out = String::new();
        prometheus::family(
            &mut out,
            "apiserver_current_inflight_requests",
            "[STABLE] Maximal number of currently used inflight request limit of this apiserver per request kind in last second.",
            Kind::Gauge,
        );
        for (kind, v) in [
            ("mutating", &self.inflight_mutating),
            ("readOnly", &self.inflight_read_only),
        ] {
            let n = v.load(Ordering::Relaxed) as f64;
            prometheus::sample(
                &mut out,
                "apiserver_current_inflight_requests",
                &[("request_kind", kind)],
                n,
                None,
            );
        }
        let durations = lock(&self.durations);
        if !durations.is_empty() {
            prometheus::family(
                &mut out,
                "apiserver_request_duration_seconds",
                "[STABLE] Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.",
                Kind::Histogram,
            );
            for (labels, h) in durations.iter() {
                h.encode(
                    &mut out,
                    "apiserver_request_duration_seconds",
                    &labels.pairs(),
                );
            }
        }
        drop(durations);
        let requests = lock(&self.requests);
        if !requests.is_empty() {
            prometheus::family(
                &mut out,
                "apiserver_request_total",
                "[STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.",
                Kind::Counter,
            );
            for ((labels, code), n) in requests.iter() {
                let code = code.to_string();
                let mut l = labels.pairs().to_vec();
                l.push(("code", &code));
                prometheus::sample(&mut out, "apiserver_request_total", &l, *n as f64, None);
            }
        }
        drop(requests);
        prometheus::family(
            &mut out,
            "apiserver_storage_objects",
            "[STABLE] Number of stored objects at the time of last check split by kind. In case of a fetching error, the value will be -1.",
            Kind::Gauge,
        );
        for (resource, n) in objects {
            prometheus::sample(
                &mut out,
                "apiserver_storage_objects",
                &[("resource", resource)],
                *n as f64,
                None,
            );
        }
        let watch = lock(&self.watch_events);
        if !watch.is_empty() {
            prometheus::family(
                &mut out,
                "apiserver_watch_events_total",
                "[ALPHA] Number of events sent in watch clients",
                Kind::Counter,
            );
            for ((group, version, resource), n) in watch.iter() {
                prometheus::sample(
                    &mut out,
                    "apiserver_watch_events_total",
                    &[
                        ("group", group),
                        ("version", version),
                        ("resource", resource),
                    ],
                    *n as f64,
                    None,
                );
            }
        }
        out
    }
}

/// upstream's reported verb: the installer's action verb (LIST for a collection GET, GET
/// of one object, WATCH, POST, PUT, PATCH or APPLY, DELETE, DELETECOLLECTION, CONNECT for the
/// streaming subresources).
fn reported_verb(
    method: &axum::http::Method,
    t: &path::Target,
    verb: &str,
    apply: bool,
) -> &'static str {
    if let Some(sub) = t.sub.as_deref()
        && matches!(sub, "exec" | "attach" | "portforward" | "proxy")
    {
        return "CONNECT";
    }
    match verb {
        "get" => "GET",
        "list" => "LIST",
        "watch" => "WATCH",
        "create" => "POST",
        "update" => "PUT",
        "patch" if apply => "APPLY",
        "patch" => "PATCH",
        "delete" => "DELETE",
        "deletecollection" => "DELETECOLLECTION",
        _ => match method.as_str() {
            "GET" => "GET",
            "POST" => "POST",
            _ => "OTHER",
        },
    }
}

/// upstream's CleanScope.
fn scope(t: &path::Target, verb: &str) -> &'static str {
    if t.name.is_some() || verb == "create" {
        "resource"
    } else if t.namespace.is_some() {
        "namespace"
    } else {
        "cluster"
    }
}

/// The labels of a request, or `None` for the paths upstream does not count.
fn labels_of(req: &Request) -> Option<RequestLabels> {
    let p = req.uri().path();
    if matches!(p, "/healthz" | "/livez" | "/readyz") {
        return Some(RequestLabels {
            verb: "GET",
            dry_run: String::new(),
            group: String::new(),
            version: String::new(),
            resource: String::new(),
            subresource: p.to_string(),
            scope: "",
        });
    }
    let path::Parsed::Resource(t) = path::parse(p) else {
        return None;
    };
    let query = nodus_serving::query::parse_query(req.uri().query());
    let verb = rest::verb_of(req.method(), &t, &query);
    let apply = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/apply-patch"));
    Some(RequestLabels {
        verb: reported_verb(req.method(), &t, verb, apply),
        dry_run: query.get("dryRun").cloned().unwrap_or_default(),
        group: t.info.group.to_string(),
        version: t.info.version.to_string(),
        resource: t.info.plural.to_string(),
        subresource: t.sub.clone().unwrap_or_default(),
        scope: scope(&t, verb),
    })
}

/// Counts, times and tracks in flight every request (after authentication).
pub(crate) async fn instrument(
    State(st): State<SharedState>,
    req: Request,
    next: Next,
) -> Response {
    let labels = labels_of(&req);
    let gauge = match inflight::kind(&req) {
        inflight::Kind::ReadOnly => Some(&st.metrics.inflight_read_only),
        inflight::Kind::Mutating => Some(&st.metrics.inflight_mutating),
        inflight::Kind::LongRunning => None,
    };
    if let Some(g) = gauge {
        g.fetch_add(1, Ordering::Relaxed);
    }
    let started = Instant::now();
    let resp = next.run(req).await;
    if let Some(g) = gauge {
        g.fetch_sub(1, Ordering::Relaxed);
    }
    if let Some(labels) = labels {
        // Long-running requests have no meaningful latency (upstream leaves them out of
        // the SLO histograms).
        let seconds =
            (!matches!(labels.verb, "WATCH" | "CONNECT")).then(|| started.elapsed().as_secs_f64());
        st.metrics.record(labels, resp.status().as_u16(), seconds);
    }
    resp
}

/// Objects per resource, as upstream names them (`pods`, `deployments.apps`).
fn storage_objects(st: &SharedState) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for info in nodus_k8s::catalog::all() {
        if !info.verbs.contains(&"list") {
            continue;
        }
        let name = if info.group.is_empty() {
            info.plural.to_string()
        } else {
            format!("{}.{}", info.plural, info.group)
        };
        if out.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let n = st
            .store
            .list(&path::prefix(info, None))
            .map(|(items, _)| items.len())
            .unwrap_or(0);
        out.push((name, n));
    }
    out.sort();
    out
}

/// `GET /metrics`.
pub(crate) async fn handler(State(st): State<SharedState>) -> Response {
    let st2 = st.clone();
    let objects = tokio::task::spawn_blocking(move || storage_objects(&st2))
        .await
        .unwrap_or_default();
    let mut text = st.metrics.encode(&objects);
    st.store.metrics(&mut text);
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(prometheus::CONTENT_TYPE),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, uri: &str) -> Request {
        axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap()
    }

    #[test]
    fn requests_are_labelled_as_upstream() {
        let l = labels_of(&req("GET", "/api/v1/namespaces/default/pods")).unwrap();
        assert_eq!(
            (l.verb, l.scope, l.resource.as_str()),
            ("LIST", "namespace", "pods")
        );
        let l = labels_of(&req("GET", "/api/v1/pods?watch=true")).unwrap();
        assert_eq!((l.verb, l.scope), ("WATCH", "cluster"));
        let l = labels_of(&req(
            "POST",
            "/apis/apps/v1/namespaces/a/deployments?dryRun=All",
        ))
        .unwrap();
        assert_eq!(
            (l.verb, l.scope, l.group.as_str()),
            ("POST", "resource", "apps")
        );
        assert_eq!(l.dry_run, "All");
        let l = labels_of(&req("GET", "/api/v1/namespaces/a/pods/p/log")).unwrap();
        assert_eq!((l.verb, l.subresource.as_str()), ("GET", "log"));
        let l = labels_of(&req("POST", "/api/v1/namespaces/a/pods/p/exec")).unwrap();
        assert_eq!(l.verb, "CONNECT");
        assert!(labels_of(&req("GET", "/openapi/v2")).is_none());
    }

    #[test]
    fn encoding_counts_codes_and_fills_buckets() {
        let m = ApiMetrics::default();
        let l = labels_of(&req("GET", "/api/v1/nodes/n1")).unwrap();
        m.record(l.clone(), 200, Some(0.01));
        m.record(l.clone(), 404, Some(0.3));
        let out = m.encode(&[("pods".into(), 3)]);
        let labels = r#"component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="GET",version="v1""#;
        for line in [
            format!("apiserver_request_total{{code=\"200\",{labels}}} 1"),
            format!("apiserver_request_total{{code=\"404\",{labels}}} 1"),
            format!("apiserver_request_duration_seconds_bucket{{{labels},le=\"0.025\"}} 1"),
            format!("apiserver_request_duration_seconds_bucket{{{labels},le=\"0.4\"}} 2"),
            format!("apiserver_request_duration_seconds_count{{{labels}}} 2"),
            "apiserver_storage_objects{resource=\"pods\"} 3".to_string(),
            "apiserver_current_inflight_requests{request_kind=\"readOnly\"} 0".to_string(),
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
    }
}
