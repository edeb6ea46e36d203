//! Warning Events about Nodes (an overlapping pod CIDR), as component `nodus-podnet`.
//! Best effort: a failure to record is logged, never fatal.

use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};

pub(crate) const COMPONENT: &str = "nodus-podnet";
/// The reason of the Event on a node whose pod CIDR overlaps an older node's (the word the
/// node IPAM controller uses when a CIDR cannot be had).
pub(crate) const CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";

/// Records a Warning about `node` from this agent on `host`.
pub(crate) async fn warn_node(
    client: &kube::Client,
    host: &str,
    node: &Node,
    reason: &str,
    message: &str,
) {
    let name = node.metadata.name.clone().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now();
    let ev = Event {
        metadata: ObjectMeta {
            // Upstream names events `<object>.<hex nanoseconds>`.
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: Some("default".into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.clone()),
            uid: node.metadata.uid.clone(),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(host.into()),
        }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(host.into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: None::<MicroTime>,
        count: Some(1),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    if let Err(e) = api.create(&PostParams::default(), &ev).await {
        tracing::warn!(node = %name, reason, error = %e, "cannot record event");
    }
}
