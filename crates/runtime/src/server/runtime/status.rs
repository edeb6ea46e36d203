//! Status: the RuntimeReady and NetworkReady conditions the kubelet turns into the node's
//! Ready condition, the handlers (RuntimeClasses) and features this runtime offers.

use super::Inner;
use cri::runtime::v1 as pb;
use std::collections::HashMap;

pub async fn status(
    inner: &Inner,
    req: pb::StatusRequest,
) -> Result<pb::StatusResponse, tonic::Status> {
    let runtime_ready = match inner.handlers.get("") {
        Ok(_) => pb::RuntimeCondition {
            r#type: "RuntimeReady".into(),
            status: true,
            reason: String::new(),
            message: String::new(),
        },
        Err(e) => pb::RuntimeCondition {
            r#type: "RuntimeReady".into(),
            status: false,
            reason: "OCIRuntimeNotInstalled".into(),
            message: e.to_string(),
        },
    };
    let network = inner.network_condition();
    let mut info = HashMap::new();
    if req.verbose {
        let mut handlers = serde_json::Map::new();
        for name in inner.handlers.names() {
            if let Ok(rt) = inner.handlers.get(name) {
                handlers.insert(
                    name.to_string(),
                    serde_json::json!({
                        "binary": rt.binary,
                        "root": rt.root,
                        "version": rt.version().await,
                    }),
                );
            }
        }
        info.insert(
            "config".to_string(),
            serde_json::json!({
                "runtimeName": super::version::RUNTIME_NAME,
                "runtimeVersion": env!("CARGO_PKG_VERSION"),
                "rootDir": inner.root_dir,
                "stateDir": inner.state_dir,
                "runtimeHandlers": handlers,
            })
            .to_string(),
        );
    }
    let runtime_handlers = inner
        .handlers
        .names()
        .map(|name| {
            // gVisor's mounts are its own (no recursive read-only) and it refuses user
            // namespaces (oci::gvisor).
            let runc_like = inner.handlers.kind(name) != Some(crate::oci::CliKind::Runsc);
            pb::RuntimeHandler {
                name: if name == inner.handlers.default_name() {
                    String::new()
                } else {
                    name.to_string()
                },
                features: Some(pb::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: runc_like,
                    // Pod user namespaces: pinned by a helper, layers and volumes idmapped by
                    // the runtime itself (see container::rootfs), so runc needs no support.
                    user_namespaces: runc_like,
                }),
            }
        })
        .collect();
    Ok(pb::StatusResponse {
        status: Some(pb::RuntimeStatus {
            conditions: vec![runtime_ready, network],
        }),
        info,
        runtime_handlers,
        features: Some(pb::RuntimeFeatures {
            supplemental_groups_policy: true,
        }),
    })
}
