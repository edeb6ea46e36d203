//! ListPodSandbox: every sandbox, filtered by id (prefix), state and label selector.

use super::{Inner, labels_match};
use cri::runtime::v1 as pb;
use tonic::Status;

pub fn list_pod_sandbox(
    inner: &Inner,
    req: pb::ListPodSandboxRequest,
) -> Result<pb::ListPodSandboxResponse, Status> {
    let f = req.filter.unwrap_or_default();
    // Filters first, on the record and its decoded-once config (see ListContainers).
    let mut items: Vec<pb::PodSandbox> = inner
        .sandboxes()
        .values()
        .filter(|s| !inner.is_hidden(&s.id))
        .filter(|s| f.id.is_empty() || s.id.starts_with(&f.id))
        .filter(|s| {
            f.state
                .is_none_or(|v| v.state == super::pod_sandbox_status::cri_state(s.state) as i32)
        })
        .filter(|s| labels_match(&s.config_ref().labels, &f.label_selector))
        .map(|s| {
            let cfg = s.config_ref();
            pb::PodSandbox {
                id: s.id.clone(),
                metadata: cfg.metadata.clone(),
                state: super::pod_sandbox_status::cri_state(s.state) as i32,
                created_at: s.created_at,
                labels: cfg.labels.clone(),
                annotations: cfg.annotations.clone(),
                runtime_handler: s.handler.clone(),
            }
        })
        .collect();
    items.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    Ok(pb::ListPodSandboxResponse { items })
}
