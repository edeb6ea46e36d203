//! The runtime's side of NRI's callbacks: container updates and evictions plugins ask for,
//! and the conversions between CRI and NRI resources.

use super::Inner;
use cri::nri as api;
use cri::runtime::v1 as pb;
use std::sync::Arc;
use tonic::Status;

/// NRI's view of CRI container resources.
pub(crate) fn to_nri(r: &pb::LinuxContainerResources) -> api::LinuxResources {
    let i64v = |v: i64| (v != 0).then_some(api::OptionalInt64 { value: v });
    let u64v = |v: i64| (v > 0).then_some(api::OptionalUInt64 { value: v as u64 });
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: i64v(r.memory_limit_in_bytes),
            swap: i64v(r.memory_swap_limit_in_bytes),
            ..Default::default()
        }),
        cpu: Some(api::LinuxCpu {
            shares: u64v(r.cpu_shares),
            quota: i64v(r.cpu_quota),
            period: u64v(r.cpu_period),
            cpus: r.cpuset_cpus.clone(),
            mems: r.cpuset_mems.clone(),
            ..Default::default()
        }),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| api::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect(),
        unified: r.unified.clone(),
        ..Default::default()
    }
}

/// `base` with what NRI resources `r` set.
pub(crate) fn to_cri(
    mut base: pb::LinuxContainerResources,
    r: &api::LinuxResources,
) -> pb::LinuxContainerResources {
    if let Some(m) = &r.memory {
        if let Some(v) = m.limit {
            base.memory_limit_in_bytes = v.value;
        }
        if let Some(v) = m.swap {
            base.memory_swap_limit_in_bytes = v.value;
        }
    }
    if let Some(c) = &r.cpu {
        if let Some(v) = c.shares {
            base.cpu_shares = v.value as i64;
        }
        if let Some(v) = c.quota {
            base.cpu_quota = v.value;
        }
        if let Some(v) = c.period {
            base.cpu_period = v.value as i64;
        }
        if !c.cpus.is_empty() {
            base.cpuset_cpus = c.cpus.clone();
        }
        if !c.mems.is_empty() {
            base.cpuset_mems = c.mems.clone();
        }
    }
    if !r.hugepage_limits.is_empty() {
        base.hugepage_limits = r
            .hugepage_limits
            .iter()
            .map(|h| pb::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect();
    }
    base.unified.extend(r.unified.clone());
    base
}

/// Applies plugin-requested updates (no NRI hooks: they come from a plugin); the ones that
/// failed and were not to be ignored.
pub(crate) async fn nri_update(
    inner: &Arc<Inner>,
    updates: Vec<api::ContainerUpdate>,
) -> Vec<api::ContainerUpdate> {
    let mut failed = Vec::new();
    for u in updates {
        let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
            continue;
        };
        let result = match inner.find_container(&u.container_id) {
            Ok(rec) => {
                let base = rec
                    .config()
                    .linux
                    .and_then(|l| l.resources)
                    .unwrap_or_default();
                super::update_container_resources::apply(inner, rec, to_cri(base, r)).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::warn!(container = %u.container_id, error = %e.message(), "NRI: container update failed");
            if !u.ignore_failure {
                failed.push(u);
            }
        }
    }
    failed
}

/// Evicts a container for a plugin: stopped at once, as the kubelet then sees it exited.
pub(crate) async fn nri_evict(inner: &Arc<Inner>, id: &str, reason: &str) -> Result<(), Status> {
    tracing::info!(container = %id, reason = %reason, "NRI: evicting container");
    super::stop_container::stop(inner, id, std::time::Duration::ZERO).await?;
    if let Some(nri) = inner.nri() {
        nri.container_stopped(id).await;
    }
    Ok(())
}

/// The pod of a container for an event; empty if the sandbox is gone.
pub(crate) fn pod_of(inner: &Inner, sandbox_id: &str) -> api::PodSandbox {
    inner
        .find_sandbox(sandbox_id)
        .map(|s| crate::nri::objects::pod(&s))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_round_trip_between_cri_and_nri() {
        let cri = pb::LinuxContainerResources {
            cpu_shares: 512,
            cpu_quota: 20_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 64 << 20,
            cpuset_cpus: "0-1".into(),
            ..Default::default()
        };
        let nri = to_nri(&cri);
        assert_eq!(nri.memory.as_ref().unwrap().limit.unwrap().value, 64 << 20);
        assert_eq!(to_cri(Default::default(), &nri), cri);
    }
}
