//! The sync engine: takes the tracker's changes, updates the snapshot, asks the backend for
//! a partial sync (or a full one at start, every syncPeriod and after a failure), cleans up
//! stale UDP conntrack flows, and feeds metrics and health. Syncs are batched: at most one
//! per minSyncPeriod, however fast changes arrive (upstream's BoundedFrequencyRunner).

use crate::backend::Backend;
use crate::changetracker::{ChangeTracker, NsName};
use crate::conntrack;
use crate::healthcheck::{ProxyHealth, ServiceHealth};
use crate::metrics::Metrics;
use crate::model::{NodeContext, ServiceEntry, ServicePortName, Snapshot};
use crate::topology::categorize;
use std::collections::{BTreeSet, HashMap};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How often a full resync runs and how close two syncs may be.
#[derive(Clone, Copy, Debug)]
pub struct Periods {
    pub sync: Duration,
    pub min_sync: Duration,
}

/// The state the sync loop owns.
pub struct Proxier {
    pub tracker: Arc<Mutex<ChangeTracker>>,
    pub snapshot: Snapshot,
    pub backend: Box<dyn Backend>,
    pub ctx: NodeContext,
    pub metrics: Arc<Metrics>,
    pub health: Arc<ProxyHealth>,
    /// Run `conntrack` to clear stale UDP flows.
    pub conntrack: bool,
    needs_full: bool,
    last_full: Option<Instant>,
}

/// What one [`Proxier::sync`] did (for logs and the benchmark).
#[derive(Debug, Default)]
pub struct SyncReport {
    pub full: bool,
    pub changed_ports: usize,
    pub failed: usize,
    pub duration: Duration,
    pub ok: bool,
}

impl Proxier {
    pub fn new(
        tracker: Arc<Mutex<ChangeTracker>>,
        backend: Box<dyn Backend>,
        ctx: NodeContext,
        metrics: Arc<Metrics>,
        health: Arc<ProxyHealth>,
    ) -> Proxier {
        Proxier {
            tracker,
            snapshot: Snapshot::new(),
            backend,
            ctx,
            metrics,
            health,
            conntrack: true,
            needs_full: true,
            last_full: None,
        }
    }

    pub fn set_context(&mut self, ctx: NodeContext) {
        if ctx != self.ctx {
            self.ctx = ctx;
            self.needs_full = true;
        }
    }

    /// Whether syncPeriod has passed since the last full sync.
    fn full_due(&self, period: Duration) -> bool {
        self.needs_full || self.last_full.is_none_or(|t| t.elapsed() >= period)
    }

    fn ports_of(&self, svc: &NsName) -> Vec<ServicePortName> {
        self.snapshot
            .keys()
            .filter(|k| k.namespace == svc.0 && k.name == svc.1)
            .cloned()
            .collect()
    }

    /// One sync: partial unless `force_full` or a full sync is due.
    pub fn sync(&mut self, force_full: bool, period: Duration) -> SyncReport {
        let started = Instant::now();
        let full = force_full || self.full_due(period);
        let (changes, entries) = {
            let Ok(mut t) = self.tracker.lock() else {
                return SyncReport::default();
            };
            let changes = t.take_changes();
            let entries: Vec<(NsName, Vec<ServiceEntry>)> = changes
                .services
                .iter()
                .map(|s| (s.clone(), t.entries(s)))
                .collect();
            (changes, entries)
        };
        let mut changed: BTreeSet<ServicePortName> = BTreeSet::new();
        let mut old_entries: HashMap<ServicePortName, ServiceEntry> = HashMap::new();
        for (svc, new) in entries {
            for k in self.ports_of(&svc) {
                if let Some(e) = self.snapshot.remove(&k) {
                    old_entries.insert(k.clone(), e);
                }
                changed.insert(k);
            }
            for e in new {
                changed.insert(e.port.name.clone());
                self.snapshot.insert(e.port.name.clone(), e);
            }
        }
        self.metrics
            .service_changes
            .inc_by(changes.services.len() as u64);
        let result = if full {
            self.backend.full_sync(&self.snapshot, &self.ctx)
        } else {
            self.backend
                .partial_sync(&self.snapshot, &self.ctx, &changed)
        };
        let mut report = SyncReport {
            full,
            changed_ports: changed.len(),
            ..Default::default()
        };
        match result {
            Ok(out) => {
                report.ok = true;
                report.failed = out.failed.len();
                if full {
                    self.last_full = Some(Instant::now());
                    self.needs_full = false;
                } else if !out.failed.is_empty() {
                    // The kernel may have drifted from what we think it holds (someone
                    // removed an element): rebuild from scratch next time, as upstream does.
                    // A full sync's own failures do not ask for another, or a service the
                    // kernel always refuses would keep the proxy in full syncs.
                    self.needs_full = true;
                }
                self.health.updated();
                let now = SystemTime::now();
                for t in &changes.trigger_times {
                    if let Ok(d) = now.duration_since(*t) {
                        self.metrics.network_programming.observe(d.as_secs_f64());
                    }
                }
                if self.conntrack {
                    self.clear_stale_udp(&changed, &old_entries);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, full, "sync failed; a full sync follows");
                self.needs_full = true;
            }
        }
        report.duration = started.elapsed();
        self.metrics.observe_sync(full, report.duration, report.ok);
        if full || report.changed_ports > 0 {
            tracing::info!(
                full,
                changed_ports = report.changed_ports,
                failed = report.failed,
                services = self.snapshot.len(),
                elapsed_ms = report.duration.as_millis() as u64,
                "synced proxy rules"
            );
        }
        report
    }

    /// UDP has no connection to close: a flow DNATed to an endpoint that is gone, or stuck
    /// on a REJECT from when the service had no endpoints, lives on in conntrack until it
    /// times out unless we delete it (upstream's conntrack cleanup).
    fn clear_stale_udp(
        &self,
        changed: &BTreeSet<ServicePortName>,
        old: &HashMap<ServicePortName, ServiceEntry>,
    ) {
        let zone = self.ctx.zone.as_deref();
        let usable = |e: &ServiceEntry| -> BTreeSet<std::net::Ipv4Addr> {
            let c = categorize(&e.port, &e.endpoints, zone);
            c.cluster.iter().chain(&c.local).map(|e| e.ip).collect()
        };
        for name in changed {
            if name.protocol != crate::model::Protocol::Udp {
                continue;
            }
            // A service new to this proxy counts as one that had no endpoints: a client may
            // have sent before it existed, and its flow would stay un-NATed in conntrack.
            let before = old.get(name);
            let after = self.snapshot.get(name);
            let Some(p) = before.or(after).map(|e| &e.port) else {
                continue;
            };
            let was = before.map(usable).unwrap_or_default();
            let now = after.map(usable).unwrap_or_default();
            for gone in was.difference(&now) {
                conntrack::clear_endpoint_flows(p, *gone);
            }
            if was.is_empty() && !now.is_empty() {
                conntrack::clear_service_flows(p);
            }
        }
    }

    /// healthCheckNodePort → this node's endpoint count, for the service health servers.
    pub fn health_check_ports(&self) -> HashMap<u16, ServiceHealth> {
        let mut out = HashMap::new();
        for e in self.snapshot.values() {
            if let Some(port) = e.port.health_check_node_port {
                let c = categorize(&e.port, &e.endpoints, self.ctx.zone.as_deref());
                out.insert(
                    port,
                    ServiceHealth {
                        namespace: e.port.name.namespace.clone(),
                        name: e.port.name.name.clone(),
                        local_endpoints: c.local.len(),
                    },
                );
            }
        }
        out
    }
}

/// A message to the sync loop.
pub enum Wake {
    /// Something changed in the tracker.
    Changed,
    /// The node's context (zone) changed.
    Context(NodeContext),
}

/// Runs syncs until `rx` is closed. `ready` gates the first sync until the initial lists
/// of services and endpoint slices are in (so the first sync is a complete one).
pub fn run_loop(
    mut proxier: Proxier,
    rx: mpsc::Receiver<Wake>,
    periods: Periods,
    ready: impl Fn() -> bool,
    mut after_sync: impl FnMut(&Proxier),
) {
    let mut last_sync: Option<Instant> = None;
    loop {
        // Wait for a change or the next periodic full sync.
        let wait = proxier
            .last_full
            .map(|t| periods.sync.saturating_sub(t.elapsed()))
            .unwrap_or(Duration::from_millis(100));
        match rx.recv_timeout(wait) {
            Ok(Wake::Changed) => {}
            Ok(Wake::Context(c)) => proxier.set_context(c),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if !ready() {
            continue;
        }
        if let Some(t) = last_sync {
            let since = t.elapsed();
            if since < periods.min_sync {
                std::thread::sleep(periods.min_sync - since);
            }
        }
        // Everything that arrived meanwhile rides along in this sync.
        loop {
            match rx.try_recv() {
                Ok(Wake::Context(c)) => proxier.set_context(c),
                Ok(Wake::Changed) => {}
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        }
        let dirty = proxier
            .tracker
            .lock()
            .map(|t| t.has_changes())
            .unwrap_or(false);
        if !dirty && !proxier.full_due(periods.sync) {
            continue;
        }
        proxier.sync(false, periods.sync);
        last_sync = Some(Instant::now());
        after_sync(&proxier);
        proxier.backend.idle();
    }
}
