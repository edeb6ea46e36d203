//! Leader election, as client-go's `tools/leaderelection` with a `LeaseLock`: several
//! control planes on one store each run the API server, but the scheduler only in the one
//! holding the `kube-system/kube-scheduler` Lease and the controllers only in the one
//! holding `kube-system/kube-controller-manager`.
//!
//! A candidate reads the Lease every retry period. It takes it when nobody holds it or when
//! the record it sees has not changed for `leaseDurationSeconds` *by its own clock* (the
//! time it first observed that version of the record), never by comparing the holder's
//! `renewTime` with its own wall clock, so skewed clocks cannot hand the lease over early.
//! The leader renews every retry period; when no renewal succeeds within the renew
//! deadline it stops leading (stops its tasks) before any other candidate can see the lease
//! expire. On graceful shutdown it releases the Lease (client-go's `ReleaseOnCancel`):
//! holder cleared and `leaseDurationSeconds` 1, so a successor need not wait.
//!
//! Upstream's kube-scheduler and kube-controller-manager exit when they lose the lease and
//! let their supervisor restart them. Here the API server shares the process, so losing a
//! lease stops only that component's tasks and the process goes back to candidacy; winning
//! again starts them anew, with fresh informer caches.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::apiserver::state::ApiState;
use crate::controllers::events::Recorder;
use crate::controllers::objects;
use crate::storage::{Store, StoreError, Stored};

/// client-go's `JitterFactor`: retries wait between retryPeriod and 2.2 × retryPeriod.
const JITTER_FACTOR: f64 = 1.2;

/// `--leader-elect*` flags of kube-scheduler and kube-controller-manager, with their
/// defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaderElectionConfig {
    /// `--leader-elect` (true).
    pub leader_elect: bool,
    /// `--leader-elect-lease-duration` (15s): how long a candidate waits after it last saw
    /// the record change before it takes the lease.
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline` (10s): how long the leader keeps retrying a renewal
    /// before it stops leading.
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period` (2s): the time between tries.
    pub retry_period: Duration,
    /// `--leader-elect-resource-namespace` (kube-system).
    pub resource_namespace: String,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            leader_elect: true,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            resource_namespace: "kube-system".into(),
        }
    }
}

impl LeaderElectionConfig {
    /// client-go's `NewLeaderElector` checks, with its messages.
    pub fn validate(&self) -> Result<(), String> {
        if self.lease_duration <= self.renew_deadline {
            return Err("leaseDuration must be greater than renewDeadline".into());
        }
        if self.renew_deadline <= self.retry_period.mul_f64(JITTER_FACTOR) {
            return Err("renewDeadline must be greater than retryPeriod*JitterFactor".into());
        }
        if self.lease_duration.is_zero() {
            return Err("leaseDuration must be greater than zero".into());
        }
        if self.renew_deadline.is_zero() {
            return Err("renewDeadline must be greater than zero".into());
        }
        if self.retry_period.is_zero() {
            return Err("retryPeriod must be greater than zero".into());
        }
        if self.resource_namespace.is_empty() {
            return Err("resourceNamespace is required".into());
        }
        Ok(())
    }
}

/// The Leases the control plane's components elect with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Scheduler,
    ControllerManager,
}

impl Component {
    /// The Lease's name, as upstream's components use it.
    pub fn lease_name(self) -> &'static str {
        match self {
            Component::Scheduler => "kube-scheduler",
            Component::ControllerManager => "kube-controller-manager",
        }
    }

    /// The event source of its LeaderElection events.
    fn event_component(self) -> &'static str {
        match self {
            Component::Scheduler => crate::scheduler::SCHEDULER_NAME,
            Component::ControllerManager => "kube-controller-manager",
        }
    }
}

/// client-go's `LeaderElectionRecord`, as a Lease's spec carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Record {
    pub holder_identity: String,
    pub lease_duration_seconds: u64,
    pub acquire_time: Option<String>,
    pub renew_time: Option<String>,
    pub leader_transitions: i64,
}

impl Record {
    fn from_spec(spec: Option<&Value>) -> Record {
        let s = |k: &str| spec.and_then(|v| v.get(k)).and_then(Value::as_str);
        let n = |k: &str| spec.and_then(|v| v.get(k)).and_then(Value::as_i64);
        Record {
            holder_identity: s("holderIdentity").unwrap_or("").to_string(),
            lease_duration_seconds: n("leaseDurationSeconds").unwrap_or(0).max(0) as u64,
            acquire_time: s("acquireTime").map(str::to_string),
            renew_time: s("renewTime").map(str::to_string),
            leader_transitions: n("leaseTransitions").unwrap_or(0),
        }
    }

    fn to_spec(&self) -> Value {
        json!({
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.leader_transitions,
        })
    }
}

/// What one candidate knows: the record it last observed and when (by its own clock).
/// The decision of `tryAcquireOrRenew` is [`Elector::decide`], free of I/O.
#[derive(Debug)]
pub(crate) struct Elector {
    pub identity: String,
    lease_duration_seconds: u64,
    observed: Option<Record>,
    observed_time: Option<Instant>,
}

impl Elector {
    pub(crate) fn new(identity: String, lease_duration: Duration) -> Elector {
        Elector {
            identity,
            lease_duration_seconds: lease_duration.as_secs().max(1),
            observed: None,
            observed_time: None,
        }
    }

    pub(crate) fn is_leader(&self) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|r| r.holder_identity == self.identity)
    }

    /// Whether the observed record is still in force at `now`: observed time plus its
    /// lease duration, both on this candidate's clock.
    fn lease_valid(&self, now: Instant) -> bool {
        match (&self.observed, self.observed_time) {
            (Some(r), Some(t)) => t + Duration::from_secs(r.lease_duration_seconds) > now,
            _ => false,
        }
    }

    fn set_observed(&mut self, r: Record, now: Instant) {
        self.observed = Some(r);
        self.observed_time = Some(now);
    }

    /// The record this candidate would write, holding the lease from `wall` on.
    fn own_record(&self, wall: &str) -> Record {
        Record {
            holder_identity: self.identity.clone(),
            lease_duration_seconds: self.lease_duration_seconds,
            acquire_time: Some(wall.to_string()),
            renew_time: Some(wall.to_string()),
            leader_transitions: 0,
        }
    }

    /// The leader's optimistic renewal (step 1 of `tryAcquireOrRenew`): while it leads and
    /// its lease is valid, it writes over the record it last wrote without reading first.
    pub(crate) fn fast_renewal(&self, now: Instant, wall: &str) -> Option<Record> {
        if !(self.is_leader() && self.lease_valid(now)) {
            return None;
        }
        let old = self.observed.as_ref()?;
        Some(Record {
            acquire_time: old.acquire_time.clone(),
            leader_transitions: old.leader_transitions,
            ..self.own_record(wall)
        })
    }

    /// Steps 3 and 4 of `tryAcquireOrRenew` on the record just read: notes a changed
    /// record (restarting its expiry clock), and returns the record to write, or None
    /// while another holder's lease has not expired by this candidate's observation.
    pub(crate) fn decide(&mut self, current: Record, now: Instant, wall: &str) -> Option<Record> {
        if self.observed.as_ref() != Some(&current) {
            self.set_observed(current.clone(), now);
        }
        if !current.holder_identity.is_empty() && self.lease_valid(now) && !self.is_leader() {
            return None;
        }
        let mut next = self.own_record(wall);
        if self.is_leader() {
            next.acquire_time = current.acquire_time;
            next.leader_transitions = current.leader_transitions;
        } else {
            next.leader_transitions = current.leader_transitions + 1;
        }
        Some(next)
    }

    /// Records a successful write of `r`.
    pub(crate) fn wrote(&mut self, r: Record, now: Instant) {
        self.set_observed(r, now);
    }

    /// Forgets what was observed: a fresh candidacy after leadership was lost.
    fn reset(&mut self) {
        self.observed = None;
        self.observed_time = None;
    }
}

/// `<hostname>_<uuid>`, as kube-scheduler and kube-controller-manager name themselves.
pub fn identity() -> String {
    // Go's os.Hostname reads this file first on Linux.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "localhost".to_string()
    } else {
        host
    };
    format!("{host}_{}", crate::apiserver::rest::new_uid())
}

/// metav1.MicroTime's RFC 3339 form with microseconds.
fn micro_time_now() -> String {
    let ts = crate::apiserver::rest::now_ts();
    format!(
        "{}.{:06}Z",
        ts.strftime("%Y-%m-%dT%H:%M:%S"),
        ts.subsec_microsecond()
    )
}

fn lease_key(namespace: &str, name: &str) -> String {
    objects::key_of("coordination.k8s.io", "leases", Some(namespace), name)
}

/// Starts a component's tasks when this process wins its lease.
pub type StartFn = Box<dyn Fn(&mut JoinSet<()>) + Send + Sync>;

/// One Lease's candidate: reads and writes the Lease through the store the API server
/// serves.
struct LeaseLock {
    store: Arc<dyn Store>,
    namespace: String,
    name: String,
    key: String,
    /// The Lease as last read or written, which updates replace (with its revision, so a
    /// concurrent writer makes the update a Conflict).
    last: Option<Stored>,
}

impl LeaseLock {
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(Arc<dyn Store>, String) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.store.clone();
        let key = self.key.clone();
        tokio::task::spawn_blocking(move || f(store, key))
            .await
            .unwrap_or_else(|e| Err(StoreError::Backend(e.to_string())))
    }

    async fn get(&mut self) -> Result<Option<Stored>, StoreError> {
        let got = self.blocking(|s, k| s.get(&k)).await?;
        self.last = got.clone();
        Ok(got)
    }

    async fn create(&mut self, r: &Record) -> Result<(), StoreError> {
        let lease = json!({"metadata": {"name": self.name}, "spec": r.to_spec()});
        let (_, lease) = objects::prepare(
            "coordination.k8s.io",
            "leases",
            Some(&self.namespace),
            lease,
        )?;
        let stored = self.blocking(move |s, k| s.create(&k, lease)).await?;
        self.last = Some(stored);
        Ok(())
    }

    /// Replaces the spec of the Lease last seen, if nobody wrote it since.
    async fn update(&mut self, r: &Record) -> Result<(), StoreError> {
        let Some(last) = self.last.clone() else {
            return Err(StoreError::Backend("lease not initialized".into()));
        };
        let mut lease = (*last.object).clone();
        lease["spec"] = r.to_spec();
        let revision = last.revision;
        let stored = self
            .blocking(move |s, k| s.update(&k, lease, Some(revision)))
            .await?;
        self.last = Some(stored);
        Ok(())
    }
}

/// One candidacy loop for `component`: runs `start`'s tasks while this process leads,
/// until `stop` turns true, then releases the lease.
pub async fn run(
    st: Arc<ApiState>,
    component: Component,
    cfg: LeaderElectionConfig,
    identity: String,
    start: StartFn,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let name = component.lease_name();
    let mut lock = LeaseLock {
        store: st.store.clone(),
        namespace: cfg.resource_namespace.clone(),
        name: name.to_string(),
        key: lease_key(&cfg.resource_namespace, name),
        last: None,
    };
    let lease_desc = format!("{}/{name}", cfg.resource_namespace);
    let mut elector = Elector::new(identity.clone(), cfg.lease_duration);
    let recorder = Recorder::new(component.event_component());
    loop {
        tracing::info!(lease = %lease_desc, "attempting to acquire leader lease");
        loop {
            if try_acquire_or_renew(&mut elector, &mut lock, &lease_desc).await {
                break;
            }
            let wait = cfg
                .retry_period
                .mul_f64(1.0 + rand::random::<f64>() * JITTER_FACTOR);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return,
            }
        }
        tracing::info!(lease = %lease_desc, identity = %identity, "successfully acquired lease");
        record_event(&st, &recorder, &lock, &identity, "became leader");
        let mut tasks = JoinSet::new();
        start(&mut tasks);
        let stopping = loop {
            tokio::select! {
                _ = tokio::time::sleep(cfg.retry_period) => {}
                _ = stop.changed() => break true,
            }
            if !renew(&mut elector, &mut lock, &lease_desc, &cfg).await {
                break false;
            }
        };
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        if stopping {
            release(&mut elector, &mut lock, &lease_desc).await;
            return;
        }
        tracing::error!(lease = %lease_desc, "failed to renew lease: timed out waiting for the condition");
        tracing::error!(lease = %lease_desc, "leaderelection lost; stopped leading, back to candidacy");
        record_event(&st, &recorder, &lock, &identity, "stopped leading");
        elector.reset();
    }
}

/// The leader's renewal: retries every retry period until one succeeds or the renew
/// deadline passes (client-go's PollImmediateUntil under a RenewDeadline timeout).
async fn renew(
    elector: &mut Elector,
    lock: &mut LeaseLock,
    desc: &str,
    cfg: &LeaderElectionConfig,
) -> bool {
    let deadline = Instant::now() + cfg.renew_deadline;
    loop {
        if let Ok(true) =
            tokio::time::timeout_at(deadline, try_acquire_or_renew(elector, lock, desc)).await
        {
            return true;
        }
        let next = Instant::now() + cfg.retry_period;
        if next >= deadline {
            return false;
        }
        tokio::time::sleep_until(next).await;
    }
}

/// client-go's `tryAcquireOrRenew`: true when this candidate holds the lease afterwards.
async fn try_acquire_or_renew(elector: &mut Elector, lock: &mut LeaseLock, desc: &str) -> bool {
    let wall = micro_time_now();
    if let Some(r) = elector.fast_renewal(Instant::now(), &wall) {
        match lock.update(&r).await {
            Ok(()) => {
                elector.wrote(r, Instant::now());
                return true;
            }
            Err(e) => tracing::warn!(lease = %desc, error = %e,
                "failed to update lock optimistically, falling back to slow path"),
        }
    }
    let current = match lock.get().await {
        Ok(Some(s)) => Record::from_spec(s.object.get("spec")),
        Ok(None) => {
            let r = elector.own_record(&wall);
            return match lock.create(&r).await {
                Ok(()) => {
                    elector.wrote(r, Instant::now());
                    true
                }
                Err(e) => {
                    tracing::warn!(lease = %desc, error = %e, "error initially creating leader election record");
                    false
                }
            };
        }
        Err(e) => {
            tracing::warn!(lease = %desc, error = %e, "error retrieving resource lock");
            return false;
        }
    };
    let Some(next) = elector.decide(current, Instant::now(), &wall) else {
        tracing::debug!(lease = %desc, "lock is held by another and has not yet expired");
        return false;
    };
    match lock.update(&next).await {
        Ok(()) => {
            elector.wrote(next, Instant::now());
            true
        }
        Err(e) => {
            tracing::warn!(lease = %desc, error = %e, "failed to update lock");
            false
        }
    }
}

/// client-go's `release`: the holder cleared and a 1 s lease, keeping the transitions.
async fn release(elector: &mut Elector, lock: &mut LeaseLock, desc: &str) {
    if !elector.is_leader() {
        return;
    }
    let wall = micro_time_now();
    let transitions = elector
        .observed
        .as_ref()
        .map(|r| r.leader_transitions)
        .unwrap_or(0);
    let r = released(transitions, &wall);
    match tokio::time::timeout(Duration::from_secs(5), lock.update(&r)).await {
        Ok(Ok(())) => tracing::info!(lease = %desc, "released leader lease"),
        Ok(Err(e)) => tracing::warn!(lease = %desc, error = %e, "failed to release lock"),
        Err(_) => tracing::warn!(lease = %desc, "failed to release lock: timed out"),
    }
}

fn released(transitions: i64, wall: &str) -> Record {
    Record {
        holder_identity: String::new(),
        lease_duration_seconds: 1,
        acquire_time: Some(wall.to_string()),
        renew_time: Some(wall.to_string()),
        leader_transitions: transitions,
    }
}

/// The embedded store is locked to one process, so a holder recorded in it at start is a
/// previous run of this server killed before it could release: release on its behalf, so
/// a restart does not wait out the lease.
pub fn release_stale(st: &ApiState, namespace: &str) {
    let wall = micro_time_now();
    for c in [Component::Scheduler, Component::ControllerManager] {
        let key = lease_key(namespace, c.lease_name());
        let out = objects::modify(st, &key, &mut |lease| {
            let r = Record::from_spec(lease.get("spec"));
            if r.holder_identity.is_empty() {
                return false;
            }
            lease["spec"] = released(r.leader_transitions, &wall).to_spec();
            true
        });
        if let Err(e) = out {
            tracing::warn!(lease = %key, error = %e, "could not release a stale lease");
        }
    }
}

/// The `LeaderElection` event client-go's LeaseLock records: "<identity> <what>".
fn record_event(st: &ApiState, recorder: &Recorder, lock: &LeaseLock, identity: &str, what: &str) {
    let Some(lease) = lock.last.as_ref() else {
        return;
    };
    recorder.record(
        st,
        &lease.object,
        "Normal",
        "LeaderElection",
        &format!("{identity} {what}"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "host-a_1";
    const OTHER: &str = "host-b_2";

    fn held_by(holder: &str, transitions: i64, renew: &str) -> Record {
        Record {
            holder_identity: holder.into(),
            lease_duration_seconds: 15,
            acquire_time: Some("2026-01-01T00:00:00.000000Z".into()),
            renew_time: Some(renew.into()),
            leader_transitions: transitions,
        }
    }

    /// One row: what the candidate saw before (and how long ago), what it reads now, and
    /// whether it writes (with which transitions count).
    struct Row {
        name: &'static str,
        before: Option<(Record, u64)>,
        now: Record,
        takes: Option<i64>,
    }

    #[test]
    fn the_election_decision_follows_the_observation_clock() {
        let t0 = Instant::now();
        let wall = "2026-01-01T00:01:00.000000Z";
        let rows = [
            Row {
                name: "nobody holds it (released)",
                before: None,
                now: held_by("", 3, "r1"),
                takes: Some(4),
            },
            Row {
                name: "another holds it, first seen now: not expired",
                before: None,
                now: held_by(OTHER, 1, "r1"),
                takes: None,
            },
            Row {
                name: "another's record unchanged for 14 s of our clock: not expired",
                before: Some((held_by(OTHER, 1, "r1"), 14)),
                now: held_by(OTHER, 1, "r1"),
                takes: None,
            },
            Row {
                name: "another's record unchanged for 16 s of our clock: expired, taken",
                before: Some((held_by(OTHER, 1, "r1"), 16)),
                now: held_by(OTHER, 1, "r1"),
                takes: Some(2),
            },
            Row {
                // Its renewTime may be far in the past by our wall clock (skew): only the
                // change of the record counts, and it just changed.
                name: "another renewed since we looked: the clock restarts",
                before: Some((held_by(OTHER, 1, "r1"), 60)),
                now: held_by(OTHER, 1, "r2"),
                takes: None,
            },
            Row {
                name: "we hold it: renewed, acquire time and transitions kept",
                before: Some((held_by(ME, 5, "r1"), 1)),
                now: held_by(ME, 5, "r1"),
                takes: Some(5),
            },
            Row {
                name: "we held it but another took it since: not ours",
                before: Some((held_by(ME, 5, "r1"), 20)),
                now: held_by(OTHER, 6, "r9"),
                takes: None,
            },
        ];
        for row in rows {
            let mut e = Elector::new(ME.into(), Duration::from_secs(15));
            let kept = row
                .before
                .as_ref()
                .is_some_and(|(b, _)| b.holder_identity == ME);
            let now = match row.before {
                Some((r, ago)) => {
                    e.set_observed(r, t0);
                    t0 + Duration::from_secs(ago)
                }
                None => t0,
            };
            let acquire_before = row.now.acquire_time.clone();
            let got = e.decide(row.now, now, wall);
            assert_eq!(
                got.as_ref().map(|r| r.leader_transitions),
                row.takes,
                "{}",
                row.name
            );
            if let Some(r) = got {
                assert_eq!(r.holder_identity, ME, "{}", row.name);
                assert_eq!(r.renew_time.as_deref(), Some(wall), "{}", row.name);
                assert_eq!(r.lease_duration_seconds, 15, "{}", row.name);
                let want = if kept {
                    acquire_before
                } else {
                    Some(wall.to_string())
                };
                assert_eq!(r.acquire_time, want, "{}", row.name);
            }
        }
    }

    #[test]
    fn the_leader_renews_optimistically_only_while_its_lease_is_valid() {
        let t0 = Instant::now();
        let mut e = Elector::new(ME.into(), Duration::from_secs(15));
        assert!(e.fast_renewal(t0, "w").is_none(), "not leader yet");
        e.wrote(held_by(ME, 2, "r1"), t0);
        let r = e
            .fast_renewal(t0 + Duration::from_secs(10), "w2")
            .expect("valid");
        assert_eq!(r.leader_transitions, 2);
        assert_eq!(r.renew_time.as_deref(), Some("w2"));
        assert!(e.fast_renewal(t0 + Duration::from_secs(15), "w3").is_none());
    }

    #[test]
    fn the_record_round_trips_through_a_lease_spec() {
        let r = held_by(OTHER, 7, "2026-01-01T00:00:05.123456Z");
        assert_eq!(Record::from_spec(Some(&r.to_spec())), r);
        assert_eq!(Record::from_spec(None), Record::default());
    }

    #[test]
    fn flags_are_checked_as_client_go_checks_them() {
        let ok = LeaderElectionConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        let with = |f: &dyn Fn(&mut LeaderElectionConfig)| {
            let mut c = LeaderElectionConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert_eq!(
            with(&|c| c.renew_deadline = Duration::from_secs(15)),
            "leaseDuration must be greater than renewDeadline"
        );
        assert_eq!(
            with(&|c| c.retry_period = Duration::from_secs(9)),
            "renewDeadline must be greater than retryPeriod*JitterFactor"
        );
        assert_eq!(
            with(&|c| c.retry_period = Duration::ZERO),
            "retryPeriod must be greater than zero"
        );
    }

    #[test]
    fn identity_is_hostname_underscore_uuid() {
        let id = identity();
        let (host, uuid) = id.rsplit_once('_').expect("underscore");
        assert!(!host.is_empty());
        assert_eq!(uuid.len(), 36, "{id}");
    }
}
