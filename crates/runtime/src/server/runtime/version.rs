//! Version: names the runtime as `nodus` so the kubelet reports `nodus://<version>`.

use cri::runtime::v1::{VersionRequest, VersionResponse};

/// The CRI version this runtime speaks (kubelet checks it is `v1`).
pub const CRI_API_VERSION: &str = "v1";
pub const RUNTIME_NAME: &str = "nodus";

pub fn version(_req: VersionRequest) -> Result<VersionResponse, tonic::Status> {
    Ok(VersionResponse {
        // The kubelet API version field: upstream runtimes answer "0.1.0".
        version: "0.1.0".into(),
        runtime_name: RUNTIME_NAME.into(),
        runtime_version: env!("CARGO_PKG_VERSION").into(),
        runtime_api_version: CRI_API_VERSION.into(),
    })
}
