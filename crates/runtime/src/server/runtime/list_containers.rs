//! ListContainers: filtered by id (prefix), state, sandbox id (prefix) and labels.

use super::{Inner, labels_match};
use cri::runtime::v1 as pb;
use tonic::Status;

pub fn list_containers(
    inner: &Inner,
    req: pb::ListContainersRequest,
) -> Result<pb::ListContainersResponse, Status> {
    let f = req.filter.unwrap_or_default();
    // Filters first, on the record and its decoded-once config, so a list costs a label
    // comparison per container and builds only what it returns.
    let mut containers: Vec<pb::Container> = inner
        .containers()
        .values()
        .filter(|c| !inner.is_hidden(&c.id))
        .filter(|c| f.id.is_empty() || c.id.starts_with(&f.id))
        .filter(|c| f.pod_sandbox_id.is_empty() || c.sandbox_id.starts_with(&f.pod_sandbox_id))
        .filter(|c| {
            f.state
                .is_none_or(|v| v.state == super::container_status::cri_state(c.state) as i32)
        })
        .filter(|c| labels_match(&c.config_ref().labels, &f.label_selector))
        .map(|c| {
            let cfg = c.config_ref();
            pb::Container {
                id: c.id.clone(),
                pod_sandbox_id: c.sandbox_id.clone(),
                metadata: cfg.metadata.clone(),
                image: Some(pb::ImageSpec {
                    image: c.image_ref.clone(),
                    ..Default::default()
                }),
                image_ref: c.image_id.clone(),
                state: super::container_status::cri_state(c.state) as i32,
                created_at: c.created_at,
                labels: cfg.labels.clone(),
                annotations: cfg.annotations.clone(),
                image_id: c.image_id.clone(),
            }
        })
        .collect();
    containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    Ok(pb::ListContainersResponse { containers })
}
