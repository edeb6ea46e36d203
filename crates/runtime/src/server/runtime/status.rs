//! Status: the RuntimeReady and NetworkReady conditions the kubelet turns into the node's
//! Ready condition.

use cri::runtime::v1::{RuntimeCondition, RuntimeStatus, StatusRequest, StatusResponse};
use std::collections::HashMap;

pub fn status(req: StatusRequest) -> Result<StatusResponse, tonic::Status> {
    // Honest about what exists: the image service is up, the container side is not yet, so
    // a kubelet must not schedule pods here (it would report "container runtime is down").
    let conditions = vec![
        RuntimeCondition {
            r#type: "RuntimeReady".into(),
            status: false,
            reason: "ContainersNotImplemented".into(),
            message: "nodus runtime serves the image service only; pod sandboxes and \
                      containers are not implemented yet"
                .into(),
        },
        RuntimeCondition {
            r#type: "NetworkReady".into(),
            status: false,
            reason: "NetworkPluginNotReady".into(),
            message: "Network plugin returns error: cni plugin not initialized".into(),
        },
    ];
    let mut info = HashMap::new();
    if req.verbose {
        info.insert(
            "config".to_string(),
            serde_json::json!({
                "runtimeName": super::version::RUNTIME_NAME,
                "runtimeVersion": env!("CARGO_PKG_VERSION"),
            })
            .to_string(),
        );
    }
    Ok(StatusResponse {
        status: Some(RuntimeStatus { conditions }),
        info,
        runtime_handlers: Vec::new(),
        features: None,
    })
}
