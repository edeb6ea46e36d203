//! The etcd backend: the API server's objects in etcd v3, as kube-apiserver keeps them.
//!
//! A key's `mod_revision` is the object's resourceVersion (the stored JSON carries none);
//! creates are a transaction guarded by `create_revision == 0`, writes and deletes by
//! `mod_revision` equal to the revision read, so a concurrent writer makes the loser re-read
//! and re-apply its change (upstream's GuaranteedUpdate) or get the Conflict its caller
//! asked for. Watches are etcd watches with the previous value; a compacted revision is the
//! store's `Compacted` error, which clients see as 410 Gone. Lists page through the range
//! at one revision.

mod client;
mod keys;
mod lease;
mod metrics;
pub mod server;

// Generated code: its oneof variant names are etcd's.
#[allow(clippy::enum_variant_names)]
pub(crate) mod pb {
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
}

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use serde_json::Value;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use super::bridge::Bridge;
pub use client::{DEFAULT_EVENT_TTL, DEFAULT_PREFIX, EtcdConfig};
use client::{is_compacted, status_error};
use keys::KeyLayout;
use metrics::Operation;
use pb::etcdserverpb::{
    self as rpc, CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest, WatchCreateRequest, WatchRequest, compare,
    kv_client::KvClient, lease_client::LeaseClient, request_op, response_op,
    watch_client::WatchClient, watch_request,
};
use pb::mvccpb::{KeyValue, event::EventType};
pub use server::EtcdServer;

use super::{
    Event, EventKind, MutateOutcome, Mutation, Store, StoreError, Stored, set_resource_version,
};

/// Keys per Range page of a list: large lists stay under gRPC's message size.
const PAGE: i64 = 500;
/// Re-reads after losing a write race before giving up with Conflict.
const MAX_RETRIES: usize = 100;
/// Buffered events per watcher (etcd holds the rest).
const WATCH_BUFFER: usize = 1024;

/// The store in etcd.
pub struct EtcdStore {
    bridge: Bridge,
    members: Members,
    layout: KeyLayout,
    /// The newest revision any response carried.
    revision: AtomicU64,
    /// The newest compaction this process made or saw.
    compacted: AtomicU64,
    metrics: metrics::RequestMetrics,
    /// The leases Events are written with (`--event-ttl`).
    event_leases: lease::LeaseManager,
}

/// The `--etcd-servers` members, one lazily connected channel each. Requests go to the
/// current member; when it is unavailable the next one becomes current, as etcd's own
/// client switches endpoints, so an API server outlives the loss of the member it used
/// (while the cluster keeps quorum).
struct Members {
    urls: Vec<String>,
    kv: Vec<KvClient<Channel>>,
    watch: Vec<WatchClient<Channel>>,
    lease: Vec<LeaseClient<Channel>>,
    current: AtomicUsize,
}

impl Members {
    fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    fn kv(&self) -> (usize, KvClient<Channel>) {
        let i = self.current();
        (i, self.kv[i].clone())
    }

    fn watch(&self) -> (usize, WatchClient<Channel>) {
        let i = self.current();
        (i, self.watch[i].clone())
    }

    fn lease(&self) -> (usize, LeaseClient<Channel>) {
        let i = self.current();
        (i, self.lease[i].clone())
    }

    /// Member `i` failed a request with `err`: when that leaves the store unavailable and
    /// `i` is still current, the next member takes over. True when the caller may try again.
    fn failed(&self, i: usize, err: &StoreError) -> bool {
        let n = self.urls.len();
        if n < 2 || !matches!(err, StoreError::Unavailable(_) | StoreError::Timeout) {
            return false;
        }
        let next = (i + 1) % n;
        if self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(from = %self.urls[i], to = %self.urls[next], error = %err, "etcd member unavailable; switching to the next of --etcd-servers");
        }
        true
    }
}

/// Whether a failed request never reached its member (the connection could not be
/// made), so sending it to another member cannot apply it twice.
fn never_sent(err: &StoreError) -> bool {
    matches!(err, StoreError::Unavailable(m) if m.contains("connect"))
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("server", &self.server())
            .finish()
    }
}

/// The JSON an object is stored as: without a resourceVersion, which is the key's
/// mod_revision.
fn encode(mut object: Value) -> Result<Vec<u8>, StoreError> {
    if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    serde_json::to_vec(&object).map_err(|e| StoreError::Backend(e.to_string()))
}

fn decode(key: &str, value: &[u8], revision: u64) -> Result<Value, StoreError> {
    let mut v: Value = serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        err: e.to_string(),
    })?;
    set_resource_version(&mut v, revision);
    Ok(v)
}

fn stored(key: String, kv: &KeyValue) -> Result<Stored, StoreError> {
    let revision = kv.mod_revision as u64;
    let object = decode(&key, &kv.value, revision)?;
    Ok(Stored {
        key,
        revision,
        object: Arc::new(object),
    })
}

fn put_op(key: &str, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.as_bytes().to_vec(),
            value,
            lease,
            ..Default::default()
        })),
    }
}

/// Events expire (`--event-ttl`); core and events.k8s.io Events share these keys.
fn expires(key: &str) -> bool {
    key.starts_with("/core/events/")
}

fn get_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })),
    }
}

/// `mod_revision(key) == revision`; revision 0 compares `create_revision == 0` (absent).
fn unchanged(key: &str, revision: u64) -> Compare {
    let (target, union) = if revision == 0 {
        (
            compare::CompareTarget::Create,
            compare::TargetUnion::CreateRevision(0),
        )
    } else {
        (
            compare::CompareTarget::Mod,
            compare::TargetUnion::ModRevision(revision as i64),
        )
    };
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: target as i32,
        key: key.as_bytes().to_vec(),
        target_union: Some(union),
    }
}

impl EtcdStore {
    /// Connects to the first reachable `--etcd-servers` URL; fails naming them when none
    /// answers.
    pub fn connect(cfg: &EtcdConfig) -> Result<EtcdStore, StoreError> {
        let bridge = Bridge::new("etcd-client", cfg.request_timeout)?;
        let c = cfg.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        bridge.handle().spawn(async move {
            let _ = tx.send(client::connect(&c).await);
        });
        let wait = move || {
            rx.recv()
                .unwrap_or_else(|_| Err(StoreError::Backend("etcd client stopped".into())))
        };
        let (channels, first) = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)?
            }
            _ => wait()?,
        };
        let members = Members {
            urls: cfg.servers.clone(),
            kv: channels
                .iter()
                .map(|c| KvClient::new(c.clone()).max_decoding_message_size(64 << 20))
                .collect(),
            watch: channels
                .iter()
                .map(|c| WatchClient::new(c.clone()).max_decoding_message_size(64 << 20))
                .collect(),
            lease: channels
                .iter()
                .map(|c| LeaseClient::new(c.clone()))
                .collect(),
            current: AtomicUsize::new(first),
        };
        let store = EtcdStore {
            bridge,
            members,
            layout: KeyLayout::new(&cfg.prefix),
            revision: AtomicU64::new(0),
            compacted: AtomicU64::new(0),
            metrics: Default::default(),
            event_leases: lease::LeaseManager::new(cfg.event_ttl),
        };
        store.revision();
        Ok(store)
    }

    /// The etcd URL in use.
    pub fn server(&self) -> String {
        self.members.urls[self.members.current()].clone()
    }

    fn saw(&self, header: Option<&rpc::ResponseHeader>) -> u64 {
        let rev = header.map(|h| h.revision as u64).unwrap_or(0);
        self.revision.fetch_max(rev, Ordering::Relaxed);
        rev
    }

    /// A read, tried once more on the next member when the current one is unavailable
    /// (reads cannot apply twice).
    fn range(&self, req: RangeRequest) -> Result<rpc::RangeResponse, StoreError> {
        let (i, kv) = self.members.kv();
        match self.range_on(kv, req.clone()) {
            Err(e) if self.members.failed(i, &e) => self.range_on(self.members.kv().1, req),
            r => r,
        }
    }

    fn range_on(
        &self,
        mut kv: KvClient<Channel>,
        req: RangeRequest,
    ) -> Result<rpc::RangeResponse, StoreError> {
        let out = self.bridge.run(async move {
            kv.range(req).await.map(|r| r.into_inner()).map_err(|s| {
                if is_compacted(&s) {
                    StoreError::Compacted {
                        requested: 0,
                        oldest: 0,
                    }
                } else {
                    status_error(s)
                }
            })
        })?;
        self.saw(out.header.as_ref());
        Ok(out)
    }

    /// The lease a write of `key` attaches: none, or for an Event the current one of the
    /// lease manager, granted when it has none to reuse.
    fn lease_for(&self, key: &str) -> Result<i64, StoreError> {
        if !expires(key) {
            return Ok(0);
        }
        let now = Instant::now();
        let ttl = match self.event_leases.reuse(now) {
            Ok(id) => return Ok(id),
            Err(ttl) => ttl,
        };
        let (i, mut client) = self.members.lease();
        let granted = self.bridge.run(async move {
            client
                .lease_grant(LeaseGrantRequest { ttl, id: 0 })
                .await
                .map(|r| r.into_inner())
                .map_err(status_error)
        });
        let granted = granted.inspect_err(|e| {
            self.members.failed(i, e);
        })?;
        if !granted.error.is_empty() {
            return Err(StoreError::Backend(format!(
                "etcd lease grant: {}",
                granted.error
            )));
        }
        self.event_leases.granted(granted.id, granted.ttl, now);
        Ok(granted.id)
    }

    /// A transaction; sent to the next member only when it never reached the current one.
    fn txn(&self, req: TxnRequest) -> Result<rpc::TxnResponse, StoreError> {
        let (i, kv) = self.members.kv();
        match self.txn_on(kv, req.clone()) {
            Err(e) if self.members.failed(i, &e) && never_sent(&e) => {
                self.txn_on(self.members.kv().1, req)
            }
            r => r,
        }
    }

    fn txn_on(
        &self,
        mut kv: KvClient<Channel>,
        req: TxnRequest,
    ) -> Result<rpc::TxnResponse, StoreError> {
        let out = self.bridge.run(async move {
            kv.txn(req)
                .await
                .map(|r| r.into_inner())
                .map_err(status_error)
        })?;
        self.saw(out.header.as_ref());
        Ok(out)
    }

    /// The current value of the etcd key `ek` (store key `key`).
    fn read(&self, key: &str, ek: &str) -> Result<Option<Stored>, StoreError> {
        let resp = self.range(RangeRequest {
            key: ek.as_bytes().to_vec(),
            ..Default::default()
        })?;
        resp.kvs
            .first()
            .map(|kv| stored(key.to_string(), kv))
            .transpose()
    }

    /// The key's value a failed guarded transaction read in its failure branch.
    fn current_from(
        &self,
        key: &str,
        resp: &rpc::TxnResponse,
    ) -> Result<Option<Stored>, StoreError> {
        for r in &resp.responses {
            if let Some(response_op::Response::ResponseRange(range)) = &r.response {
                return range
                    .kvs
                    .first()
                    .map(|kv| stored(key.to_string(), kv))
                    .transpose();
            }
        }
        Ok(None)
    }

    fn compacted_error(&self, requested: u64) -> StoreError {
        let oldest = self.compacted.load(Ordering::Relaxed).max(requested);
        StoreError::Compacted {
            requested,
            oldest: oldest + 1,
        }
    }
}

impl EtcdStore {
    /// Every object under `prefix`, paged, at one revision.
    fn list_all(&self, prefix: &str) -> Result<(Vec<Stored>, u64), StoreError> {
        let (mut start, end) = self.layout.range(prefix);
        let mut at = 0i64;
        let mut items = Vec::new();
        loop {
            let resp = self.range(RangeRequest {
                key: start.clone(),
                range_end: end.clone(),
                limit: PAGE,
                revision: at,
                ..Default::default()
            })?;
            if at == 0 {
                at = resp.header.as_ref().map(|h| h.revision).unwrap_or(0);
            }
            for kv in &resp.kvs {
                if let Some(key) = self.layout.store_key(&kv.key)
                    && key.starts_with(prefix)
                {
                    items.push(stored(key, kv)?);
                }
            }
            match resp.kvs.last() {
                Some(last) if resp.more => {
                    start = last.key.clone();
                    start.push(0);
                }
                _ => break,
            }
        }
        Ok((items, at as u64))
    }

    fn create_new(&self, key: &str, object: Value) -> Result<Stored, StoreError> {
        let ek = self.layout.etcd_key(key);
        let value = encode(object)?;
        let resp = self.txn(TxnRequest {
            compare: vec![unchanged(&ek, 0)],
            success: vec![put_op(&ek, value.clone(), self.lease_for(key)?)],
            failure: vec![],
        })?;
        if !resp.succeeded {
            return Err(StoreError::AlreadyExists(key.to_string()));
        }
        let revision = self.saw(resp.header.as_ref());
        Ok(Stored {
            key: key.to_string(),
            revision,
            object: Arc::new(decode(key, &value, revision)?),
        })
    }

    fn guaranteed_update(
        &self,
        key: &str,
        f: &mut dyn FnMut(Option<&Stored>) -> Result<Mutation, StoreError>,
    ) -> Result<MutateOutcome, StoreError> {
        let ek = self.layout.etcd_key(key);
        let mut current = self.read(key, &ek)?;
        for _ in 0..MAX_RETRIES {
            let seen = current.as_ref().map(|c| c.revision).unwrap_or(0);
            let (op, deleting) = match f(current.as_ref())? {
                Mutation::Keep => {
                    return Ok(MutateOutcome {
                        stored: current,
                        deleted: None,
                    });
                }
                Mutation::Put(v) => (put_op(&ek, encode(v)?, self.lease_for(key)?), false),
                Mutation::Delete => {
                    if current.is_none() {
                        return Err(StoreError::NotFound(key.to_string()));
                    }
                    let op = RequestOp {
                        request: Some(request_op::Request::RequestDeleteRange(
                            DeleteRangeRequest {
                                key: ek.as_bytes().to_vec(),
                                ..Default::default()
                            },
                        )),
                    };
                    (op, true)
                }
            };
            let value = match &op.request {
                Some(request_op::Request::RequestPut(p)) => Some(p.value.clone()),
                _ => None,
            };
            let resp = self.txn(TxnRequest {
                compare: vec![unchanged(&ek, seen)],
                success: vec![op],
                failure: vec![get_op(&ek)],
            })?;
            if resp.succeeded {
                let revision = self.saw(resp.header.as_ref());
                if deleting {
                    let mut last = current
                        .map(|c| (*c.object).clone())
                        .unwrap_or_else(|| Value::Object(Default::default()));
                    set_resource_version(&mut last, revision);
                    return Ok(MutateOutcome {
                        stored: None,
                        deleted: Some(Stored {
                            key: key.to_string(),
                            revision,
                            object: Arc::new(last),
                        }),
                    });
                }
                let object = decode(key, &value.unwrap_or_default(), revision)?;
                return Ok(MutateOutcome {
                    stored: Some(Stored {
                        key: key.to_string(),
                        revision,
                        object: Arc::new(object),
                    }),
                    deleted: None,
                });
            }
            // Another writer won: apply the change again to what it wrote.
            current = self.current_from(key, &resp)?;
        }
        Err(StoreError::Conflict {
            key: key.to_string(),
            current: current.map(|c| c.revision).unwrap_or(0),
        })
    }
}

impl Store for EtcdStore {
    fn get(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        let started = Instant::now();
        let r = self.read(key, &self.layout.etcd_key(key));
        self.metrics.record(Operation::Get, key, started, &r);
        r
    }

    fn list(&self, prefix: &str) -> Result<(Vec<Stored>, u64), StoreError> {
        let started = Instant::now();
        let r = self.list_all(prefix);
        self.metrics.record(Operation::List, prefix, started, &r);
        r
    }

    fn create(&self, key: &str, object: Value) -> Result<Stored, StoreError> {
        let started = Instant::now();
        let r = self.create_new(key, object);
        self.metrics.record(Operation::Create, key, started, &r);
        r
    }

    fn mutate(
        &self,
        key: &str,
        f: &mut dyn FnMut(Option<&Stored>) -> Result<Mutation, StoreError>,
    ) -> Result<MutateOutcome, StoreError> {
        let started = Instant::now();
        let r = self.guaranteed_update(key, f);
        let op = match &r {
            Ok(MutateOutcome {
                deleted: Some(_), ..
            }) => Operation::Delete,
            _ => Operation::Update,
        };
        self.metrics.record(op, key, started, &r);
        r
    }

    fn metrics(&self, out: &mut String) {
        self.metrics.encode(out);
    }

    fn check_watchable(&self, from: u64) -> Result<(), StoreError> {
        // etcd answers a watch from a compacted revision only after creating it; a read at
        // that revision says so at once, with the store's meaning (from < compacted).
        let (start, _) = self.layout.range("/");
        match self.range(RangeRequest {
            key: start,
            revision: from.max(1) as i64,
            count_only: true,
            ..Default::default()
        }) {
            Err(StoreError::Compacted { .. }) => Err(self.compacted_error(from)),
            // A revision not written yet: nothing to replay.
            Err(StoreError::Backend(m)) if m.contains("future revision") => Ok(()),
            Err(e) => Err(e),
            Ok(_) => Ok(()),
        }
    }

    fn watch(&self, prefix: &str, from: u64) -> Result<mpsc::Receiver<Arc<Event>>, StoreError> {
        self.open_watch(prefix, from, false)
    }

    fn watch_progress(
        &self,
        prefix: &str,
        from: u64,
    ) -> Result<mpsc::Receiver<Arc<Event>>, StoreError> {
        self.open_watch(prefix, from, true)
    }

    fn revision(&self) -> u64 {
        let (start, _) = self.layout.range("/");
        match self.range(RangeRequest {
            key: start,
            count_only: true,
            ..Default::default()
        }) {
            Ok(r) => r.header.map(|h| h.revision as u64).unwrap_or(0),
            Err(_) => self.revision.load(Ordering::Relaxed),
        }
    }

    fn oldest_watchable(&self) -> u64 {
        self.compacted.load(Ordering::Relaxed)
    }

    fn compact(&self, revision: u64) -> Result<(), StoreError> {
        let upto = revision.min(self.revision());
        if upto == 0 || upto <= self.compacted.load(Ordering::Relaxed) {
            return Ok(());
        }
        let (member, mut kv) = self.members.kv();
        let r = self.bridge.run(async move {
            match kv
                .compact(CompactionRequest {
                    revision: upto as i64,
                    physical: false,
                })
                .await
            {
                Ok(_) => Ok(()),
                // Compacted already (by another API server): nothing to do.
                Err(s) if is_compacted(&s) => Ok(()),
                Err(s) => Err(status_error(s)),
            }
        });
        match &r {
            Ok(()) => {
                self.compacted.fetch_max(upto, Ordering::Relaxed);
            }
            Err(e) => {
                self.members.failed(member, e);
            }
        }
        r
    }
}

/// Turns etcd watch events into store events on the watch task.
struct WatchDecoder {
    layout: KeyLayout,
}

impl WatchDecoder {
    fn event(&self, ev: pb::mvccpb::Event) -> Option<Event> {
        let kv = ev.kv?;
        let key = self.layout.store_key(&kv.key)?;
        let revision = kv.mod_revision as u64;
        let prev = ev.prev_kv.and_then(|p| {
            decode(&key, &p.value, p.mod_revision as u64)
                .ok()
                .map(Arc::new)
        });
        let (kind, object) = if ev.r#type == EventType::Delete as i32 {
            // The deleted object, at the deletion's revision, as the embedded store gives it.
            let mut last = prev
                .as_deref()
                .cloned()
                .unwrap_or_else(|| Value::Object(Default::default()));
            set_resource_version(&mut last, revision);
            (EventKind::Deleted, last)
        } else {
            let object = decode(&key, &kv.value, revision).ok()?;
            let kind = if kv.create_revision == kv.mod_revision {
                EventKind::Added
            } else {
                EventKind::Modified
            };
            (kind, object)
        };
        Some(Event {
            revision,
            kind,
            key,
            object: Arc::new(object),
            prev,
        })
    }
}

impl EtcdStore {
    /// An etcd watch of `prefix` after `from`; with `progress`, etcd's progress
    /// notifications come through as markers.
    fn open_watch(
        &self,
        prefix: &str,
        from: u64,
        progress: bool,
    ) -> Result<mpsc::Receiver<Arc<Event>>, StoreError> {
        let (start, end) = self.layout.range(prefix);
        self.check_watchable(from)?;
        let (req_tx, req_rx) = mpsc::channel::<WatchRequest>(4);
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: start,
                    range_end: end,
                    start_revision: from as i64 + 1,
                    prev_kv: true,
                    // etcd's periodic progress notifications (only for a caught-up
                    // watcher) are the markers.
                    progress_notify: progress,
                    ..Default::default()
                },
            )),
        };
        let (member, mut client) = self.members.watch();
        let stream = self.bridge.run(async move {
            req_tx
                .send(create)
                .await
                .map_err(|_| StoreError::Backend("watch request".into()))?;
            let mut stream = client
                .watch(tokio_stream::wrappers::ReceiverStream::new(req_rx))
                .await
                .map_err(status_error)?
                .into_inner();
            match stream.message().await.map_err(status_error)? {
                Some(r) if r.created && !r.canceled => Ok((stream, req_tx)),
                Some(r) => Err(StoreError::Backend(format!(
                    "etcd refused the watch: {}",
                    r.cancel_reason
                ))),
                None => Err(StoreError::Unavailable("etcd ended the watch".into())),
            }
        });
        let stream = stream.inspect_err(|e| {
            self.members.failed(member, e);
        })?;
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let layout = self.layout.clone();
        let prefix = prefix.to_string();
        let me = WatchDecoder { layout };
        self.bridge.handle().spawn(async move {
            let (mut stream, _keep_open) = stream;
            loop {
                let resp = tokio::select! {
                    r = stream.message() => r,
                    _ = tx.closed() => return,
                };
                // An error or end (etcd gone, compacted past us, cancelled): closing the
                // channel makes the client re-watch from its last revision or re-list.
                let Ok(Some(resp)) = resp else { return };
                if resp.canceled || resp.compact_revision != 0 {
                    return;
                }
                if progress && resp.events.is_empty() && !resp.created {
                    let rev = resp.header.map(|h| h.revision as u64).unwrap_or(0);
                    if rev > 0 && tx.send(Arc::new(Event::progress(rev))).await.is_err() {
                        return;
                    }
                    continue;
                }
                for ev in resp.events {
                    let Some(ev) = me.event(ev) else { continue };
                    if !ev.key.starts_with(&prefix) {
                        continue;
                    }
                    if tx.send(Arc::new(ev)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    #[test]
    fn events_are_written_with_a_lease_and_etcd_deletes_them_when_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let server = EtcdServer::start(&dir.path().join("etcd")).unwrap();
        let mut cfg = EtcdConfig::new(vec![server.url()]);
        cfg.event_ttl = Duration::from_secs(2);
        let store = EtcdStore::connect(&cfg).unwrap();
        let event = "/core/events/default/web.1";
        let pod = "/core/pods/default/web";
        store
            .create(
                event,
                json!({"metadata": {"name": "web.1"}, "reason": "Started"}),
            )
            .unwrap();
        store
            .create(pod, json!({"metadata": {"name": "web"}}))
            .unwrap();
        let lease = |key: &str| {
            store
                .range(RangeRequest {
                    key: store.layout.etcd_key(key).into_bytes(),
                    ..Default::default()
                })
                .unwrap()
                .kvs
                .first()
                .map(|kv| kv.lease)
        };
        assert!(lease(event).is_some_and(|l| l != 0), "{:?}", lease(event));
        assert_eq!(lease(pod), Some(0));
        // An Event bumped by its recorder expires again from its last write.
        let cur = store.get(event).unwrap().unwrap();
        store
            .update(
                event,
                json!({"metadata": {"name": "web.1"}, "count": 2}),
                Some(cur.revision),
            )
            .unwrap();
        assert!(lease(event).is_some_and(|l| l != 0));

        let mut rx = store.watch("/core/events/", store.revision()).unwrap();
        let started = Instant::now();
        let gone = loop {
            match rx.try_recv() {
                Ok(ev) => break ev,
                Err(_) if started.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => panic!("the Event outlived its lease: {e}"),
            }
        };
        assert_eq!((gone.kind, gone.key.as_str()), (EventKind::Deleted, event));
        assert!(store.get(event).unwrap().is_none());
        assert!(store.get(pod).unwrap().is_some());
    }
}
