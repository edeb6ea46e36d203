//! Graceful node shutdown (upstream's pkg/kubelet/nodeshutdown): the kubelet holds a
//! logind "delay" inhibitor lock so a `systemctl poweroff` waits for it; on logind's
//! `PrepareForShutdown(true)` it marks the node not ready ("node is shutting down"),
//! refuses new pods, and terminates the running ones in groups of rising priority — each
//! group within its own budget — before it releases the lock and lets the shutdown go on.
//!
//! The budgets come from `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods`
//! (two groups: ordinary pods first, then those of system-critical priority), or from
//! `shutdownGracePeriodByPodPriority` directly. The manager is given what it needs from
//! the kubelet — the active pods and a function that terminates one and returns once it
//! has stopped — rather than the kubelet core, as upstream's eviction manager is.

mod logind;

pub use logind::Logind;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// The terminated pods' status reason and message, and the admission refusal while the
/// node goes down (upstream's texts).
pub const REASON: &str = "Terminated";
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
pub const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// The Ready condition's message while shutting down.
pub const STATUS_ERROR: &str = "node is shutting down";

/// upstream's scheduling.SystemCriticalPriority: the lowest priority of the
/// system-cluster-critical and system-node-critical classes.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// One `shutdownGracePeriodByPodPriority` entry: pods of at least `priority` (and below the
/// next entry's) get `shutdown_grace_period_seconds` in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityGracePeriod {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}

/// The manager's configuration, as the KubeletConfiguration gives it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    pub shutdown_grace_period: Duration,
    pub shutdown_grace_period_critical_pods: Duration,
    pub by_pod_priority: Vec<PriorityGracePeriod>,
}

impl Config {
    /// upstream's validation of the three fields, with its messages.
    pub fn validate(&self) -> Result<(), String> {
        let (g, c) = (
            self.shutdown_grace_period,
            self.shutdown_grace_period_critical_pods,
        );
        if c > g {
            return Err(format!(
                "invalid configuration: shutdownGracePeriod ({g:?}) must be >= 0, shutdownGracePeriodCriticalPods ({c:?}) must be >= 0 and <= shutdownGracePeriod"
            ));
        }
        for (name, d) in [
            ("shutdownGracePeriod", g),
            ("shutdownGracePeriodCriticalPods", c),
        ] {
            if !d.is_zero() && d < Duration::from_secs(1) {
                return Err(format!(
                    "invalid configuration: {name} ({d:?}) must be either zero or otherwise >= 1 sec"
                ));
            }
        }
        if !self.by_pod_priority.is_empty() && !g.is_zero() {
            return Err("invalid configuration: Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time".into());
        }
        for p in &self.by_pod_priority {
            if p.shutdown_grace_period_seconds < 0 {
                return Err(format!(
                    "invalid configuration: shutdownGracePeriodByPodPriority priority {}: shutdownGracePeriodSeconds ({}) must be >= 0",
                    p.priority, p.shutdown_grace_period_seconds
                ));
            }
        }
        Ok(())
    }

    /// The groups, lowest priority first (upstream's migrateConfig for the two-field
    /// form); empty when graceful shutdown is off.
    pub fn groups(&self) -> Vec<PriorityGracePeriod> {
        let mut groups = if self.by_pod_priority.is_empty() {
            migrate(
                self.shutdown_grace_period,
                self.shutdown_grace_period_critical_pods,
            )
        } else {
            self.by_pod_priority.clone()
        };
        groups.sort_by_key(|g| g.priority);
        groups
    }
}

fn migrate(requested: Duration, critical: Duration) -> Vec<PriorityGracePeriod> {
    if requested.is_zero() || critical > requested {
        return Vec::new();
    }
    vec![
        PriorityGracePeriod {
            priority: 0,
            shutdown_grace_period_seconds: (requested - critical).as_secs() as i64,
        },
        PriorityGracePeriod {
            priority: SYSTEM_CRITICAL_PRIORITY,
            shutdown_grace_period_seconds: critical.as_secs() as i64,
        },
    ]
}

/// How long logind must let the kubelet delay a shutdown: every group's budget.
pub fn period_requested(groups: &[PriorityGracePeriod]) -> Duration {
    Duration::from_secs(
        groups
            .iter()
            .map(|g| g.shutdown_grace_period_seconds.max(0) as u64)
            .sum(),
    )
}

/// Which group each pod falls in (upstream's groupByPriority): the highest group whose
/// priority the pod reaches; pods below the lowest group go in the lowest.
pub fn group_by_priority(groups: &[PriorityGracePeriod], pods: Vec<Pod>) -> Vec<Vec<Pod>> {
    let mut out: Vec<Vec<Pod>> = vec![Vec::new(); groups.len()];
    if groups.is_empty() {
        return out;
    }
    for pod in pods {
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let index = groups
            .iter()
            .rposition(|g| g.priority <= priority)
            .unwrap_or(0);
        out[index].push(pod);
    }
    out
}

/// A pod's grace period in its group: the group's budget, or the pod's own
/// terminationGracePeriodSeconds when that is shorter.
pub fn pod_grace(pod: &Pod, group: &PriorityGracePeriod) -> i64 {
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds);
    match own {
        Some(own) if own <= group.shutdown_grace_period_seconds => own,
        _ => group.shutdown_grace_period_seconds,
    }
}

/// Whether the node is shutting down, shared with node status and admission.
#[derive(Default)]
pub struct State {
    shutting_down: AtomicBool,
    changed: Notify,
}

impl State {
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    fn set(&self, on: bool) {
        self.shutting_down.store(on, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Resolves when the state changes (node status reports it at once).
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// The shutdown manager's admit handler: nothing new starts on a node going down.
    pub fn admit(&self) -> Result<(), crate::admission::Rejection> {
        if self.shutting_down() {
            return Err(crate::admission::Rejection {
                reason: crate::admission::Reason::NodeShutdown,
                message: NOT_ADMITTED_MESSAGE.into(),
            });
        }
        Ok(())
    }
}

impl crate::admission::PodAdmitHandler for State {
    fn admit<'a>(
        &'a self,
        _: &'a crate::admission::PodAdmitAttributes<'a>,
    ) -> BoxFuture<'a, crate::admission::PodAdmitResult> {
        let r = State::admit(self).into();
        Box::pin(async move { r })
    }
}

/// Terminates a pod with the given grace period (marking its status as upstream's
/// shutdown does) and resolves once it has stopped.
pub type KillPod = Arc<dyn Fn(Pod, i64) -> BoxFuture<'static, ()> + Send + Sync>;

pub struct Manager {
    pub groups: Vec<PriorityGracePeriod>,
    pub state: Arc<State>,
    pub node: String,
    pub active_pods: Box<dyn Fn() -> Vec<Pod> + Send + Sync>,
    pub kill_pod: KillPod,
}

/// How soon a lost logind connection is tried again (upstream's dbusReconnectPeriod).
const RECONNECT: Duration = Duration::from_secs(1);

impl Manager {
    /// Watches logind for shutdowns for ever. A logind that cannot be reached or refuses
    /// the lock is logged and retried; the node runs on without graceful shutdown meanwhile.
    pub async fn run(self) {
        if self.groups.is_empty() {
            tracing::info!("No graceful configuration specified, node shutdown will be immediate");
            return;
        }
        tracing::info!(groups = ?self.groups, "Creating node shutdown manager");
        let mut logged = false;
        loop {
            match self.watch().await {
                Ok(()) => tracing::info!("Restarting watch for node shutdown events"),
                Err(e) if !logged => {
                    tracing::error!(error = %e, "Unable to watch the node for shutdown events; node shutdown will be immediate until logind answers");
                    logged = true;
                }
                Err(e) => tracing::debug!(error = %e, "node shutdown watch failed again"),
            }
            tokio::time::sleep(RECONNECT).await;
        }
    }

    /// One logind connection: take the lock, wait for PrepareForShutdown signals.
    async fn watch(&self) -> Result<(), logind::Error> {
        let logind = Logind::connect().await?;
        let requested = period_requested(&self.groups);
        let current = logind.inhibit_delay_max().await?;
        if requested > current {
            logind.override_inhibit_delay(requested)?;
            logind.reload().await?;
            let updated = logind.inhibit_delay_max().await?;
            if requested > updated {
                return Err(logind::Error::Delay { requested, updated });
            }
        }
        let mut lock = Some(logind.inhibit().await?);
        tracing::info!(
            delay = ?requested,
            "node shutdown manager holds logind's delay inhibitor lock"
        );
        let mut signals = logind.prepare_for_shutdown().await?;
        while let Some(active) = signals.next().await {
            let active = active?;
            let what = if active {
                "Shutdown manager detected shutdown event"
            } else {
                "Shutdown manager detected shutdown cancellation"
            };
            tracing::info!(event = active, "{what}");
            crate::events::recorder().event(
                &crate::events::node_ref(&self.node),
                crate::events::NORMAL,
                "NodeShutdown",
                what,
            );
            self.state.set(active);
            if active {
                self.terminate_pods().await;
                // Dropping the lock's descriptor releases it: the shutdown goes on.
                drop(lock.take());
                tracing::info!(
                    "Shutdown manager completed processing shutdown event, node will shutdown shortly"
                );
            } else if lock.is_none() {
                lock = Some(logind.inhibit().await?);
            }
        }
        Ok(())
    }

    /// upstream's processShutdownEvent: group by group, lowest priority first; each group's
    /// pods are killed together and waited for at most the group's budget.
    async fn terminate_pods(&self) {
        let groups = group_by_priority(&self.groups, (self.active_pods)());
        for (group, pods) in self.groups.iter().zip(groups) {
            if pods.is_empty() {
                continue;
            }
            let kills = pods.into_iter().map(|pod| {
                let grace = pod_grace(&pod, group);
                tracing::info!(pod = %crate::kuberuntime::sync_pod::pod_name(&pod), grace, "Shutdown manager killing pod with gracePeriod");
                (self.kill_pod)(pod, grace)
            });
            let budget = Duration::from_secs(group.shutdown_grace_period_seconds.max(0) as u64);
            if tokio::time::timeout(budget, futures::future::join_all(kills))
                .await
                .is_err()
            {
                tracing::info!(
                    grace_period = group.shutdown_grace_period_seconds,
                    priority = group.priority,
                    "Shutdown manager pod killing time out"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
