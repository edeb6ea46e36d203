//! The labels and annotations the kubelet puts on sandboxes and containers.
//!
//! They are the kubelet's only memory that survives its own restart: everything it needs
//! to adopt running pods (which pod a container belongs to, which spec it was created from,
//! how often it restarted, how to stop it) is read back from them, exactly as upstream's
//! kuberuntime does, so pods started by upstream's kubelet would be recognised too.

use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::HashMap;

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
pub const POD_DELETION_GRACE_PERIOD: &str = "io.kubernetes.pod.deletionGracePeriod";
pub const PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
/// Marks an init container (nodus addition: upstream tells them apart by spec; a kubelet
/// adopting pods after its restart may meet a spec that changed since).
pub const CONTAINER_TYPE: &str = "io.nodus.container.type";

fn meta(pod: &Pod) -> (&str, &str, &str) {
    let m = &pod.metadata;
    (
        m.name.as_deref().unwrap_or_default(),
        m.namespace.as_deref().unwrap_or("default"),
        m.uid.as_deref().unwrap_or_default(),
    )
}

/// Labels of a pod sandbox: the pod's own labels plus the three identifying ones.
pub fn sandbox_labels(pod: &Pod) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let (name, ns, uid) = meta(pod);
    labels.insert(POD_NAME.into(), name.into());
    labels.insert(POD_NAMESPACE.into(), ns.into());
    labels.insert(POD_UID.into(), uid.into());
    labels
}

/// Annotations of a pod sandbox: the pod's annotations.
pub fn sandbox_annotations(pod: &Pod) -> HashMap<String, String> {
    pod.metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect()
}

pub fn container_labels(pod: &Pod, container: &Container, init: bool) -> HashMap<String, String> {
    let (name, ns, uid) = meta(pod);
    let mut l = HashMap::from([
        (POD_NAME.to_string(), name.to_string()),
        (POD_NAMESPACE.to_string(), ns.to_string()),
        (POD_UID.to_string(), uid.to_string()),
        (CONTAINER_NAME.to_string(), container.name.clone()),
    ]);
    if init {
        l.insert(CONTAINER_TYPE.into(), "init".into());
    }
    l
}

pub fn container_annotations(
    pod: &Pod,
    container: &Container,
    hash: &str,
    restart_count: i32,
) -> HashMap<String, String> {
    let mut a = HashMap::from([
        (CONTAINER_HASH.to_string(), hash.to_string()),
        (
            CONTAINER_RESTART_COUNT.to_string(),
            restart_count.to_string(),
        ),
        (
            TERMINATION_MESSAGE_PATH.to_string(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
        ),
        (
            TERMINATION_MESSAGE_POLICY.to_string(),
            container
                .termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".into()),
        ),
    ]);
    if let Some(g) = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
    {
        a.insert(POD_TERMINATION_GRACE_PERIOD.into(), g.to_string());
    }
    if let Some(g) = pod.metadata.deletion_grace_period_seconds {
        a.insert(POD_DELETION_GRACE_PERIOD.into(), g.to_string());
    }
    if let Some(pre_stop) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        && let Ok(s) = serde_json::to_string(pre_stop)
    {
        a.insert(PRE_STOP_HANDLER.into(), s);
    }
    if let Some(ports) = &container.ports
        && let Ok(s) = serde_json::to_string(ports)
    {
        a.insert(CONTAINER_PORTS.into(), s);
    }
    a
}

/// The hash that says whether a running container still matches its spec. Computed over
/// the fields whose change requires a restart; `resources` are left out because they can
/// be resized in place (as upstream since in-place resize).
pub fn container_hash(container: &Container) -> String {
    use sha2::Digest as _;
    let mut c = container.clone();
    c.resources = None;
    let bytes = serde_json::to_vec(&c).unwrap_or_default();
    let digest = sha2::Sha256::digest(&bytes);
    hex::encode(&digest[..4])
}
