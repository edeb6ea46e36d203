//! `metrics.k8s.io/v1beta1` (NodeMetrics, PodMetrics), served as metrics-server serves it:
//! every `--metric-resolution` (15 s) the API server scrapes each Ready node's kubelet
//! `/metrics/resource` over the kubelet client connection it proxies logs and exec with,
//! keeps the latest two samples per node, and answers `get`/`list` with CPU as the rate
//! between them (nanocores over the window) and memory as the latest working set. A pod
//! appears once each of its containers has two samples; objects carry the node's or pod's
//! labels, and label selectors apply to them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use nodus_k8s::catalog::ResourceInfo;
use nodus_k8s::quantity::{Format, ParsedQuantity};
use nodus_k8s::{selector, status};
use nodus_serving::prometheus::{self, Sample};
use serde_json::{Value, json};

use crate::apiserver::authn::User;
use crate::apiserver::authz::{self, Attributes};
use crate::apiserver::rest::{self, ApiError, ApiResult, list::labels_of, path, proxy};
use crate::apiserver::state::SharedState;

pub(crate) const GROUP: &str = "metrics.k8s.io";
pub(crate) const VERSION: &str = "v1beta1";

/// The two resources, for discovery and the authorizer (they are not stored).
pub(crate) static RESOURCES: [ResourceInfo; 2] = [
    ResourceInfo {
        group: GROUP,
        version: VERSION,
        kind: "NodeMetrics",
        plural: "nodes",
        singular: "",
        namespaced: false,
        short_names: &[],
        categories: &[],
        verbs: &["get", "list"],
        subresources: &[],
        custom: false,
    },
    ResourceInfo {
        group: GROUP,
        version: VERSION,
        kind: "PodMetrics",
        plural: "pods",
        singular: "",
        namespaced: true,
        short_names: &[],
        categories: &[],
        verbs: &["get", "list"],
        subresources: &[],
        custom: false,
    },
];

/// metrics-server's default `--metric-resolution` as its manifests set it.
pub(crate) const RESOLUTION: Duration = Duration::from_secs(15);
/// metrics-server's scrape timeout is a fraction of the resolution.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a kubelet's answer read.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// A cumulative CPU counter reading.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Cpu {
    seconds: f64,
    at_ms: i64,
}

/// One object's latest CPU and memory readings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Point {
    cpu: Option<Cpu>,
    memory: Option<f64>,
}

/// One scrape of a kubelet.
#[derive(Clone, Debug, Default)]
struct Batch {
    node: Point,
    /// (namespace, pod) → container → readings.
    pods: HashMap<(String, String), HashMap<String, Point>>,
}

impl Batch {
    fn from_samples(samples: &[Sample]) -> Batch {
        let mut b = Batch::default();
        for s in samples {
            let cpu = || {
                s.timestamp_ms.map(|at_ms| Cpu {
                    seconds: s.value,
                    at_ms,
                })
            };
            match s.name.as_str() {
                "node_cpu_usage_seconds_total" => b.node.cpu = cpu(),
                "node_memory_working_set_bytes" => b.node.memory = Some(s.value),
                "container_cpu_usage_seconds_total" => {
                    if let Some(p) = container(&mut b, s) {
                        p.cpu = cpu();
                    }
                }
                "container_memory_working_set_bytes" => {
                    if let Some(p) = container(&mut b, s) {
                        p.memory = Some(s.value);
                    }
                }
                _ => {}
            }
        }
        b
    }
}

/// The readings of the container a sample names.
fn container<'a>(b: &'a mut Batch, s: &Sample) -> Option<&'a mut Point> {
    let pod = (
        s.label("namespace")?.to_string(),
        s.label("pod")?.to_string(),
    );
    let name = s.label("container")?.to_string();
    Some(b.pods.entry(pod).or_default().entry(name).or_default())
}

/// CPU in nanocores between two readings, and the window; none when the counter went
/// back (a restarted container) or no time passed.
fn rate(prev: Cpu, latest: Cpu) -> Option<(u64, i64)> {
    let window = latest.at_ms - prev.at_ms;
    let used = latest.seconds - prev.seconds;
    if window <= 0 || used < 0.0 {
        return None;
    }
    Some(((used * 1e12 / window as f64).round() as u64, window))
}

/// The usage of one object: `cpu` (nanocores) and `memory` (bytes) quantities as
/// metrics-server writes them, with the latest reading's time and the window.
#[derive(Debug, PartialEq)]
struct Usage {
    nanocores: u64,
    memory: u64,
    at_ms: i64,
    window_ms: i64,
}

fn usage(prev: Option<&Point>, latest: &Point) -> Option<Usage> {
    let (p, l) = (prev?.cpu?, latest.cpu?);
    let (nanocores, window_ms) = rate(p, l)?;
    Some(Usage {
        nanocores,
        memory: latest.memory? as u64,
        at_ms: l.at_ms,
        window_ms,
    })
}

impl Usage {
    fn json(&self) -> Value {
        json!({
            "cpu": ParsedQuantity::from_nanos(i128::from(self.nanocores), Format::DecimalSI).canonical(),
            "memory": ParsedQuantity::from_nanos(i128::from(self.memory) * 1_000_000_000, Format::BinarySI).canonical(),
        })
    }
}

/// The latest two scrapes of a node.
#[derive(Default)]
struct NodeSamples {
    prev: Option<Batch>,
    latest: Batch,
}

/// What the scraper has read, per node.
#[derive(Default)]
pub struct Scraped {
    nodes: Mutex<HashMap<String, NodeSamples>>,
}

impl Scraped {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeSamples>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, node: &str, batch: Batch) {
        let mut m = self.lock();
        let e = m.entry(node.to_string()).or_default();
        e.prev = Some(std::mem::replace(&mut e.latest, batch));
    }

    /// Takes in one scrape of `node`'s `/metrics/resource`.
    pub fn ingest(&self, node: &str, text: &str) -> Result<(), prometheus::ParseError> {
        let samples = prometheus::parse(text)?;
        self.push(node, Batch::from_samples(&samples));
        Ok(())
    }

    /// How many pods of `node` have usage to report (for benchmarks).
    pub fn pods_with_usage(&self, node: &str) -> usize {
        let keys: Vec<(String, String)> = self
            .lock()
            .get(node)
            .map(|s| s.latest.pods.keys().cloned().collect())
            .unwrap_or_default();
        keys.iter()
            .filter(|(ns, pod)| self.pod_usage(node, ns, pod).is_some())
            .count()
    }

    fn node_usage(&self, node: &str) -> Option<Usage> {
        let m = self.lock();
        let s = m.get(node)?;
        usage(s.prev.as_ref().map(|b| &b.node), &s.latest.node)
    }

    /// The containers' usage of a pod, in name order; none unless every container has it.
    fn pod_usage(&self, node: &str, ns: &str, pod: &str) -> Option<Vec<(String, Usage)>> {
        let m = self.lock();
        let s = m.get(node)?;
        let prev = s.prev.as_ref()?;
        let key = (ns.to_string(), pod.to_string());
        let (latest, prev) = (s.latest.pods.get(&key)?, prev.pods.get(&key)?);
        let mut out: Vec<(String, Usage)> = Vec::new();
        for (name, point) in latest {
            out.push((name.clone(), usage(prev.get(name), point)?));
        }
        if out.is_empty() {
            return None;
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Some(out)
    }
}

fn is_ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Reads one kubelet's `/metrics/resource`.
async fn scrape(st: &SharedState, node: &Value) -> Result<Batch, String> {
    let (ip, port) = proxy::kubelet_address(node).ok_or("no address")?;
    let tls = st
        .kubelet_tls
        .clone()
        .ok_or("the API server has no kubelet client credentials")?;
    let get = async {
        let mut sender = proxy::connect(&ip, port, tls)
            .await
            .map_err(|e| e.to_string())?;
        let host = if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        };
        let req = http::Request::get("/metrics/resource")
            .header(http::header::HOST, host)
            .body(axum::body::Body::empty())
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let code = resp.status();
        let body = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), MAX_BODY)
            .await
            .map_err(|e| e.to_string())?;
        if !code.is_success() {
            return Err(format!("request failed, status: {code}"));
        }
        let text = std::str::from_utf8(&body).map_err(|e| e.to_string())?;
        let samples = prometheus::parse(text).map_err(|e| e.to_string())?;
        Ok::<_, String>(Batch::from_samples(&samples))
    };
    tokio::time::timeout(SCRAPE_TIMEOUT, get)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// One scrape cycle over every Ready node; nodes gone from the store are forgotten.
pub(crate) async fn scrape_all(st: &SharedState) {
    let nodes = match st.store.list("/core/nodes/") {
        Ok((items, _)) => items,
        Err(e) => {
            tracing::warn!(error = %e, "metrics: listing nodes failed");
            return;
        }
    };
    let names: Vec<String> = nodes
        .iter()
        .filter_map(|n| rest::meta_str(&n.object, "name").map(str::to_string))
        .collect();
    st.resource_metrics.lock().retain(|k, _| names.contains(k));
    let ready: Vec<&Value> = nodes
        .iter()
        .map(|n| n.object.as_ref())
        .filter(|n| is_ready(n))
        .collect();
    let results = futures::future::join_all(ready.iter().map(|n| scrape(st, n))).await;
    for (node, r) in ready.iter().zip(results) {
        let name = rest::meta_str(node, "name").unwrap_or_default();
        match r {
            Ok(b) => st.resource_metrics.push(name, b),
            Err(e) => {
                tracing::info!(node = name, error = %e, "metrics: scraping the kubelet failed")
            }
        }
    }
}

/// The scraper, as metrics-server's manager loop.
pub(crate) async fn run(st: SharedState) {
    let mut tick = tokio::time::interval(RESOLUTION);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        scrape_all(&st).await;
    }
}

fn rfc3339(ms: i64) -> Value {
    k8s_openapi::jiff::Timestamp::from_millisecond(ms)
        .map(|t| json!(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
        .unwrap_or(Value::Null)
}

fn metadata(obj: &Value) -> Value {
    let mut m = json!({
        "name": obj.pointer("/metadata/name"),
        "creationTimestamp": rest::now_rfc3339(),
    });
    if let Some(ns) = obj.pointer("/metadata/namespace") {
        m["namespace"] = ns.clone();
    }
    if let Some(l) = obj.pointer("/metadata/labels") {
        m["labels"] = l.clone();
    }
    m
}

fn window(ms: i64) -> String {
    nodus_k8s::duration::go_duration(Duration::from_millis(ms.max(0) as u64))
}

fn node_metrics(st: &SharedState, node: &Value) -> Option<Value> {
    let name = rest::meta_str(node, "name")?;
    let u = st.resource_metrics.node_usage(name)?;
    Some(json!({
        "kind": "NodeMetrics",
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": metadata(node),
        "timestamp": rfc3339(u.at_ms),
        "window": window(u.window_ms),
        "usage": u.json(),
    }))
}

fn pod_metrics(st: &SharedState, pod: &Value) -> Option<Value> {
    let node = pod.pointer("/spec/nodeName")?.as_str()?;
    let ns = rest::meta_str(pod, "namespace")?;
    let name = rest::meta_str(pod, "name")?;
    let containers = st.resource_metrics.pod_usage(node, ns, name)?;
    let at = containers.iter().map(|(_, u)| u.at_ms).max()?;
    let win = containers.iter().map(|(_, u)| u.window_ms).max()?;
    Some(json!({
        "kind": "PodMetrics",
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": metadata(pod),
        "timestamp": rfc3339(at),
        "window": window(win),
        "containers": containers.iter().map(|(n, u)| json!({"name": n, "usage": u.json()})).collect::<Vec<_>>(),
    }))
}

/// Whether `path` is one of the Metrics API's resource paths (which [`handle`] authorizes
/// as resources, not as non-resource URLs).
pub(crate) fn serves(path: &str) -> bool {
    path.starts_with("/apis/metrics.k8s.io/v1beta1/")
}

/// `/apis/metrics.k8s.io/v1beta1/...` requests; `None` for every other path.
pub(crate) fn handle(
    st: &SharedState,
    user: &User,
    method: &Method,
    uri: &Uri,
) -> Option<Response> {
    let rest_of = uri.path().strip_prefix("/apis/metrics.k8s.io/v1beta1/")?;
    let segs: Vec<&str> = rest_of.split('/').filter(|s| !s.is_empty()).collect();
    let (info, namespace, name) = match segs.as_slice() {
        ["nodes"] => (&RESOURCES[0], None, None),
        ["nodes", n] => (&RESOURCES[0], None, Some(*n)),
        ["pods"] => (&RESOURCES[1], None, None),
        ["namespaces", ns, "pods"] => (&RESOURCES[1], Some(*ns), None),
        ["namespaces", ns, "pods", n] => (&RESOURCES[1], Some(*ns), Some(*n)),
        _ => return Some(ApiError(rest::not_found_path()).into_response()),
    };
    let target = path::Target {
        info,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        sub: None,
        watch_path: false,
        rest: Vec::new(),
    };
    let r = serve(st, user, method, uri, &target).unwrap_or_else(|e| e.into_response());
    Some(r)
}

fn serve(
    st: &SharedState,
    user: &User,
    method: &Method,
    uri: &Uri,
    t: &path::Target,
) -> ApiResult<Response> {
    let query = nodus_serving::query::parse_query(uri.query());
    let verb = rest::verb_of(method, t, &query);
    let attrs = Attributes {
        verb,
        request: authz::Request::Served(t),
        body: None,
        field_selector: None,
    };
    st.authz
        .authorize(user, &attrs, st.store.as_ref())
        .map_err(|reason| ApiError(authz::forbidden(user, &attrs, &reason)))?;
    if !matches!(verb, "get" | "list") {
        return Err(ApiError(status::method_not_allowed(
            GROUP,
            t.info.plural,
            method.as_str(),
        )));
    }
    // The objects the metrics describe: nodes, or pods.
    let source = if t.info.kind == "NodeMetrics" {
        path::prefix(
            crate::controllers::objects::target("", "nodes", None)
                .ok_or_else(|| ApiError(status::internal("no nodes resource")))?
                .info,
            None,
        )
    } else {
        let pods = crate::controllers::objects::target("", "pods", t.namespace.as_deref())
            .ok_or_else(|| ApiError(status::internal("no pods resource")))?;
        pods.prefix()
    };
    let not_found = |name: &str| ApiError(status::not_found(GROUP, t.info.plural, name));
    if let Some(name) = &t.name {
        let key = format!("{source}{name}");
        let obj = st
            .store
            .get(&key)
            .map_err(crate::apiserver::rest::storage_failure)?
            .ok_or_else(|| not_found(name))?;
        let m = if t.info.kind == "NodeMetrics" {
            node_metrics(st, &obj.object)
        } else {
            pod_metrics(st, &obj.object)
        };
        return Ok(rest::json_response(
            200,
            &m.ok_or_else(|| not_found(name))?,
            &[],
        ));
    }
    let label = match query.get("labelSelector").filter(|s| !s.is_empty()) {
        Some(s) => Some(
            selector::parse_label_selector(s)
                .map_err(|e| ApiError(status::bad_request(&e.to_string())))?,
        ),
        None => None,
    };
    let (objs, _) = st
        .store
        .list(&source)
        .map_err(crate::apiserver::rest::storage_failure)?;
    let items: Vec<Value> = objs
        .iter()
        .filter(|o| {
            label
                .as_ref()
                .is_none_or(|l| l.matches(&labels_of(&o.object)))
        })
        .filter_map(|o| {
            if t.info.kind == "NodeMetrics" {
                node_metrics(st, &o.object)
            } else {
                pod_metrics(st, &o.object)
            }
        })
        .collect();
    let list = json!({
        "kind": format!("{}List", t.info.kind),
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": {},
        "items": items,
    });
    Ok(rest::json_response(200, &list, &[]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_the_rate_between_the_latest_two_scrapes() {
        let s = Scraped::default();
        s.ingest(
            "n1",
            concat!(
                "node_cpu_usage_seconds_total 100 1000000\n",
                "node_memory_working_set_bytes 1048576 1000000\n",
                "container_cpu_usage_seconds_total{container=\"app\",pod=\"web\",namespace=\"default\"} 1 1000000\n",
                "container_memory_working_set_bytes{container=\"app\",pod=\"web\",namespace=\"default\"} 4096 1000000\n",
            ),
        )
        .unwrap();
        // One scrape: no rate yet, as metrics-server.
        assert_eq!(s.node_usage("n1"), None);
        assert_eq!(s.pod_usage("n1", "default", "web"), None);
        s.ingest(
            "n1",
            concat!(
                "node_cpu_usage_seconds_total 103 1015000\n",
                "node_memory_working_set_bytes 2097152 1015000\n",
                "container_cpu_usage_seconds_total{container=\"app\",pod=\"web\",namespace=\"default\"} 1.15 1015000\n",
                "container_memory_working_set_bytes{container=\"app\",pod=\"web\",namespace=\"default\"} 8192 1015000\n",
            ),
        )
        .unwrap();
        let n = s.node_usage("n1").unwrap();
        // 3 core-seconds over 15 s: 200m.
        assert_eq!(n.nanocores, 200_000_000);
        assert_eq!(n.window_ms, 15_000);
        assert_eq!(n.json(), json!({"cpu": "200m", "memory": "2Mi"}));
        let p = s.pod_usage("n1", "default", "web").unwrap();
        assert_eq!(p[0].0, "app");
        assert_eq!(p[0].1.nanocores, 10_000_000);
        assert_eq!(p[0].1.json(), json!({"cpu": "10m", "memory": "8Ki"}));
        assert_eq!(window(p[0].1.window_ms), "15s");
    }

    #[test]
    fn a_counter_that_went_back_has_no_rate() {
        let a = Cpu {
            seconds: 5.0,
            at_ms: 0,
        };
        let b = Cpu {
            seconds: 1.0,
            at_ms: 15_000,
        };
        assert_eq!(rate(a, b), None);
        assert_eq!(rate(a, a), None);
    }
}
