//! RemovePodSandbox: stop it, remove its containers, then its directory, name and record.
//! An absent sandbox succeeds.

use super::Inner;
use cri::runtime::v1 as pb;
use tonic::Status;

pub async fn remove_pod_sandbox(
    inner: &Inner,
    req: pb::RemovePodSandboxRequest,
) -> Result<pb::RemovePodSandboxResponse, Status> {
    let rec = match inner.find_sandbox(&req.pod_sandbox_id) {
        Ok(r) => r,
        Err(s) if s.code() == tonic::Code::NotFound => return Ok(pb::RemovePodSandboxResponse {}),
        Err(s) => return Err(s),
    };
    super::stop_pod_sandbox::stop(inner, &rec.id).await?;
    let ids: Vec<String> = inner
        .containers()
        .values()
        .filter(|c| c.sandbox_id == rec.id)
        .map(|c| c.id.clone())
        .collect();
    for c in ids {
        super::remove_container::remove(inner, &c).await?;
    }
    match std::fs::remove_dir_all(&rec.dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Status::internal(format!(
                "removing {}: {e}",
                rec.dir.display()
            )));
        }
        _ => {}
    }
    inner
        .sandbox_records
        .delete(&rec.id)
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
    inner.sandboxes().remove(&rec.id);
    inner
        .names
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .release(&rec.name);
    tracing::info!(sandbox = %rec.id, "sandbox removed");
    if let Some(nri) = inner.nri()
        && let Err(e) = nri.remove_pod_sandbox(crate::nri::objects::pod(&rec)).await
    {
        tracing::error!(sandbox = %rec.id, error = %e.message(), "NRI: RemovePodSandbox notification failed");
    }
    Ok(pb::RemovePodSandboxResponse {})
}
