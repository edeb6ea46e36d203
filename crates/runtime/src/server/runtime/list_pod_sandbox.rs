//! ListPodSandbox: every sandbox, filtered by id (prefix), state and label selector.

use super::{Inner, labels_match};
use cri::runtime::v1 as pb;
use tonic::Status;

pub fn list_pod_sandbox(
    inner: &Inner,
    req: pb::ListPodSandboxRequest,
) -> Result<pb::ListPodSandboxResponse, Status> {
    let f = req.filter.unwrap_or_default();
    let mut items: Vec<pb::PodSandbox> = inner
        .sandboxes()
        .values()
        .filter(|s| !inner.is_hidden(&s.id))
        .map(super::pod_sandbox_status::to_status)
        .filter(|s| f.id.is_empty() || s.id.starts_with(&f.id))
        .filter(|s| f.state.is_none_or(|v| v.state == s.state))
        .filter(|s| labels_match(&s.labels, &f.label_selector))
        .map(|s| pb::PodSandbox {
            id: s.id,
            metadata: s.metadata,
            state: s.state,
            created_at: s.created_at,
            labels: s.labels,
            annotations: s.annotations,
            runtime_handler: s.runtime_handler,
        })
        .collect();
    items.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    Ok(pb::ListPodSandboxResponse { items })
}
