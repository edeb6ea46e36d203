//! The kubelet's EventRecorder: core/v1 Events about pods and the node, with upstream's
//! reasons (Pulling, Pulled, Created, Started, Killing, Unhealthy, BackOff, Failed, …;
//! Starting, NodeReady, NodeNotReady, NodeHasSufficientMemory, …).
//!
//! Recording never blocks and never fails the caller: events go through a bounded queue to
//! one sender task, and when the API server is down or the queue is full they are dropped
//! with a log line, as upstream's broadcaster does. Events are correlated as upstream's
//! EventCorrelator does ([`nodus_k8s::events`], shared with the control plane): from an
//! object's tenth different message of one type and reason within ten minutes they are
//! combined into one "(combined from similar events)" Event, an object's bursts beyond 25
//! are dropped (one more per five minutes), and a repeat of the same event (object, type,
//! reason, message, or the same combined event) within ten minutes bumps `count` and
//! `lastTimestamp` of the existing Event instead of creating another.
//!
//! The process has one recorder, [`recorder()`]: events are emitted deep inside kuberuntime,
//! the probers and the volume code, and one kubelet runs per process, so a shared handle
//! saves threading it through every constructor. It drops everything until
//! [`Recorder::connect`] gives it a client (a standalone kubelet never does).

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodus_k8s::events::{Correlator, Verdict};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// How many events may wait for the sender before new ones are dropped.
const QUEUE: usize = 1000;
/// A repeat within this window updates the existing Event (upstream's default).
const CORRELATION_WINDOW: Duration = Duration::from_secs(600);

struct Record {
    object: ObjectReference,
    type_: String,
    reason: String,
    message: String,
    at: k8s_openapi::jiff::Timestamp,
}

/// Emits Events. Cheap to clone; clones share the queue.
#[derive(Clone, Default)]
pub struct Recorder {
    tx: Arc<Mutex<Option<mpsc::Sender<Record>>>>,
}

static RECORDER: OnceLock<Recorder> = OnceLock::new();

/// The process's recorder.
pub fn recorder() -> &'static Recorder {
    RECORDER.get_or_init(Recorder::default)
}

impl Recorder {
    /// Starts sending events through `client`, as component `kubelet` on host `node`.
    /// Must be called inside a tokio runtime. A second call replaces the first.
    pub fn connect(&self, client: kube::Client, node: &str) {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(send_loop(client, node.to_string(), rx));
        if let Ok(mut g) = self.tx.lock() {
            *g = Some(tx);
        }
    }

    /// Records an event about `object`. `type_` is [`NORMAL`] or [`WARNING`].
    pub fn event(&self, object: &ObjectReference, type_: &str, reason: &str, message: &str) {
        let Ok(g) = self.tx.lock() else { return };
        let Some(tx) = g.as_ref() else { return };
        let r = Record {
            object: object.clone(),
            type_: type_.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            at: crate::config::now_timestamp(),
        };
        if let Err(e) = tx.try_send(r) {
            tracing::info!(reason, error = %e, "event queue full or closed; event dropped");
        }
    }
}

/// A reference to a pod, as events name their object.
pub fn pod_ref(pod: &Pod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        resource_version: pod.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// A reference to one container of a pod (`fieldPath: spec.containers{name}`, or
/// `spec.initContainers{name}` for init containers).
pub fn container_ref(pod: &Pod, container: &str) -> ObjectReference {
    let init = pod.spec.as_ref().is_some_and(|s| {
        s.init_containers
            .iter()
            .flatten()
            .any(|c| c.name == container)
    });
    let field = if init {
        "spec.initContainers"
    } else {
        "spec.containers"
    };
    ObjectReference {
        field_path: Some(format!("{field}{{{container}}}")),
        ..pod_ref(pod)
    }
}

/// A reference to the node: events about nodes name the node as their uid, as upstream's
/// kubelet does, so they exist before the Node object is known.
pub fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        uid: Some(node.to_string()),
        ..Default::default()
    }
}

/// The involved object as the correlator tells objects apart (upstream's aggregate and spam
/// keys: kind, namespace, name, uid, apiVersion; not the field path).
fn object_key(o: &ObjectReference) -> String {
    [&o.kind, &o.namespace, &o.name, &o.uid, &o.api_version]
        .map(|f| f.as_deref().unwrap_or_default())
        .join("\u{0}")
}

/// The key under which a repeat bumps an Event already written: all combined events of one
/// object, type and reason bump the same one, as upstream's logger keys them by the
/// aggregate key.
fn key(r: &Record, combined: bool) -> String {
    let message = if combined {
        "\u{0}combined"
    } else {
        &r.message
    };
    format!(
        "{}/{}/{}/{}/{}/{}",
        r.object.uid.as_deref().unwrap_or_default(),
        r.object.field_path.as_deref().unwrap_or_default(),
        r.object.name.as_deref().unwrap_or_default(),
        r.type_,
        r.reason,
        message
    )
}

struct Seen {
    name: String,
    namespace: String,
    count: i32,
    first: Instant,
}

async fn send_loop(client: kube::Client, node: String, mut rx: mpsc::Receiver<Record>) {
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut correlator = Correlator::default();
    while let Some(mut r) = rx.recv().await {
        seen.retain(|_, s| s.first.elapsed() < CORRELATION_WINDOW);
        let verdict = correlator.correlate(
            &object_key(&r.object),
            &r.type_,
            &r.reason,
            &r.message,
            Instant::now(),
        );
        let Verdict::Record { message, combined } = verdict else {
            tracing::debug!(reason = %r.reason, object = ?r.object.name, "event dropped by the spam filter");
            continue;
        };
        r.message = message;
        let k = key(&r, combined);
        if let Some(s) = seen.get_mut(&k) {
            s.count += 1;
            let api: Api<Event> = Api::namespaced(client.clone(), &s.namespace);
            let mut patch = serde_json::json!({
                "count": s.count,
                "lastTimestamp": Time(r.at),
            });
            if combined {
                // The combined event says what the latest of them said, as upstream's.
                patch["message"] = r.message.clone().into();
            }
            match api
                .patch(&s.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(event = %s.name, error = %e, "cannot update event; creating a new one");
                    seen.remove(&k);
                }
            }
        }
        let namespace = r
            .object
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let nanos = r.at.as_nanosecond();
        let name = format!(
            "{}.{:x}",
            r.object.name.as_deref().unwrap_or("unknown"),
            nanos
        );
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: r.object.clone(),
            reason: Some(r.reason.clone()),
            message: Some(r.message.clone()),
            type_: Some(r.type_.clone()),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some(node.clone()),
            }),
            first_timestamp: Some(Time(r.at)),
            last_timestamp: Some(Time(r.at)),
            count: Some(1),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(node.clone()),
            event_time: None::<MicroTime>,
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        match api.create(&PostParams::default(), &ev).await {
            Ok(_) => {
                seen.insert(
                    k,
                    Seen {
                        name,
                        namespace,
                        count: 1,
                        first: Instant::now(),
                    },
                );
            }
            Err(e) => {
                tracing::info!(reason = %r.reason, object = ?r.object.name, error = %e, "cannot send event; dropped");
            }
        }
    }
}
