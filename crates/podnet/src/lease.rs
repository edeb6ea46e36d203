//! A Node as flannel's kube subnet manager reads it: a subnet lease (pod CIDR, public IP,
//! backend attributes from flannel's annotations), and the annotations this node publishes.

use crate::plan::{Backend, Lease, Mac};
use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// flannel's annotation keys (prefix `flannel.alpha.coreos.com`).
pub const BACKEND_DATA: &str = "flannel.alpha.coreos.com/backend-data";
pub const BACKEND_TYPE: &str = "flannel.alpha.coreos.com/backend-type";
pub const PUBLIC_IP: &str = "flannel.alpha.coreos.com/public-ip";

/// Why a Node gives no lease.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    #[error("node {0} has no IPv4 spec.podCIDR yet")]
    NoPodCidr(String),
    #[error("node {node}: spec.podCIDR {value:?} is not an IPv4 CIDR")]
    BadPodCidr { node: String, value: String },
    #[error("node {0} has no IPv4 InternalIP in status.addresses")]
    NoInternalIp(String),
}

/// The node's lease. Only IPv4 is routed: the first IPv4 entry of `spec.podCIDRs` (or
/// `spec.podCIDR`) and the first IPv4 InternalIP. The VTEP MAC is read from flannel's
/// backend-data when backend-type is vxlan.
pub fn from_node(n: &Node) -> Result<Lease, Skip> {
    let name = n.metadata.name.clone().unwrap_or_default();
    let spec = n.spec.as_ref();
    let mut cidrs: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    if cidrs.is_empty()
        && let Some(c) = spec.and_then(|s| s.pod_cidr.clone())
    {
        cidrs.push(c);
    }
    let v4 = cidrs
        .iter()
        .find(|c| !c.contains(':'))
        .ok_or_else(|| Skip::NoPodCidr(name.clone()))?;
    let pod_cidr: ipnet::Ipv4Net = v4.trim().parse().map_err(|_| Skip::BadPodCidr {
        node: name.clone(),
        value: v4.clone(),
    })?;
    let public_ip = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse::<Ipv4Addr>().ok())
        .ok_or_else(|| Skip::NoInternalIp(name.clone()))?;
    let ann = n.metadata.annotations.as_ref();
    let vtep_mac = ann
        .filter(|a| a.get(BACKEND_TYPE).map(String::as_str) == Some("vxlan"))
        .and_then(|a| a.get(BACKEND_DATA))
        .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .and_then(|v| v["VtepMAC"].as_str().and_then(Mac::parse));
    Ok(Lease {
        node: name,
        created: n
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        pod_cidr: pod_cidr.trunc(),
        public_ip,
        vtep_mac,
    })
}

/// The annotations this node publishes for `backend` (flannel's values: backend-data is
/// `{"VNI":1,"VtepMAC":"…"}` for vxlan and `null` for host-gw).
pub fn own_annotations(
    backend: Backend,
    vni: u32,
    mac: Option<&Mac>,
    public_ip: Ipv4Addr,
) -> BTreeMap<String, String> {
    let data = match (backend, mac) {
        (Backend::Vxlan, Some(m)) => serde_json::json!({"VNI": vni, "VtepMAC": m.as_str()}),
        _ => serde_json::Value::Null,
    };
    BTreeMap::from([
        (BACKEND_DATA.to_string(), data.to_string()),
        (BACKEND_TYPE.to_string(), backend.annotation().to_string()),
        (PUBLIC_IP.to_string(), public_ip.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn leases_from_nodes() {
        let full = node(serde_json::json!({
            "metadata": {"name": "b", "creationTimestamp": "2026-01-01T00:00:02Z",
                "annotations": {BACKEND_TYPE: "vxlan", BACKEND_DATA: "{\"VNI\":1,\"VtepMAC\":\"0A:00:00:00:00:0B\"}"}},
            "spec": {"podCIDR": "10.42.2.0/24", "podCIDRs": ["fd00:2::/64", "10.42.2.0/24"]},
            "status": {"addresses": [
                {"type": "Hostname", "address": "b"},
                {"type": "InternalIP", "address": "fd00::12"},
                {"type": "InternalIP", "address": "192.168.0.12"}]}
        }));
        let l = from_node(&full).unwrap();
        assert_eq!(l.node, "b");
        assert_eq!(l.pod_cidr.to_string(), "10.42.2.0/24");
        assert_eq!(l.public_ip.to_string(), "192.168.0.12");
        assert_eq!(l.vtep_mac.unwrap().as_str(), "0a:00:00:00:00:0b");
        assert_eq!(l.created, "2026-01-01T00:00:02Z");

        let host_gw = node(serde_json::json!({
            "metadata": {"name": "c", "annotations": {BACKEND_TYPE: "host-gw", BACKEND_DATA: "null"}},
            "spec": {"podCIDR": "10.42.3.7/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.13"}]}
        }));
        let l = from_node(&host_gw).unwrap();
        assert_eq!(l.pod_cidr.to_string(), "10.42.3.0/24");
        assert!(l.vtep_mac.is_none());

        let cases = [
            (
                serde_json::json!({"metadata": {"name": "x"}}),
                Skip::NoPodCidr("x".into()),
            ),
            (
                serde_json::json!({"metadata": {"name": "x"}, "spec": {"podCIDR": "10.1.0.0"}}),
                Skip::BadPodCidr {
                    node: "x".into(),
                    value: "10.1.0.0".into(),
                },
            ),
            (
                serde_json::json!({"metadata": {"name": "x"}, "spec": {"podCIDR": "10.1.0.0/24"},
                    "status": {"addresses": [{"type": "ExternalIP", "address": "1.2.3.4"}]}}),
                Skip::NoInternalIp("x".into()),
            ),
        ];
        for (n, want) in cases {
            assert_eq!(from_node(&node(n.clone())).unwrap_err(), want, "{n}");
        }
    }

    #[test]
    fn own_annotations_use_flannels_keys_and_values() {
        let mac = Mac::parse("02:00:00:00:00:0a").unwrap();
        let a = own_annotations(
            Backend::Vxlan,
            1,
            Some(&mac),
            "192.168.0.11".parse().unwrap(),
        );
        assert_eq!(
            a[BACKEND_DATA],
            r#"{"VNI":1,"VtepMAC":"02:00:00:00:00:0a"}"#
        );
        assert_eq!(a[BACKEND_TYPE], "vxlan");
        assert_eq!(a[PUBLIC_IP], "192.168.0.11");
        let a = own_annotations(Backend::HostGw, 1, None, "192.168.0.11".parse().unwrap());
        assert_eq!(a[BACKEND_DATA], "null");
        assert_eq!(a[BACKEND_TYPE], "host-gw");
    }
}
