//! Watches of Services and EndpointSlices feeding the store (CoreDNS's dnsController
//! informers). A re-list replaces what vanished meanwhile.

use crate::records::{Records, Watched};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt as _};
use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

type NsName = (String, String);

fn key<K: kube::Resource>(o: &K) -> NsName {
    (
        o.namespace().unwrap_or_else(|| "default".into()),
        o.name_any(),
    )
}

/// How one watched kind feeds the store.
trait Stored:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + 'static
{
    const WHAT: Watched;
    fn apply(r: &mut Records, o: &Self);
    fn delete(r: &mut Records, ns: &str, name: &str);
}

impl Stored for Service {
    const WHAT: Watched = Watched::Services;
    fn apply(r: &mut Records, o: &Self) {
        r.apply_service(o);
    }
    fn delete(r: &mut Records, ns: &str, name: &str) {
        r.delete_service(ns, name);
    }
}

impl Stored for EndpointSlice {
    const WHAT: Watched = Watched::EndpointSlices;
    fn apply(r: &mut Records, o: &Self) {
        r.apply_slice(o);
    }
    fn delete(r: &mut Records, ns: &str, name: &str) {
        r.delete_slice(ns, name);
    }
}

/// Watches every object of kind `K` until the stream ends.
async fn watch_kind<K: Stored>(client: Client, store: Arc<RwLock<Records>>) {
    let api: Api<K> = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    let mut known: HashSet<NsName> = HashSet::new();
    let mut relist: Option<Vec<K>> = None;
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(error = %e, "watching {:?} failed; retrying", K::WHAT);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        match ev {
            Event::Init => relist = Some(Vec::new()),
            Event::InitApply(o) => relist.get_or_insert_with(Vec::new).push(o),
            Event::InitDone => {
                let items = relist.take().unwrap_or_default();
                let now: HashSet<NsName> = items.iter().map(key).collect();
                let Ok(mut r) = store.write() else { return };
                for gone in known.difference(&now) {
                    K::delete(&mut r, &gone.0, &gone.1);
                }
                for o in &items {
                    K::apply(&mut r, o);
                }
                r.set_synced(K::WHAT);
                known = now;
            }
            Event::Apply(o) => {
                known.insert(key(&o));
                let Ok(mut r) = store.write() else { return };
                K::apply(&mut r, &o);
            }
            Event::Delete(o) => {
                let k = key(&o);
                known.remove(&k);
                let Ok(mut r) = store.write() else { return };
                K::delete(&mut r, &k.0, &k.1);
            }
        }
    }
}

/// Watches Services and EndpointSlices until dropped.
pub(crate) async fn run(client: Client, store: Arc<RwLock<Records>>) {
    tokio::join!(
        watch_kind::<Service>(client.clone(), store.clone()),
        watch_kind::<EndpointSlice>(client, store),
    );
}
