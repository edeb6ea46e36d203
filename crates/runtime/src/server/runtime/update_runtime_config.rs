//! UpdateRuntimeConfig: the kubelet passes the node's pod CIDR; nodus's own default CNI
//! network (and only it) is rewritten to allocate from it.

use super::Inner;
use cri::runtime::v1 as pb;
use tonic::Status;

pub fn update_runtime_config(
    inner: &Inner,
    req: pb::UpdateRuntimeConfigRequest,
) -> Result<pb::UpdateRuntimeConfigResponse, Status> {
    let cidr = req
        .runtime_config
        .and_then(|c| c.network_config)
        .map(|n| n.pod_cidr)
        .unwrap_or_default();
    if cidr.is_empty() {
        return Ok(pb::UpdateRuntimeConfigResponse {});
    }
    let net = crate::sandbox::cni::DefaultNetwork::new(Some(&cidr));
    let ours = inner.cni.config().conf_dir.join(&net.file_name);
    let only_ours = std::fs::read_dir(&inner.cni.config().conf_dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.ends_with(".conf") || n.ends_with(".conflist") || n.ends_with(".json")
                })
                .all(|e| e.path() == ours)
        })
        .unwrap_or(true);
    if !only_ours {
        // An operator's network configuration is theirs: leave it alone, as containerd does
        // when no conf template is set.
        return Ok(pb::UpdateRuntimeConfigResponse {});
    }
    let _ = std::fs::remove_file(&ours);
    inner
        .cni
        .ensure_default_config(Some(&cidr))
        .map_err(|e| Status::invalid_argument(format!("pod CIDR {cidr:?}: {e}")))?;
    tracing::info!(pod_cidr = %cidr, "default CNI network now allocates from the pod CIDR");
    Ok(pb::UpdateRuntimeConfigResponse {})
}
