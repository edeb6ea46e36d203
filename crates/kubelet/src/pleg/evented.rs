//! The evented PLEG: the runtime pushes container events (GetContainerEvents) and the
//! kubelet reacts at once; the generic relist keeps running as a slow backstop (300s, as
//! upstream) and takes over at its normal 1s pace whenever the stream is down.

use super::generic::Period;
use super::{EventType, Health, PodLifecycleEvent};
use crate::cri::Runtime;
use crate::kuberuntime::labels;
use cri::runtime::v1 as pb;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// upstream's genericPlegRelistPeriod when evented PLEG is on.
pub const BACKSTOP_RELIST: Duration = Duration::from_secs(300);
pub const NORMAL_RELIST: Duration = Duration::from_secs(1);

fn to_event(r: &pb::ContainerEventResponse) -> Option<PodLifecycleEvent> {
    let uid = r
        .pod_sandbox_status
        .as_ref()
        .and_then(|s| {
            s.labels
                .get(labels::POD_UID)
                .cloned()
                .or_else(|| s.metadata.as_ref().map(|m| m.uid.clone()))
        })
        .filter(|u| !u.is_empty())?;
    let kind = match pb::ContainerEventType::try_from(r.container_event_type).ok()? {
        // As upstream's evented PLEG: a created container changes nothing a sync acts on
        // (the generic relist ignores the state too), so it makes no lifecycle event.
        pb::ContainerEventType::ContainerCreatedEvent => return None,
        pb::ContainerEventType::ContainerStartedEvent => EventType::ContainerStarted,
        pb::ContainerEventType::ContainerStoppedEvent => EventType::ContainerDied,
        pb::ContainerEventType::ContainerDeletedEvent => EventType::ContainerRemoved,
    };
    Some(PodLifecycleEvent {
        pod_uid: uid,
        kind,
        data: r.container_id.clone(),
    })
}

/// Follows the event stream forever, reconnecting with a pause when it breaks.
pub async fn run(
    rt: Runtime,
    relist: Arc<Period>,
    health: Arc<Health>,
    tx: UnboundedSender<PodLifecycleEvent>,
) {
    loop {
        match rt
            .runtime
            .clone()
            .get_container_events(pb::GetEventsRequest {})
            .await
        {
            Ok(stream) => {
                tracing::info!(
                    "evented PLEG: following the runtime's container events; relist is the backstop"
                );
                relist.set(BACKSTOP_RELIST);
                health.set_evented(true);
                health.active();
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(r)) => {
                            health.active();
                            if let Some(ev) = to_event(&r) {
                                tracing::debug!(pod_uid = %ev.pod_uid, event = ?ev.kind, container = %ev.data, "evented PLEG event");
                                if tx.send(ev).is_err() {
                                    return;
                                }
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(error = %e.message(), "container event stream broke; relisting every second");
                            break;
                        }
                    }
                }
            }
            Err(e) if e.code() == tonic::Code::Unimplemented => {
                tracing::warn!(
                    "the runtime does not implement GetContainerEvents; using the generic PLEG"
                );
                relist.set(NORMAL_RELIST);
                health.set_evented(false);
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e.message(), "cannot follow container events yet");
            }
        }
        relist.set(NORMAL_RELIST);
        health.set_evented(false);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
