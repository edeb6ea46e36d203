//! UpdateContainerResources: new limits applied to the running container's cgroup with
//! `runc update`, and kept in the record so status and a restart see them.

use super::Inner;
use crate::state::ContainerState;
use cri::runtime::v1 as pb;
use tonic::Status;

/// The OCI `LinuxResources` JSON `runc update --resources` reads.
fn oci_resources(r: &pb::LinuxContainerResources) -> serde_json::Value {
    let mut cpu = serde_json::Map::new();
    if r.cpu_shares > 0 {
        cpu.insert("shares".into(), r.cpu_shares.into());
    }
    if r.cpu_quota != 0 {
        cpu.insert("quota".into(), r.cpu_quota.into());
    }
    if r.cpu_period > 0 {
        cpu.insert("period".into(), r.cpu_period.into());
    }
    if !r.cpuset_cpus.is_empty() {
        cpu.insert("cpus".into(), r.cpuset_cpus.clone().into());
    }
    if !r.cpuset_mems.is_empty() {
        cpu.insert("mems".into(), r.cpuset_mems.clone().into());
    }
    let mut out = serde_json::json!({ "cpu": cpu });
    if r.memory_limit_in_bytes > 0 {
        out["memory"] = serde_json::json!({ "limit": r.memory_limit_in_bytes });
    }
    if !r.unified.is_empty() {
        out["unified"] = serde_json::json!(r.unified);
    }
    out
}

/// Merges `resources` (OCI `LinuxResources` keys) into the spec's `linux.resources`.
fn update_bundle(config: &std::path::Path, resources: &serde_json::Value) -> Result<(), Status> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        Status::internal(format!("{what} {}: {e}", config.display()))
    };
    let body = std::fs::read(config).map_err(|e| fail("reading", &e))?;
    let mut spec: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| fail("parsing", &e))?;
    let slot = &mut spec["linux"]["resources"];
    if !slot.is_object() {
        *slot = serde_json::json!({});
    }
    if let (Some(dst), Some(src)) = (slot.as_object_mut(), resources.as_object()) {
        for (k, v) in src {
            match (dst.get_mut(k), v) {
                (Some(serde_json::Value::Object(d)), serde_json::Value::Object(s)) => {
                    d.extend(s.clone());
                }
                _ => {
                    dst.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let body = serde_json::to_vec_pretty(&spec).map_err(|e| fail("encoding", &e))?;
    let tmp = config.with_extension("json.tmp");
    std::fs::write(&tmp, body).map_err(|e| fail("writing", &e))?;
    std::fs::rename(&tmp, config).map_err(|e| fail("replacing", &e))
}

pub async fn update_container_resources(
    inner: &Inner,
    req: pb::UpdateContainerResourcesRequest,
) -> Result<pb::UpdateContainerResourcesResponse, Status> {
    let rec = inner.find_container(&req.container_id)?;
    let Some(mut res) = req.linux else {
        return Ok(pb::UpdateContainerResourcesResponse {});
    };
    let Some(nri) = inner.nri() else {
        apply(inner, rec, res).await?;
        return Ok(pb::UpdateContainerResourcesResponse {});
    };
    // Plugins may change this update and ask for others.
    let pod = super::nri::pod_of(inner, &rec.sandbox_id);
    let (wanted, side) = nri
        .update_container(pod.clone(), nri.container(&rec), super::nri::to_nri(&res))
        .await?;
    res = super::nri::to_cri(res, &wanted);
    let id = rec.id.clone();
    apply(inner, rec, res).await?;
    if let Ok(rec) = inner.find_container(&id)
        && let Err(e) = nri.post_update_container(pod, nri.container(&rec)).await
    {
        tracing::error!(container = %id, error = %e.message(), "NRI: PostUpdateContainer notification failed");
    }
    nri.side_effects(side);
    Ok(pb::UpdateContainerResourcesResponse {})
}

/// Applies new resources to a container (its cgroup, or its bundle before it runs) and
/// keeps them in its record.
pub(crate) async fn apply(
    inner: &Inner,
    mut rec: crate::state::ContainerRecord,
    res: pb::LinuxContainerResources,
) -> Result<(), Status> {
    if rec.state == ContainerState::Created && rec.shim_pid.is_none() {
        // Not running yet: the new limits go into the bundle the start will use.
        update_bundle(&rec.bundle.join("config.json"), &oci_resources(&res))?;
        if let Some(nri) = inner.nri() {
            nri.spec_changed(&rec.id);
        }
    } else if matches!(rec.state, ContainerState::Created | ContainerState::Running) {
        let rt = inner
            .handlers
            .get(&rec.handler)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        let path = rec.bundle.join("resources.json");
        std::fs::write(&path, oci_resources(&res).to_string())
            .map_err(|e| Status::internal(format!("writing {}: {e}", path.display())))?;
        rt.update(&rec.id, &path).await.map_err(|e| {
            Status::unknown(format!("failed to update resources of {}: {e}", rec.id))
        })?;
    }
    let mut cfg = rec.config();
    cfg.linux.get_or_insert_with(Default::default).resources = Some(res);
    rec.set_config(&cfg);
    inner.save_container(&rec).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn resources_map_to_oci_names() {
        let r = cri::runtime::v1::LinuxContainerResources {
            cpu_shares: 512,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        };
        let v = super::oci_resources(&r);
        assert_eq!(v["cpu"]["shares"], 512);
        assert_eq!(v["cpu"]["quota"], 50_000);
        assert_eq!(v["memory"]["limit"], 64 << 20);
    }
}
