//! The API server as the store: how kube-controller-manager and kube-scheduler run apart
//! from it, as upstream splits them — each with its own `--kubeconfig` and identity
//! (`system:kube-controller-manager`, `system:kube-scheduler`), reaching the objects only
//! through the REST API, never etcd.
//!
//! A storage key (`/<group>/<plural>/[<ns>/]<name>`) names a resource of the catalogue, so
//! every [`Store`] call becomes what client-go would send: a read is a GET, a list one GET
//! per resource, a watch `?watch=1` from the list's resourceVersion (with bookmarks, and
//! resumed from the last one seen when the server ends it), a create a POST. A
//! read-modify-write is a GET, the caller's function and the write the REST API has for
//! what changed: the main resource's PUT, `/status` for status, `pods/binding` for a node
//! chosen by the scheduler, `namespaces/finalize` for a namespace's spec.finalizers. A
//! conflict re-reads and runs the function again, as `retry.RetryOnConflict` does.
//! Deleting ([`RestStore::delete_object`]) and creating as a client go through the server's
//! own graceful deletion and admission.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use kube::core::WatchEvent;
use nodus_k8s::catalog::{self, ResourceInfo};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::bridge::Bridge;
use super::{Event, EventKind, MutateOutcome, Mutation, Store, StoreError, Stored};

/// How long one watch request lasts before it is resumed (below kube-rs's read timeout).
const WATCH_SECONDS: u32 = 240;
/// How many times a write is retried after a conflict before giving up.
const CONFLICT_RETRIES: usize = 16;

/// A [`Store`] that is the API server named by a kubeconfig.
pub struct RestStore {
    client: kube::Client,
    bridge: Bridge,
    server: String,
}

/// One resource as a key names it.
#[derive(Clone, Debug)]
struct Resource {
    info: &'static ResourceInfo,
}

impl Resource {
    fn base(&self) -> String {
        match self.info.group {
            "" => format!("/api/{}", self.info.version),
            g => format!("/apis/{g}/{}", self.info.version),
        }
    }

    fn collection(&self, ns: Option<&str>) -> String {
        match (self.info.namespaced, ns) {
            (true, Some(ns)) => format!("{}/namespaces/{ns}/{}", self.base(), self.info.plural),
            _ => format!("{}/{}", self.base(), self.info.plural),
        }
    }

    fn object(&self, ns: Option<&str>, name: &str) -> String {
        format!("{}/{name}", self.collection(ns))
    }

    fn has_status(&self) -> bool {
        self.info.subresources.contains(&"status")
    }

    fn key(&self, obj: &Value) -> String {
        let meta = |f: &str| obj.pointer(f).and_then(Value::as_str);
        crate::apiserver::rest::path::key(
            self.info,
            meta("/metadata/namespace"),
            meta("/metadata/name").unwrap_or(""),
        )
    }
}

/// The resource of `/<group>/<plural>`: the first catalogue entry (its preferred version),
/// custom resources included once the CRD registry has seen them.
fn resource(storage_group: &str, plural: &str) -> Option<Resource> {
    let group = if storage_group == "core" {
        ""
    } else {
        storage_group
    };
    catalog::served()
        .into_iter()
        .find(|i| i.group == group && i.plural == plural)
        .map(|info| Resource { info })
}

/// What a key or prefix names: resources, a namespace, a name.
struct Scope {
    resources: Vec<Resource>,
    namespace: Option<String>,
    name: Option<String>,
}

fn scope(prefix: &str) -> Result<Scope, StoreError> {
    let collection = prefix.ends_with('/');
    let parts: Vec<&str> = prefix.split('/').filter(|s| !s.is_empty()).collect();
    let unknown = || StoreError::Backend(format!("no API resource stores the keys under {prefix}"));
    let Some((g, rest)) = parts.split_first() else {
        // Everything: each resource that can be listed and watched.
        let resources = catalog::served()
            .into_iter()
            .filter(|i| i.verbs.contains(&"list") && i.verbs.contains(&"watch"))
            .filter(|i| i.group != "events.k8s.io")
            .fold(Vec::<Resource>::new(), |mut v, info| {
                if !v
                    .iter()
                    .any(|r| r.info.group == info.group && r.info.plural == info.plural)
                {
                    v.push(Resource { info });
                }
                v
            });
        return Ok(Scope {
            resources,
            namespace: None,
            name: None,
        });
    };
    let Some((plural, rest)) = rest.split_first() else {
        return Err(unknown());
    };
    let r = resource(g, plural).ok_or_else(unknown)?;
    let (namespace, name) = match (r.info.namespaced, rest, collection) {
        (_, [], _) => (None, None),
        (true, [ns], true) => (Some(ns.to_string()), None),
        (true, [ns, name], false) => (Some(ns.to_string()), Some(name.to_string())),
        (false, [name], false) => (None, Some(name.to_string())),
        _ => return Err(unknown()),
    };
    Ok(Scope {
        resources: vec![r],
        namespace,
        name,
    })
}

/// The one object a key names.
fn object_of(key: &str) -> Result<(Resource, Option<String>, String), StoreError> {
    let s = scope(key)?;
    match (s.resources.into_iter().next(), s.name) {
        (Some(r), Some(name)) => Ok((r, s.namespace, name)),
        _ => Err(StoreError::Backend(format!("{key} names no single object"))),
    }
}

fn revision_of(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The API's refusal as the store's error: the kinds callers act on by their own variant,
/// anything else with the server's Status kept for the caller to pass on.
fn api_error(key: &str, e: kube::Error) -> StoreError {
    let kube::Error::Api(s) = e else {
        return StoreError::Unavailable(format!("the API server: {e}"));
    };
    match (s.code, s.reason.as_str()) {
        (404, _) => StoreError::NotFound(key.to_string()),
        (409, "AlreadyExists") => StoreError::AlreadyExists(key.to_string()),
        (409, "Conflict") => StoreError::Conflict {
            key: key.to_string(),
            current: 0,
        },
        (410, _) => StoreError::Compacted {
            requested: 0,
            oldest: 0,
        },
        (429 | 503, _) => StoreError::Unavailable(s.message.clone()),
        (504, _) => StoreError::Timeout,
        _ => {
            let mut v = serde_json::to_value(&*s).unwrap_or_default();
            v["kind"] = json!("Status");
            v["apiVersion"] = json!("v1");
            v["status"] = json!("Failure");
            StoreError::Refused(Box::new(v))
        }
    }
}

fn request(method: http::Method, uri: &str, body: Option<&Value>) -> http::Request<Vec<u8>> {
    let body = body
        .map(|b| serde_json::to_vec(b).unwrap_or_default())
        .unwrap_or_default();
    let mut req = http::Request::builder().method(method).uri(uri);
    if !body.is_empty() {
        req = req.header(http::header::CONTENT_TYPE, "application/json");
    }
    req.body(body).unwrap_or_default()
}

/// The object as stored, with the kind and apiVersion a list's items leave out.
fn stored(r: &Resource, mut obj: Value) -> Stored {
    if obj.get("kind").is_none_or(Value::is_null) {
        obj["kind"] = json!(r.info.kind);
        obj["apiVersion"] = json!(r.info.gvk().api_version());
    }
    Stored {
        key: r.key(&obj),
        revision: revision_of(&obj),
        object: Arc::new(obj),
    }
}

/// `obj` without its status, for telling whether the main resource changed.
fn main_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("status");
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
            meta.remove("managedFields");
        }
    }
    o
}

impl RestStore {
    /// A store that is the API server of the kubeconfig at `path` (its current context),
    /// once it answers; waits up to `wait` for it, as a component started beside the API
    /// server in its static pod does.
    pub fn connect(path: &std::path::Path, wait: Duration) -> Result<RestStore, StoreError> {
        let bridge = Bridge::new("apiserver-client", Duration::from_secs(60))?;
        let shown = path.display().to_string();
        let p = path.to_path_buf();
        let (client, server) = bridge.run(async move {
            let kc = kube::config::Kubeconfig::read_from(&p)
                .map_err(|e| StoreError::Backend(format!("kubeconfig {shown}: {e}")))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| StoreError::Backend(format!("kubeconfig {shown}: {e}")))?;
            let server = cfg.cluster_url.to_string();
            let client = kube::Client::try_from(cfg)
                .map_err(|e| StoreError::Backend(format!("kubeconfig {shown}: {e}")))?;
            Ok((client, server))
        })?;
        let store = RestStore {
            client,
            bridge,
            server,
        };
        let deadline = std::time::Instant::now() + wait;
        loop {
            match store.revision_now() {
                Ok(_) => return Ok(store),
                Err(StoreError::Unavailable(why)) if std::time::Instant::now() < deadline => {
                    tracing::info!(server = %store.server, reason = %why, "waiting for the API server");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    fn call(&self, key: &str, req: http::Request<Vec<u8>>) -> Result<Value, StoreError> {
        let client = self.client.clone();
        let key = key.to_string();
        self.bridge.run(async move {
            let text = client
                .request_text(req)
                .await
                .map_err(|e| api_error(&key, e))?;
            serde_json::from_str(&text).map_err(|e| StoreError::Corrupt {
                key,
                err: e.to_string(),
            })
        })
    }

    /// The newest resourceVersion: a one-item list's.
    fn revision_now(&self) -> Result<u64, StoreError> {
        let list = self.call(
            "/core/namespaces/",
            request(http::Method::GET, "/api/v1/namespaces?limit=1", None),
        )?;
        Ok(revision_of(&list))
    }

    fn list_one(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> Result<(Vec<Stored>, u64), StoreError> {
        let mut uri = r.collection(ns);
        if let Some(n) = name {
            uri.push_str(&format!("?fieldSelector=metadata.name%3D{n}"));
        }
        let list = self.call(&uri, request(http::Method::GET, &uri, None))?;
        let rev = revision_of(&list);
        let items = match list.get("items") {
            Some(Value::Array(items)) => items.iter().map(|o| stored(r, o.clone())).collect(),
            _ => Vec::new(),
        };
        Ok((items, rev))
    }

    /// A write of `new` over `cur`, each changed part through its own endpoint.
    fn write(&self, key: &str, cur: &Stored, mut new: Value) -> Result<Option<Stored>, StoreError> {
        let (r, ns, name) = object_of(key)?;
        let ns = ns.as_deref();
        let url = r.object(ns, &name);
        let old = &*cur.object;
        let mut latest: Option<Value> = None;
        let node = |o: &Value| {
            o.pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        if r.info.kind == "Pod" && node(old).is_empty() && !node(&new).is_empty() {
            // The scheduler's choice: only pods/binding may set spec.nodeName.
            let binding = json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": ns, "uid": old.pointer("/metadata/uid")},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node(&new)},
            });
            self.call(
                key,
                request(
                    http::Method::POST,
                    &format!("{url}/binding"),
                    Some(&binding),
                ),
            )?;
            let fresh = self.call(key, request(http::Method::GET, &url, None))?;
            new["metadata"]["resourceVersion"] = fresh["metadata"]["resourceVersion"].clone();
            if old.get("status") == new.get("status") {
                new["status"] = fresh.get("status").cloned().unwrap_or(Value::Null);
            }
            latest = Some(fresh);
        }
        let base = latest.as_ref().unwrap_or(old);
        if r.info.kind == "Namespace"
            && base.pointer("/spec/finalizers") != new.pointer("/spec/finalizers")
        {
            let out = self.call(
                key,
                request(http::Method::PUT, &format!("{url}/finalize"), Some(&new)),
            )?;
            new["metadata"]["resourceVersion"] = out["metadata"]["resourceVersion"].clone();
            latest = Some(out);
        }
        let base = latest.as_ref().unwrap_or(old);
        let status_changed = r.has_status() && base.get("status") != new.get("status");
        if main_part(base) != main_part(&new) || !r.has_status() {
            let out = self.call(key, request(http::Method::PUT, &url, Some(&new)))?;
            new["metadata"]["resourceVersion"] = out["metadata"]["resourceVersion"].clone();
            latest = Some(out);
        }
        if status_changed {
            match self.call(
                key,
                request(http::Method::PUT, &format!("{url}/status"), Some(&new)),
            ) {
                Ok(out) => latest = Some(out),
                // The main write finished a deletion (its last finalizer gone).
                Err(StoreError::NotFound(_)) if latest.is_some() => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(stored(&r, latest.unwrap_or_else(|| old.clone()))))
    }

    /// DELETE with the caller's options, through the server's graceful deletion,
    /// finalizers and propagation: what a client's delete does, and what the controllers'
    /// deletes mean. Returns the server's answer (the object, or a Status).
    pub fn delete_object(
        &self,
        info: &'static ResourceInfo,
        ns: Option<&str>,
        name: &str,
        options: Value,
    ) -> Result<Value, StoreError> {
        let r = Resource { info };
        let url = r.object(ns, name);
        self.call(&url, request(http::Method::DELETE, &url, Some(&options)))
    }

    /// POST of `obj` at `key`'s collection: the server's defaulting, admission and
    /// validation decide, and its Status comes back on a refusal.
    fn post(&self, key: &str, obj: &Value) -> Result<Stored, StoreError> {
        let (r, ns, _) = object_of(key)?;
        let mut body = obj.clone();
        if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        let url = r.collection(ns.as_deref());
        let out = self.call(key, request(http::Method::POST, &url, Some(&body)))?;
        // Controllers create some objects with their status (the POST drops it).
        let wanted = obj
            .get("status")
            .filter(|s| !s.is_null() && **s != json!({}));
        if r.has_status()
            && let Some(s) = wanted
            && out.get("status") != Some(s)
        {
            let mut with = out.clone();
            with["status"] = s.clone();
            let name = out
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let url = format!("{}/status", r.object(ns.as_deref(), name));
            if let Ok(o) = self.call(key, request(http::Method::PUT, &url, Some(&with))) {
                return Ok(stored(&r, o));
            }
        }
        Ok(stored(&r, out))
    }
}

impl Store for RestStore {
    fn get(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        let (r, ns, name) = object_of(key)?;
        match self.call(
            key,
            request(http::Method::GET, &r.object(ns.as_deref(), &name), None),
        ) {
            Ok(o) => Ok(Some(stored(&r, o))),
            Err(StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn list(&self, prefix: &str) -> Result<(Vec<Stored>, u64), StoreError> {
        let s = scope(prefix)?;
        let mut all = Vec::new();
        // Resources are read one after another: a watch from the oldest list's revision
        // misses nothing (what it replays again, an informer applies again).
        let mut rev = u64::MAX;
        for r in &s.resources {
            match self.list_one(r, s.namespace.as_deref(), s.name.as_deref()) {
                Ok((items, at)) => {
                    all.extend(items);
                    rev = rev.min(at);
                }
                // A resource the identity may not read, or one gone from discovery,
                // leaves the rest of an everything-list intact.
                Err(StoreError::Refused(_) | StoreError::NotFound(_)) if s.resources.len() > 1 => {}
                Err(e) => return Err(e),
            }
        }
        if rev == u64::MAX {
            rev = self.revision_now()?;
        }
        all.sort_by(|a, b| a.key.cmp(&b.key));
        Ok((all, rev))
    }

    fn create(&self, key: &str, object: Value) -> Result<Stored, StoreError> {
        self.post(key, &object)
    }

    fn mutate(
        &self,
        key: &str,
        f: &mut dyn FnMut(Option<&Stored>) -> Result<Mutation, StoreError>,
    ) -> Result<MutateOutcome, StoreError> {
        for _ in 0..CONFLICT_RETRIES {
            let cur = match self.get(key) {
                // An identity may create what it may not read (upstream grants recorders
                // create, patch and update on Events, no get): it writes blind, and what it
                // cannot read it creates.
                Err(StoreError::Refused(s)) if s.get("code") == Some(&json!(403)) => None,
                other => other?,
            };
            let result = match (f(cur.as_ref())?, cur) {
                (Mutation::Keep, cur) => Ok(MutateOutcome {
                    stored: cur,
                    deleted: None,
                }),
                (Mutation::Put(new), None) => self.post(key, &new).map(|s| MutateOutcome {
                    stored: Some(s),
                    deleted: None,
                }),
                (Mutation::Put(new), Some(cur)) => {
                    self.write(key, &cur, new).map(|s| MutateOutcome {
                        stored: s,
                        deleted: None,
                    })
                }
                (Mutation::Delete, None) => Err(StoreError::NotFound(key.to_string())),
                (Mutation::Delete, Some(cur)) => {
                    let (r, ns, name) = object_of(key)?;
                    let pending = cur
                        .object
                        .pointer("/spec/finalizers")
                        .and_then(Value::as_array)
                        .is_some_and(|f| !f.is_empty());
                    if r.info.kind == "Namespace" && pending {
                        // The namespace controller's last step: emptying spec.finalizers
                        // through namespaces/finalize, after which the server deletes it.
                        let mut done = (*cur.object).clone();
                        done["spec"]["finalizers"] = json!([]);
                        let url = format!("{}/finalize", r.object(None, &name));
                        return match self.call(key, request(http::Method::PUT, &url, Some(&done))) {
                            Ok(_) | Err(StoreError::NotFound(_)) => Ok(MutateOutcome {
                                stored: None,
                                deleted: Some(cur),
                            }),
                            Err(StoreError::Conflict { .. }) => continue,
                            Err(e) => Err(e),
                        };
                    }
                    let opts = json!({
                        "kind": "DeleteOptions", "apiVersion": "v1",
                        "gracePeriodSeconds": 0,
                        "preconditions": {"resourceVersion": cur.object.pointer("/metadata/resourceVersion")},
                    });
                    self.delete_object(r.info, ns.as_deref(), &name, opts)
                        .map(|out| {
                            let revision = match revision_of(&out) {
                                0 => cur.revision,
                                r => r,
                            };
                            MutateOutcome {
                                stored: None,
                                deleted: Some(Stored { revision, ..cur }),
                            }
                        })
                }
            };
            match result {
                Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => continue,
                other => return other,
            }
        }
        Err(StoreError::Conflict {
            key: key.to_string(),
            current: 0,
        })
    }

    fn watch(&self, prefix: &str, from: u64) -> Result<mpsc::Receiver<Arc<Event>>, StoreError> {
        let s = scope(prefix)?;
        let (tx, rx) = mpsc::channel(4096);
        let (stop, _) = tokio::sync::watch::channel(false);
        let stop = Arc::new(stop);
        for r in s.resources {
            let mut uri = r.collection(s.namespace.as_deref());
            uri.push_str(&format!(
                "?watch=1&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}"
            ));
            if let Some(n) = &s.name {
                uri.push_str(&format!("&fieldSelector=metadata.name%3D{n}"));
            }
            let client = self.client.clone();
            let tx = tx.clone();
            let stop = stop.clone();
            self.bridge.handle().spawn(async move {
                let mut stopped = stop.subscribe();
                tokio::select! {
                    _ = watch_resource(client, r, uri, from, tx) => {}
                    _ = stopped.changed() => {}
                }
                // One resource's watch ending ends them all: the caller re-lists.
                let _ = stop.send(true);
            });
        }
        Ok(rx)
    }

    fn revision(&self) -> u64 {
        self.revision_now().unwrap_or(0)
    }

    fn oldest_watchable(&self) -> u64 {
        // The API server answers 410 itself for a watch it cannot replay.
        0
    }

    fn compact(&self, _revision: u64) -> Result<(), StoreError> {
        // The API server compacts its own store.
        Ok(())
    }

    fn remote(&self) -> Option<&RestStore> {
        Some(self)
    }
}

/// Feeds `tx` from watches of `uri` starting after `from`, each resumed from the last
/// resourceVersion seen, until the server says the revision is gone (410), the receiver
/// goes, or an error other than a dropped connection.
async fn watch_resource(
    client: kube::Client,
    r: Resource,
    uri: String,
    from: u64,
    tx: mpsc::Sender<Arc<Event>>,
) {
    let mut rev = from;
    // The last object seen per key: watchers are given the one an event replaces.
    let mut known: HashMap<String, Arc<Value>> = HashMap::new();
    let mut failures = 0u32;
    loop {
        if tx.is_closed() {
            return;
        }
        let req = request(
            http::Method::GET,
            &format!("{uri}&resourceVersion={rev}"),
            None,
        );
        let stream = match client.request_events::<Value>(req).await {
            Ok(s) => s,
            // 410: the revision is gone, the caller re-lists; 403 and the like will not
            // change by retrying.
            Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
                if s.code != 410 {
                    tracing::warn!(resource = r.info.plural, status = %s.message, "watch refused");
                }
                return;
            }
            Err(e) => {
                failures += 1;
                if failures > 30 {
                    tracing::warn!(resource = r.info.plural, error = %e, "watch failed");
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        failures = 0;
        futures::pin_mut!(stream);
        loop {
            let next = tokio::select! {
                next = stream.try_next() => next,
                // Nobody listens any more.
                _ = tx.closed() => return,
            };
            let ev = match next {
                Ok(Some(ev)) => ev,
                // The server ended this request (its timeout) or the connection broke:
                // resume from the last resourceVersion seen.
                Ok(None) | Err(_) => break,
            };
            let (kind, obj) = match ev {
                WatchEvent::Added(o) => (EventKind::Added, o),
                WatchEvent::Modified(o) => (EventKind::Modified, o),
                WatchEvent::Deleted(o) => (EventKind::Deleted, o),
                WatchEvent::Bookmark(b) => {
                    if let Ok(v) = b.metadata.resource_version.parse() {
                        rev = v;
                    }
                    continue;
                }
                // 410 Gone, or anything else the server ends a watch with.
                WatchEvent::Error(_) => return,
            };
            let s = stored(&r, obj);
            rev = s.revision.max(rev);
            let prev = match kind {
                EventKind::Deleted => known.remove(&s.key),
                _ => known.insert(s.key.clone(), s.object.clone()),
            };
            let ev = Event {
                revision: s.revision,
                kind,
                key: s.key,
                object: s.object,
                prev,
            };
            if tx.send(Arc::new(ev)).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_prefixes_name_resources_namespaces_and_objects() {
        let (r, ns, name) = object_of("/core/pods/default/web-1").unwrap();
        assert_eq!(
            r.object(ns.as_deref(), &name),
            "/api/v1/namespaces/default/pods/web-1"
        );
        let (r, ns, name) = object_of("/core/nodes/n1").unwrap();
        assert_eq!(r.object(ns.as_deref(), &name), "/api/v1/nodes/n1");
        let s = scope("/apps/deployments/").unwrap();
        assert_eq!(s.resources[0].collection(None), "/apis/apps/v1/deployments");
        let s = scope("/core/secrets/kube-system/").unwrap();
        assert_eq!(
            s.resources[0].collection(s.namespace.as_deref()),
            "/api/v1/namespaces/kube-system/secrets"
        );
        let s = scope("/core/configmaps/kube-public/cluster-info").unwrap();
        assert_eq!(s.name.as_deref(), Some("cluster-info"));
        // Core Events: the storage key of events.k8s.io's Events too.
        let (r, _, _) = object_of("/core/events/default/e1").unwrap();
        assert_eq!(r.base(), "/api/v1");
        let all = scope("/").unwrap();
        assert!(all.resources.iter().any(|r| r.info.plural == "pods"));
        assert!(
            !all.resources
                .iter()
                .any(|r| r.info.plural == "tokenreviews")
        );
        assert!(matches!(
            scope("/nothing.example/things/"),
            Err(StoreError::Backend(_))
        ));
        assert!(matches!(
            object_of("/apps/deployments/"),
            Err(StoreError::Backend(_))
        ));
    }

    #[test]
    fn only_the_status_or_only_the_main_resource_is_told_apart() {
        let a = json!({"metadata": {"name": "x", "resourceVersion": "1"}, "spec": {"a": 1}, "status": {"b": 1}});
        let mut b = a.clone();
        b["status"]["b"] = json!(2);
        b["metadata"]["resourceVersion"] = json!("2");
        assert_eq!(main_part(&a), main_part(&b));
        b["spec"]["a"] = json!(2);
        assert_ne!(main_part(&a), main_part(&b));
    }
}
