//! pods/log, exec, attach, portforward and nodes/proxy: forwarded to the node's kubelet.
//!
//! The kubelet server is not built yet, so this reports the kubelet it would reach and
//! answers 503 ServiceUnavailable; the address lookup is what the real proxy will use.

use axum::response::Response;
use nodus_k8s::status;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, Req};

/// The kubelet endpoint of a node: its InternalIP and daemonEndpoints port (10250).
pub fn kubelet_address(node: &Value) -> Option<String> {
    let addrs = node.pointer("/status/addresses")?.as_array()?;
    let ip = addrs
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .or_else(|| addrs.first())?
        .get("address")?
        .as_str()?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .unwrap_or(10250);
    Some(if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    })
}

fn unavailable(msg: String) -> ApiError {
    ApiError(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": msg, "reason": "ServiceUnavailable", "code": 503}),
    )
}

pub async fn handle(req: &Req, sub: &str) -> ApiResult<Response> {
    let t = &req.target;
    let name = t.name.clone().unwrap_or_default();
    let obj = req
        .st
        .store
        .get(&t.key_for(&name))
        .map_err(|e| super::store_error(t, &name, e))?
        .ok_or_else(|| ApiError(status::not_found(t.info.group, t.info.plural, &name)))?;
    let node_name = match t.info.kind {
        "Node" => name.clone(),
        "Pod" => obj
            .object
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        _ => String::new(),
    };
    if node_name.is_empty() {
        return Err(ApiError(status::bad_request(&format!(
            "pod {name} does not have a host assigned"
        ))));
    }
    let node = req
        .st
        .store
        .get(&format!("/core/nodes/{node_name}"))
        .ok()
        .flatten();
    let addr = node.as_ref().and_then(|n| kubelet_address(&n.object));
    Err(unavailable(match addr {
        Some(a) => format!(
            "{sub}: cannot reach the kubelet of node {node_name:?} at https://{a}: proxying to kubelets is not implemented in nodus yet"
        ),
        None => format!("{sub}: node {node_name:?} has no address to reach its kubelet at"),
    }))
}
