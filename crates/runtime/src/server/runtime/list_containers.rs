//! ListContainers: filtered by id (prefix), state, sandbox id (prefix) and labels.

use super::{Inner, labels_match};
use cri::runtime::v1 as pb;
use tonic::Status;

pub fn list_containers(
    inner: &Inner,
    req: pb::ListContainersRequest,
) -> Result<pb::ListContainersResponse, Status> {
    let f = req.filter.unwrap_or_default();
    let mut containers: Vec<pb::Container> = inner
        .containers()
        .values()
        .filter(|c| !inner.is_hidden(&c.id))
        .filter(|c| f.id.is_empty() || c.id.starts_with(&f.id))
        .filter(|c| f.pod_sandbox_id.is_empty() || c.sandbox_id.starts_with(&f.pod_sandbox_id))
        .map(|c| (c, super::container_status::to_status(c)))
        .filter(|(_, s)| f.state.is_none_or(|v| v.state == s.state))
        .filter(|(_, s)| labels_match(&s.labels, &f.label_selector))
        .map(|(c, s)| pb::Container {
            id: s.id,
            pod_sandbox_id: c.sandbox_id.clone(),
            metadata: s.metadata,
            image: s.image,
            image_ref: s.image_ref,
            state: s.state,
            created_at: s.created_at,
            labels: s.labels,
            annotations: s.annotations,
            image_id: c.image_id.clone(),
        })
        .collect();
    containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    Ok(pb::ListContainersResponse { containers })
}
