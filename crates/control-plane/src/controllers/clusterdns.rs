//! Cluster DNS's Service and endpoints. Where kubeadm and k3s deploy CoreDNS as a Deployment
//! behind the `kube-dns` Service, every `nodus node` serves cluster DNS in-process on its own
//! address (as NodeLocal DNSCache does) and announces it in its Node's
//! [`DNS_ANNOTATION`]. This controller keeps `kube-system/kube-dns` at the tenth address of
//! the service CIDR (kubeadm's and k3s's choice, what the kubelet's `clusterDNS` names) and
//! its EndpointSlices listing those nodes, ready while the Node is Ready, so losing a node
//! moves DNS traffic to the others.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::apiserver::bootstrap::{ensure_object, upsert};
use crate::apiserver::state::ApiState;
use crate::controllers::cache::Cache;
use crate::controllers::controller_utils::s;

/// The Node annotation a node's DNS server sets to the address it answers on (`IP:port`).
pub const DNS_ANNOTATION: &str = "dns.nodus.io/serving";
pub const NAMESPACE: &str = "kube-system";
pub const SERVICE: &str = "kube-dns";
const MANAGED_BY: &str = "clusterdns.nodus.io";

/// The tenth address of the service CIDR.
pub fn cluster_dns_ip((net, _): (Ipv4Addr, u8)) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net) + 10)
}

/// One node's DNS endpoint.
#[derive(Debug, PartialEq, Eq)]
struct Endpoint {
    node: String,
    addr: SocketAddr,
    ready: bool,
}

fn node_ready(n: &Value) -> bool {
    n.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// The nodes announcing DNS, from the Node objects (sorted by node name).
fn endpoints<'a>(nodes: impl Iterator<Item = &'a Arc<Value>>) -> Vec<Endpoint> {
    let mut out: Vec<Endpoint> = nodes
        .filter(|n| n.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|n| {
            let a = n
                .pointer(&format!("/metadata/annotations/{}", DNS_ANNOTATION.replace('/', "~1")))?
                .as_str()?;
            let Ok(addr) = a.parse::<SocketAddr>() else {
                tracing::warn!(node = %s(n, "/metadata/name"), value = %a, "clusterdns: {DNS_ANNOTATION} is not IP:port");
                return None;
            };
            Some(Endpoint {
                node: s(n, "/metadata/name").to_string(),
                addr,
                ready: node_ready(n),
            })
        })
        .collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

/// The EndpointSlices for `eps`: one per (address family, port), named after them.
fn slices(eps: &[Endpoint]) -> BTreeMap<String, Value> {
    let mut by: BTreeMap<(bool, u16), Vec<&Endpoint>> = BTreeMap::new();
    for e in eps {
        by.entry((e.addr.is_ipv4(), e.addr.port()))
            .or_default()
            .push(e);
    }
    by.into_iter()
        .map(|((v4, port), eps)| {
            let family = if v4 { "IPv4" } else { "IPv6" };
            let name = format!("{SERVICE}-{}-{port}", family.to_ascii_lowercase());
            let endpoints: Vec<Value> = eps
                .iter()
                .map(|e| {
                    json!({"addresses": [e.addr.ip().to_string()], "nodeName": e.node,
                        "conditions": {"ready": e.ready, "serving": e.ready, "terminating": false}})
                })
                .collect();
            let slice = json!({
                "addressType": family,
                "endpoints": endpoints,
                "ports": [
                    {"name": "dns", "port": port, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": port, "protocol": "TCP"},
                ],
            });
            (name, slice)
        })
        .collect()
}

fn service(ip: Ipv4Addr) -> Value {
    json!({
        "metadata": {"name": SERVICE, "labels": {"k8s-app": "kube-dns",
            "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "nodus-dns"}},
        "spec": {"type": "ClusterIP", "clusterIP": ip.to_string(), "clusterIPs": [ip.to_string()],
            "sessionAffinity": "None", "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": "dns-tcp"},
            ]},
    })
}

fn sync(st: &ApiState, nodes: &Cache, slices_cache: &Cache) {
    let ip = cluster_dns_ip(st.config.service_cidr);
    if let Err(e) = ensure_object(st, "", "services", Some(NAMESPACE), service(ip)) {
        tracing::warn!(error = %e, "clusterdns: creating the kube-dns Service failed");
    }
    let want = slices(&endpoints(nodes.objects.values()));
    for (name, slice) in &want {
        let r = upsert(
            st,
            "discovery.k8s.io",
            "endpointslices",
            NAMESPACE,
            name,
            &|o| {
                o["metadata"]["labels"] = json!({"kubernetes.io/service-name": SERVICE,
                    "endpointslice.kubernetes.io/managed-by": MANAGED_BY});
                for f in ["addressType", "endpoints", "ports"] {
                    o[f] = slice[f].clone();
                }
            },
        );
        if let Err(e) = r {
            tracing::warn!(slice = %name, error = %e, "clusterdns: writing the EndpointSlice failed");
        }
    }
    // Slices of ours for a family or port no node serves any more.
    let prefix = format!("/discovery.k8s.io/endpointslices/{NAMESPACE}/");
    for (k, v) in &slices_cache.objects {
        let Some(name) = k.strip_prefix(&prefix) else {
            continue;
        };
        if s(
            v,
            "/metadata/labels/endpointslice.kubernetes.io~1managed-by",
        ) == MANAGED_BY
            && !want.contains_key(name)
        {
            let _ = st.store.delete(k, None);
        }
    }
}

pub async fn run(st: Arc<ApiState>) {
    let mut nodes = Cache::new(st.store.clone(), "/core/nodes/");
    let mut services = Cache::new(st.store.clone(), &format!("/core/services/{NAMESPACE}/"));
    let mut slices_cache = Cache::new(
        st.store.clone(),
        &format!("/discovery.k8s.io/endpointslices/{NAMESPACE}/"),
    );
    let mut last: Option<BTreeMap<String, Value>> = None;
    loop {
        while nodes.try_next().is_some() {}
        while services.try_next().is_some() {}
        while slices_cache.try_next().is_some() {}
        // Node heartbeats change nothing here: sync only when the wanted slices or our own
        // objects changed.
        let want = slices(&endpoints(nodes.objects.values()));
        let svc_missing = !services
            .objects
            .contains_key(&format!("/core/services/{NAMESPACE}/{SERVICE}"));
        let stale = slices_cache.objects.iter().any(|(k, v)| {
            s(
                v,
                "/metadata/labels/endpointslice.kubernetes.io~1managed-by",
            ) == MANAGED_BY
                && !k.rsplit('/').next().is_some_and(|n| want.contains_key(n))
        });
        let drifted = want.iter().any(|(name, w)| {
            slices_cache
                .get(&format!(
                    "/discovery.k8s.io/endpointslices/{NAMESPACE}/{name}"
                ))
                .is_none_or(|o| o["endpoints"] != w["endpoints"] || o["ports"] != w["ports"])
        });
        if last.as_ref() != Some(&want) || svc_missing || stale || drifted {
            sync(&st, &nodes, &slices_cache);
            last = Some(want);
        }
        tokio::select! {
            _ = nodes.next() => {}
            _ = services.next() => {}
            _ = slices_cache.next() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ann: Option<&str>, ready: &str) -> Arc<Value> {
        let mut n = json!({"metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}});
        if let Some(a) = ann {
            n["metadata"]["annotations"] = json!({DNS_ANNOTATION: a});
        }
        Arc::new(n)
    }

    #[test]
    fn the_service_sits_at_the_tenth_address() {
        assert_eq!(
            cluster_dns_ip((Ipv4Addr::new(10, 96, 0, 0), 12)),
            Ipv4Addr::new(10, 96, 0, 10)
        );
    }

    #[test]
    fn nodes_serving_dns_become_endpoints_ready_with_their_node() {
        let nodes = [
            node("b", Some("10.0.0.2:53"), "True"),
            node("a", Some("10.0.0.1:53"), "Unknown"),
            node("c", None, "True"),
            node("d", Some("not-an-address"), "True"),
            node("e", Some("10.0.0.5:5353"), "True"),
        ];
        let eps = endpoints(nodes.iter());
        assert_eq!(
            eps.iter()
                .map(|e| (e.node.as_str(), e.ready))
                .collect::<Vec<_>>(),
            [("a", false), ("b", true), ("e", true)]
        );
        let sl = slices(&eps);
        assert_eq!(
            sl.keys().collect::<Vec<_>>(),
            ["kube-dns-ipv4-53", "kube-dns-ipv4-5353"]
        );
        let s53 = &sl["kube-dns-ipv4-53"];
        assert_eq!(s53["endpoints"][0]["addresses"][0], "10.0.0.1");
        assert_eq!(s53["endpoints"][0]["conditions"]["ready"], false);
        assert_eq!(s53["endpoints"][1]["nodeName"], "b");
        assert_eq!(
            s53["ports"][0],
            json!({"name": "dns", "port": 53, "protocol": "UDP"})
        );
    }
}
