//! GetContainerEvents: a stream of created/started/stopped/deleted events, the feed of the
//! kubelet's evented PLEG. A subscriber that falls behind loses the oldest events and is
//! told so in a log line; the kubelet's relist covers the gap.

use super::Inner;
use cri::runtime::v1 as pb;
use std::pin::Pin;
use tokio_stream::{Stream, StreamExt as _, wrappers::BroadcastStream};
use tonic::Status;

pub type EventStream =
    Pin<Box<dyn Stream<Item = Result<pb::ContainerEventResponse, Status>> + Send>>;

pub fn get_container_events(inner: &Inner, _req: pb::GetEventsRequest) -> EventStream {
    let rx = inner.events.subscribe();
    tracing::debug!(
        subscribers = inner.events.receiver_count(),
        "event subscriber connected"
    );
    Box::pin(BroadcastStream::new(rx).filter_map(|r| match r {
        Ok(ev) => Some(Ok(ev)),
        Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(n)) => {
            tracing::warn!(missed = n, "event subscriber fell behind; events dropped");
            None
        }
    }))
}
