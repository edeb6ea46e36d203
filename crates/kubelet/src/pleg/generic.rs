//! The generic PLEG: relist the runtime, diff with the previous listing, emit events.

use super::{EventType, Health, PodLifecycleEvent};
use crate::cri::Runtime;
use crate::kuberuntime::runtime_pod::{PodSummary, list_pods};
use crate::metrics::Metrics;
use cri::runtime::v1 as pb;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// The relist period, changeable at run time: 1s alone, 300s as the evented PLEG's backstop.
#[derive(Debug)]
pub struct Period(AtomicU64);

impl Period {
    pub fn new(d: Duration) -> Period {
        Period(AtomicU64::new(d.as_millis() as u64))
    }
    pub fn set(&self, d: Duration) {
        self.0.store(d.as_millis() as u64, Ordering::Relaxed);
    }
    pub fn get(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::Relaxed))
    }
}

fn state_name(s: i32) -> &'static str {
    match pb::ContainerState::try_from(s) {
        Ok(pb::ContainerState::ContainerCreated) => "created",
        Ok(pb::ContainerState::ContainerRunning) => "running",
        Ok(pb::ContainerState::ContainerExited) => "exited",
        _ => "unknown",
    }
}

/// The events between two listings of one pod (upstream's generateEvents).
pub fn diff(
    uid: &str,
    old: Option<&PodSummary>,
    new: Option<&PodSummary>,
) -> Vec<PodLifecycleEvent> {
    let empty = PodSummary::default();
    let old = old.unwrap_or(&empty);
    let new = new.unwrap_or(&empty);
    let mut out = Vec::new();
    let olds: HashMap<&str, i32> = old
        .containers
        .iter()
        .map(|(id, _, s)| (id.as_str(), *s))
        .collect();
    let news: HashMap<&str, i32> = new
        .containers
        .iter()
        .map(|(id, _, s)| (id.as_str(), *s))
        .collect();
    let mut ids: Vec<&str> = olds.keys().chain(news.keys()).copied().collect();
    ids.sort();
    ids.dedup();
    for id in ids {
        let o = olds
            .get(id)
            .map(|s| state_name(*s))
            .unwrap_or("non-existent");
        let n = news
            .get(id)
            .map(|s| state_name(*s))
            .unwrap_or("non-existent");
        if o == n {
            continue;
        }
        let kind = match n {
            "running" => EventType::ContainerStarted,
            "exited" => EventType::ContainerDied,
            "unknown" | "created" => EventType::ContainerChanged,
            _ if o == "exited" => EventType::ContainerRemoved,
            _ => EventType::ContainerDied,
        };
        out.push(PodLifecycleEvent {
            pod_uid: uid.to_string(),
            kind,
            data: id.to_string(),
        });
        if n == "non-existent" && o != "exited" {
            // A container that vanished while running also got removed.
            out.push(PodLifecycleEvent {
                pod_uid: uid.to_string(),
                kind: EventType::ContainerRemoved,
                data: id.to_string(),
            });
        }
    }
    if out.is_empty() && old.sandboxes != new.sandboxes {
        out.push(PodLifecycleEvent {
            pod_uid: uid.to_string(),
            kind: EventType::PodSync,
            data: String::new(),
        });
    }
    out
}

/// Relists forever. Events go to `tx`; health and metrics are updated after every relist.
pub async fn run(
    rt: Runtime,
    period: Arc<Period>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    tx: UnboundedSender<PodLifecycleEvent>,
) {
    let mut previous: Option<HashMap<String, PodSummary>> = None;
    loop {
        let started = Instant::now();
        match list_pods(&rt).await {
            Ok(pods) => {
                metrics.observe_relist(started.elapsed());
                health.active();
                if let Some(prev) = &previous {
                    let mut uids: Vec<&String> = prev.keys().chain(pods.keys()).collect();
                    uids.sort();
                    uids.dedup();
                    for uid in uids {
                        for ev in diff(uid, prev.get(uid), pods.get(uid)) {
                            tracing::debug!(pod_uid = %ev.pod_uid, event = ?ev.kind, container = %ev.data, "PLEG event");
                            if tx.send(ev).is_err() {
                                return;
                            }
                        }
                    }
                }
                previous = Some(pods);
            }
            Err(e) => {
                tracing::warn!(error = %e.message(), "PLEG relist failed");
                health.failed(e.message().to_string());
            }
        }
        // Sleep in short steps so a period change (the event stream breaking) applies at once.
        loop {
            let remaining = period.get().saturating_sub(started.elapsed());
            if remaining.is_zero() {
                break;
            }
            tokio::time::sleep(remaining.min(Duration::from_millis(500))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: &[(&str, pb::ContainerState)]) -> PodSummary {
        PodSummary {
            uid: "u".into(),
            containers: containers
                .iter()
                .map(|(id, s)| (id.to_string(), "c".to_string(), *s as i32))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn transitions_become_events() {
        use pb::ContainerState::*;
        let kinds = |o: &PodSummary, n: &PodSummary| -> Vec<EventType> {
            diff("u", Some(o), Some(n))
                .into_iter()
                .map(|e| e.kind)
                .collect()
        };
        assert_eq!(
            kinds(&pod(&[]), &pod(&[("a", ContainerRunning)])),
            vec![EventType::ContainerStarted]
        );
        assert_eq!(
            kinds(
                &pod(&[("a", ContainerRunning)]),
                &pod(&[("a", ContainerExited)])
            ),
            vec![EventType::ContainerDied]
        );
        assert_eq!(
            kinds(&pod(&[("a", ContainerExited)]), &pod(&[])),
            vec![EventType::ContainerRemoved]
        );
        assert_eq!(
            kinds(&pod(&[("a", ContainerRunning)]), &pod(&[])),
            vec![EventType::ContainerDied, EventType::ContainerRemoved]
        );
        assert!(
            kinds(
                &pod(&[("a", ContainerRunning)]),
                &pod(&[("a", ContainerRunning)])
            )
            .is_empty()
        );
    }
}
