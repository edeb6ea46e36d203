//! Watches of Services, EndpointSlices and this proxy's Node (upstream's pkg/proxy/config
//! handlers), feeding the change tracker and waking the sync loop.

use crate::changetracker::{ChangeTracker, NsName};
use crate::proxier::Wake;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt as _};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

/// The node label naming its zone, for topology hints.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

fn key<K: kube::Resource>(o: &K) -> NsName {
    (
        o.namespace().unwrap_or_else(|| "default".into()),
        o.name_any(),
    )
}

/// How one watched kind feeds the change tracker.
trait Tracked:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + 'static
{
    /// For log lines.
    const WHAT: &'static str;
    fn update(t: &mut ChangeTracker, o: &Self);
    fn delete(t: &mut ChangeTracker, ns: &str, name: &str);
}

impl Tracked for Service {
    const WHAT: &'static str = "services";
    fn update(t: &mut ChangeTracker, o: &Self) {
        t.service_update(o);
    }
    fn delete(t: &mut ChangeTracker, ns: &str, name: &str) {
        t.service_delete(ns, name);
    }
}

impl Tracked for EndpointSlice {
    const WHAT: &'static str = "endpoint slices";
    fn update(t: &mut ChangeTracker, o: &Self) {
        t.slice_update(o);
    }
    fn delete(t: &mut ChangeTracker, ns: &str, name: &str) {
        t.slice_delete(ns, name);
    }
}

/// Watches every object of kind `K` until the stream ends; `synced` turns true after the
/// first full list. A re-list deletes what vanished meanwhile.
async fn watch_kind<K: Tracked>(
    client: Client,
    tracker: Arc<Mutex<ChangeTracker>>,
    wake: mpsc::Sender<Wake>,
    synced: Arc<AtomicBool>,
    on_change: impl Fn() + Send,
) {
    let api: Api<K> = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    let mut known: HashSet<NsName> = HashSet::new();
    let mut relist: Option<Vec<K>> = None;
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(error = %e, "watching {} failed; retrying", K::WHAT);
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        let Ok(mut t) = tracker.lock() else { return };
        match ev {
            Event::Init => relist = Some(Vec::new()),
            Event::InitApply(o) => relist.get_or_insert_with(Vec::new).push(o),
            Event::InitDone => {
                let items = relist.take().unwrap_or_default();
                let now: HashSet<NsName> = items.iter().map(key).collect();
                for gone in known.difference(&now) {
                    K::delete(&mut t, &gone.0, &gone.1);
                }
                for o in &items {
                    K::update(&mut t, o);
                }
                known = now;
                synced.store(true, Ordering::SeqCst);
            }
            Event::Apply(o) => {
                known.insert(key(&o));
                K::update(&mut t, &o);
            }
            Event::Delete(o) => {
                let k = key(&o);
                known.remove(&k);
                K::delete(&mut t, &k.0, &k.1);
            }
        }
        let dirty = t.has_changes();
        drop(t);
        if dirty {
            on_change();
            if wake.send(Wake::Changed).is_err() {
                return;
            }
        }
    }
}

/// Watches Services until the stream ends; `synced` turns true after the first full list.
pub async fn services(
    client: Client,
    tracker: Arc<Mutex<ChangeTracker>>,
    wake: mpsc::Sender<Wake>,
    synced: Arc<AtomicBool>,
    on_change: impl Fn() + Send,
) {
    watch_kind::<Service>(client, tracker, wake, synced, on_change).await
}

/// Watches EndpointSlices until the stream ends.
pub async fn endpoint_slices(
    client: Client,
    tracker: Arc<Mutex<ChangeTracker>>,
    wake: mpsc::Sender<Wake>,
    synced: Arc<AtomicBool>,
    on_change: impl Fn() + Send,
) {
    watch_kind::<EndpointSlice>(client, tracker, wake, synced, on_change).await
}

/// Watches this node's zone label; sends the new context when it changes.
pub async fn node_zone(
    client: Client,
    node: String,
    base: crate::model::NodeContext,
    wake: mpsc::Sender<Wake>,
) {
    let api: Api<Node> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut stream = watcher::watcher(api, cfg).boxed();
    let mut zone: Option<String> = None;
    while let Some(ev) = stream.next().await {
        let n = match ev {
            Ok(Event::Apply(n)) | Ok(Event::InitApply(n)) => n,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "watching this node failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                continue;
            }
        };
        if n.name_any() != node {
            continue;
        }
        let z = n.labels().get(ZONE_LABEL).cloned();
        if z != zone {
            zone = z.clone();
            let mut ctx = base.clone();
            ctx.zone = z;
            if wake.send(Wake::Context(ctx)).is_err() {
                return;
            }
        }
    }
}
