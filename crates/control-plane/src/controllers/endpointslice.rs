//! The EndpointSlice controller (and the legacy Endpoints beside it): keeps, for every
//! Service with a selector, the list of pods that back it and whether each can take
//! traffic — the list kube-proxy programs.
//!
//! Endpoints carry upstream's conditions: `ready` (pod Ready and not terminating),
//! `serving` (pod Ready, also while terminating) and `terminating`; plus `nodeName`, the
//! node's zone and a `targetRef` to the pod. Named target ports are resolved per pod, so
//! pods that resolve a name differently land in different slices (one slice per distinct
//! port list). Slices hold at most `max-endpoints-per-slice` (100) endpoints; an update
//! keeps endpoints in the slice they are in and fills gaps before creating slices, so a
//! change to one pod rewrites one slice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::apiserver::rest::now_rfc3339;
use crate::apiserver::state::ApiState;
use crate::controllers::cache::{Cache, Change, Index};
use crate::controllers::controller_utils::pod_ready;
use crate::controllers::objects;
use crate::storage::{EventKind, StoreError};

pub const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
pub const SERVICE_NAME: &str = "kubernetes.io/service-name";

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

use crate::apiserver::rest::list::labels_of as labels;

fn selector(svc: &Value) -> Option<BTreeMap<String, String>> {
    let m = svc.pointer("/spec/selector")?.as_object()?;
    if m.is_empty() {
        return None;
    }
    Some(
        m.iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
    )
}

fn selects(sel: &BTreeMap<String, String>, l: &BTreeMap<String, String>) -> bool {
    sel.iter().all(|(k, v)| l.get(k) == Some(v))
}

/// The pod's IPv4 address, if it has one yet.
fn pod_ipv4(p: &Value) -> Option<String> {
    let mut ips: Vec<String> = p
        .pointer("/status/podIPs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x["ip"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if ips.is_empty() && !s(p, "/status/podIP").is_empty() {
        ips.push(s(p, "/status/podIP").to_string());
    }
    ips.into_iter()
        .find(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
}

/// The service's ports as this pod serves them; a named target port the pod does not
/// declare is left out for that pod, as upstream.
fn ports_for(svc: &Value, pod: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for sp in svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let protocol = sp.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
        let port = match sp.get("targetPort") {
            Some(Value::Number(n)) => n.as_i64(),
            Some(Value::String(name)) => match name.parse::<i64>() {
                Ok(n) => Some(n),
                Err(_) => pod
                    .pointer("/spec/containers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .flat_map(|c| {
                        c.get("ports")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                    })
                    .find(|cp| {
                        cp["name"] == name.as_str()
                            && cp.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                                == protocol
                    })
                    .and_then(|cp| cp["containerPort"].as_i64()),
            },
            _ => sp.get("port").and_then(Value::as_i64),
        };
        let Some(port) = port else { continue };
        let mut p = json!({"name": sp.get("name").and_then(Value::as_str).unwrap_or(""), "port": port, "protocol": protocol});
        if let Some(ap) = sp.get("appProtocol") {
            p["appProtocol"] = ap.clone();
        }
        out.push(p);
    }
    out
}

/// One endpoint for a pod, or None when the pod does not belong in the service's slices.
fn endpoint_for(svc: &Value, pod: &Value, zones: &HashMap<String, String>) -> Option<Value> {
    if matches!(s(pod, "/status/phase"), "Succeeded" | "Failed") {
        return None;
    }
    let ip = pod_ipv4(pod)?;
    let publish = svc
        .pointer("/spec/publishNotReadyAddresses")
        .and_then(Value::as_bool)
        == Some(true);
    let terminating = pod.pointer("/metadata/deletionTimestamp").is_some();
    let ready = pod_ready(pod);
    let mut ep = json!({
        "addresses": [ip],
        "conditions": {
            "ready": publish || (ready && !terminating),
            "serving": publish || ready,
            "terminating": terminating,
        },
        "targetRef": {"kind": "Pod", "namespace": s(pod, "/metadata/namespace"), "name": s(pod, "/metadata/name"), "uid": s(pod, "/metadata/uid")},
    });
    let node = s(pod, "/spec/nodeName");
    if !node.is_empty() {
        ep["nodeName"] = json!(node);
        if let Some(z) = zones.get(node) {
            ep["zone"] = json!(z);
        }
    }
    let hostname = s(pod, "/spec/hostname");
    if !hostname.is_empty() && s(pod, "/spec/subdomain") == s(svc, "/metadata/name") {
        ep["hostname"] = json!(hostname);
    }
    Some(ep)
}

/// A legacy Endpoints subset in the making: (ports, ready addresses, not-ready addresses).
type LegacySubset = (Vec<Value>, Vec<Value>, Vec<Value>);

/// A slice being filled: (its storage key when it exists, endpoints, its current object).
type Slot = (Option<String>, Vec<Value>, Option<Arc<Value>>);

fn ep_addr(ep: &Value) -> String {
    ep.pointer("/addresses/0")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

pub struct EndpointSliceController {
    st: Arc<ApiState>,
    max_per_slice: usize,
}

impl EndpointSliceController {
    fn managed_slices<'a>(
        &self,
        slices: &'a Cache,
        ns: &str,
        svc: &str,
    ) -> Vec<(&'a String, &'a Arc<Value>)> {
        slices
            .by_index(Index::Namespace, ns)
            .filter(|(_, v)| {
                s(
                    v,
                    &format!("/metadata/labels/{}", SERVICE_NAME.replace('/', "~1")),
                ) == svc
                    && s(
                        v,
                        &format!("/metadata/labels/{}", MANAGED_BY.replace('/', "~1")),
                    ) == CONTROLLER_NAME
            })
            .collect()
    }

    /// Brings the slices (and the Endpoints object) of the service `ns/name` up to date.
    fn sync(
        &self,
        ns: &str,
        name: &str,
        svc: Option<&Arc<Value>>,
        pods: &[&Arc<Value>],
        slices: &Cache,
        zones: &HashMap<String, String>,
    ) {
        let existing = self.managed_slices(slices, ns, name);
        let svc = svc.filter(|v| v.pointer("/metadata/deletionTimestamp").is_none());
        let Some(svc) = svc else {
            for (k, _) in existing {
                let _ = self.st.store.delete(k, None);
            }
            return;
        };
        let Some(sel) = selector(svc) else { return };
        if s(svc, "/spec/type") == "ExternalName" {
            return;
        }
        // Desired endpoints, grouped by the port list they serve.
        let mut groups: BTreeMap<String, (Vec<Value>, Vec<Value>)> = BTreeMap::new();
        let mut legacy: BTreeMap<String, LegacySubset> = BTreeMap::new();
        for pod in pods.iter().filter(|p| selects(&sel, &labels(p))) {
            let Some(ep) = endpoint_for(svc, pod, zones) else {
                continue;
            };
            let ports = ports_for(svc, pod);
            let gk = serde_json::to_string(&ports).unwrap_or_default();
            // Legacy Endpoints leave terminating pods out unless publishNotReadyAddresses.
            if !ep["conditions"]["terminating"].as_bool().unwrap_or(false)
                || ep["conditions"]["ready"] == true
            {
                let addr = json!({"ip": ep_addr(&ep), "targetRef": ep["targetRef"], "nodeName": ep.get("nodeName").cloned().unwrap_or(Value::Null)});
                let l = legacy
                    .entry(gk.clone())
                    .or_insert_with(|| (ports.clone(), Vec::new(), Vec::new()));
                if ep["conditions"]["ready"] == true {
                    l.1.push(addr)
                } else {
                    l.2.push(addr)
                }
            }
            groups
                .entry(gk)
                .or_insert_with(|| (ports, Vec::new()))
                .1
                .push(ep);
        }
        self.sync_legacy(ns, name, svc, legacy);

        let owner = json!([{"apiVersion": "v1", "kind": "Service", "name": name, "uid": s(svc, "/metadata/uid"), "controller": true, "blockOwnerDeletion": true}]);
        let mut slice_labels = svc
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or_else(|| json!({}));
        slice_labels[SERVICE_NAME] = json!(name);
        slice_labels[MANAGED_BY] = json!(CONTROLLER_NAME);
        let now = now_rfc3339();
        let mut used: HashSet<&String> = HashSet::new();
        let mut writes: Vec<(Option<String>, Value)> = Vec::new();
        let mut by_ports: HashMap<String, Vec<(&String, &Arc<Value>)>> = HashMap::new();
        for (k, v) in &existing {
            if s(v, "/addressType") != "IPv4" {
                continue;
            }
            let p =
                serde_json::to_string(v.get("ports").unwrap_or(&Value::Null)).unwrap_or_default();
            let p = if p == "null" { "[]".to_string() } else { p };
            by_ports.entry(p).or_default().push((k, v));
        }
        if groups.is_empty() {
            // A service with no endpoints keeps one empty placeholder slice, as upstream.
            groups.insert("[]".into(), (Vec::new(), Vec::new()));
        }
        for (gk, (ports, mut desired)) in groups {
            desired.sort_by_key(ep_addr);
            let mut want: BTreeMap<String, Value> =
                desired.into_iter().map(|e| (ep_addr(&e), e)).collect();
            let mut slots: Vec<Slot> = Vec::new();
            for (k, v) in by_ports.remove(&gk).unwrap_or_default() {
                used.insert(k);
                // Keep the endpoints still wanted where they are, with fresh values.
                let kept: Vec<Value> = v
                    .get("endpoints")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|e| want.remove(&ep_addr(e)))
                    .collect();
                slots.push((Some(k.clone()), kept, Some(v.clone())));
            }
            // New endpoints fill the slices with room, then new slices.
            let mut rest: Vec<Value> = want.into_values().collect();
            for slot in slots.iter_mut() {
                while slot.1.len() < self.max_per_slice && !rest.is_empty() {
                    slot.1.push(rest.remove(0));
                }
            }
            for chunk in rest.chunks(self.max_per_slice) {
                slots.push((None, chunk.to_vec(), None));
            }
            if slots.is_empty() {
                slots.push((None, Vec::new(), None));
            }
            // Empty slices go, but one slice always remains for the group.
            let nonempty = slots.iter().filter(|s| !s.1.is_empty()).count();
            let mut kept_empty = nonempty > 0;
            for (key, eps, old) in slots {
                if eps.is_empty() && gk != "[]" {
                    if let Some(k) = key {
                        let _ = self.st.store.delete(&k, None);
                    }
                    continue;
                }
                if eps.is_empty() {
                    if kept_empty {
                        if let Some(k) = key {
                            let _ = self.st.store.delete(&k, None);
                        }
                        continue;
                    }
                    kept_empty = true;
                }
                let body = json!({
                    "addressType": "IPv4",
                    "endpoints": eps,
                    "ports": if gk == "[]" && ports.is_empty() { Value::Null } else { json!(ports) },
                });
                let unchanged = old.as_ref().is_some_and(|o| {
                    o.get("endpoints") == body.get("endpoints")
                        && o.get("ports").unwrap_or(&Value::Null) == &body["ports"]
                        && o.pointer("/metadata/labels") == Some(&slice_labels)
                });
                if !unchanged {
                    writes.push((key, body));
                }
            }
        }
        // Slices whose port list no longer exists.
        for (k, _) in &existing {
            if !used.contains(k) {
                let _ = self.st.store.delete(k, None);
            }
        }
        for (key, body) in writes {
            let res = match key {
                Some(k) => objects::modify(&self.st, &k, &mut |o| {
                    o["endpoints"] = body["endpoints"].clone();
                    o["ports"] = body["ports"].clone();
                    o["metadata"]["labels"] = slice_labels.clone();
                    o["metadata"]["annotations"]["endpoints.kubernetes.io/last-change-trigger-time"] = json!(now);
                    true
                })
                .map(|_| ()),
                None => {
                    let mut obj = body.clone();
                    obj["metadata"] = json!({"generateName": format!("{name}-"), "labels": slice_labels,
                        "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": now}, "ownerReferences": owner});
                    objects::create(&self.st, "discovery.k8s.io", "endpointslices", Some(ns), obj).map(|_| ())
                }
            };
            if let Err(e) = res {
                tracing::warn!(service = %format!("{ns}/{name}"), error = %e, "endpointslice: write failed");
            }
        }
    }

    /// The legacy `v1/Endpoints` object (what `kubectl get endpoints` shows).
    fn sync_legacy(
        &self,
        ns: &str,
        name: &str,
        svc: &Value,
        groups: BTreeMap<String, LegacySubset>,
    ) {
        let subsets: Vec<Value> = groups
            .into_values()
            .filter(|(_, r, n)| !r.is_empty() || !n.is_empty())
            .map(|(ports, mut ready, mut not_ready)| {
                ready.sort_by(|a, b| a["ip"].as_str().cmp(&b["ip"].as_str()));
                not_ready.sort_by(|a, b| a["ip"].as_str().cmp(&b["ip"].as_str()));
                let ports: Vec<Value> = ports
                    .into_iter()
                    .map(|mut p| {
                        if p["name"] == ""
                            && let Some(o) = p.as_object_mut()
                        {
                            o.remove("name");
                        }
                        p
                    })
                    .collect();
                let mut ss = json!({"ports": ports});
                if !ready.is_empty() {
                    ss["addresses"] = json!(ready);
                }
                if !not_ready.is_empty() {
                    ss["notReadyAddresses"] = json!(not_ready);
                }
                ss
            })
            .collect();
        let key = objects::key_of("", "endpoints", Some(ns), name);
        let labels = svc
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or(Value::Null);
        let changed = objects::modify(&self.st, &key, &mut |o| {
            if o.get("subsets").cloned().unwrap_or(json!([])) == json!(subsets)
                && o.pointer("/metadata/labels").unwrap_or(&Value::Null) == &labels
            {
                return false;
            }
            o["subsets"] = json!(subsets);
            o["metadata"]["labels"] = labels.clone();
            true
        });
        if let Ok(None) = changed
            && self.st.store.get(&key).ok().flatten().is_none()
        {
            let obj = json!({"metadata": {"name": name, "labels": labels}, "subsets": subsets});
            match objects::create(&self.st, "", "endpoints", Some(ns), obj) {
                Ok(_) | Err(StoreError::AlreadyExists(_)) => {}
                Err(e) => {
                    tracing::warn!(service = %format!("{ns}/{name}"), error = %e, "endpoints: create failed")
                }
            }
        }
    }
}

fn ns_name(key: &str) -> Option<(String, String)> {
    let mut it = key.trim_start_matches('/').split('/').skip(2);
    Some((it.next()?.to_string(), it.next()?.to_string()))
}

pub async fn run(st: Arc<ApiState>, max_per_slice: usize) {
    let mut services = Cache::new(st.store.clone(), "/core/services/");
    let mut pods = Cache::new(st.store.clone(), "/core/pods/").with_index(Index::Namespace);
    let mut nodes = Cache::new(st.store.clone(), "/core/nodes/");
    let mut slices = Cache::new(st.store.clone(), "/discovery.k8s.io/endpointslices/")
        .with_index(Index::Namespace);
    let ctl = EndpointSliceController {
        st: st.clone(),
        max_per_slice: max_per_slice.max(1),
    };
    let mut dirty: HashSet<(String, String)> =
        services.objects.keys().filter_map(|k| ns_name(k)).collect();
    let mut all = false;
    loop {
        if dirty.is_empty() && !all {
            tokio::select! {
                c = services.next() => note_service(c, &mut dirty, &mut all),
                c = pods.next() => note_pod(c, &services, &mut dirty, &mut all),
                c = nodes.next() => note_node(c, &mut all),
                c = slices.next() => note_slice(c, &mut dirty, &mut all),
            }
        }
        while let Some(c) = services.try_next() {
            note_service(c, &mut dirty, &mut all)
        }
        while let Some(c) = pods.try_next() {
            note_pod(c, &services, &mut dirty, &mut all)
        }
        while let Some(c) = nodes.try_next() {
            note_node(c, &mut all)
        }
        while let Some(c) = slices.try_next() {
            note_slice(c, &mut dirty, &mut all)
        }
        if all {
            dirty.extend(services.objects.keys().filter_map(|k| ns_name(k)));
            all = false;
        }
        let zones: HashMap<String, String> = nodes
            .objects
            .values()
            .filter_map(|n| {
                let z = n
                    .pointer("/metadata/labels/topology.kubernetes.io~1zone")?
                    .as_str()?;
                Some((s(n, "/metadata/name").to_string(), z.to_string()))
            })
            .collect();
        let namespaces: HashSet<String> = dirty.iter().map(|(n, _)| n.clone()).collect();
        let by_ns: HashMap<&str, Vec<&Arc<Value>>> = namespaces
            .iter()
            .map(String::as_str)
            .map(|ns| {
                (
                    ns,
                    pods.by_index(Index::Namespace, ns)
                        .map(|(_, p)| p)
                        .collect(),
                )
            })
            .collect();
        for (ns, name) in dirty.drain() {
            let svc = services.get(&format!("/core/services/{ns}/{name}"));
            let pods_ns = by_ns.get(ns.as_str()).map(Vec::as_slice).unwrap_or(&[]);
            ctl.sync(&ns, &name, svc, pods_ns, &slices, &zones);
            // Our own writes come back as slice events; take them in now so the next sync
            // of this service sees them.
            while let Some(c) = slices.try_next() {
                if let Change::Relisted = c {
                    all = true;
                }
            }
        }
    }
}

fn note_service(c: Change, dirty: &mut HashSet<(String, String)>, all: &mut bool) {
    match c {
        Change::Event(ev) => dirty.extend(ns_name(&ev.key)),
        Change::Relisted => *all = true,
    }
}

fn note_pod(c: Change, services: &Cache, dirty: &mut HashSet<(String, String)>, all: &mut bool) {
    let ev = match c {
        Change::Event(ev) => ev,
        Change::Relisted => {
            *all = true;
            return;
        }
    };
    // Only changes that matter to an endpoint: labels, IP, readiness, deletion, phase, node.
    if ev.kind == EventKind::Modified
        && let Some(prev) = &ev.prev
    {
        let facts = |p: &Value| {
            (
                labels(p),
                pod_ipv4(p),
                pod_ready(p),
                p.pointer("/metadata/deletionTimestamp").is_some(),
                s(p, "/status/phase").to_string(),
                s(p, "/spec/nodeName").to_string(),
            )
        };
        if facts(prev) == facts(&ev.object) {
            return;
        }
    }
    let ns = s(&ev.object, "/metadata/namespace");
    let mut ls = vec![labels(&ev.object)];
    if let Some(p) = &ev.prev {
        ls.push(labels(p));
    }
    let prefix = format!("/core/services/{ns}/");
    for (k, svc) in services
        .objects
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
    {
        if let Some(sel) = selector(svc)
            && ls.iter().any(|l| selects(&sel, l))
        {
            dirty.extend(ns_name(k));
        }
    }
}

fn note_node(c: Change, all: &mut bool) {
    match c {
        Change::Event(ev) => {
            let zone = |v: &Value| {
                v.pointer("/metadata/labels/topology.kubernetes.io~1zone")
                    .cloned()
            };
            if ev.kind != EventKind::Modified
                || ev.prev.as_ref().map(|p| zone(p)) != Some(zone(&ev.object))
            {
                *all = true;
            }
        }
        Change::Relisted => *all = true,
    }
}

fn note_slice(c: Change, dirty: &mut HashSet<(String, String)>, all: &mut bool) {
    match c {
        Change::Event(ev) => {
            let o = &ev.object;
            if s(
                o,
                &format!("/metadata/labels/{}", MANAGED_BY.replace('/', "~1")),
            ) == CONTROLLER_NAME
            {
                let svc = s(
                    o,
                    &format!("/metadata/labels/{}", SERVICE_NAME.replace('/', "~1")),
                );
                // Only someone else's change (or a deletion) needs repair; ours are in sync.
                if ev.kind == EventKind::Deleted || ev.kind == EventKind::Modified {
                    dirty.insert((s(o, "/metadata/namespace").to_string(), svc.to_string()));
                }
            }
        }
        Change::Relisted => *all = true,
    }
}
