//! Which endpoints a service port uses for cluster-wide and for node-local traffic
//! (upstream's `pkg/proxy/topology.go` CategorizeEndpoints): ready endpoints first,
//! serving-terminating ones only when none is ready (KEP-1669), zone hints when every ready
//! endpoint has them and one is for this node's zone (topology-aware routing and
//! `trafficDistribution: PreferClose`, whose hints the EndpointSlice controller writes).

use crate::model::{Endpoint, ServicePort};

/// The endpoints a service port's rules are made of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Categorized {
    /// For internal (ClusterIP) traffic with policy Cluster, and external with Cluster.
    pub cluster: Vec<Endpoint>,
    /// This node's endpoints, for policy Local.
    pub local: Vec<Endpoint>,
    /// Whether any endpoint anywhere could serve (ready, or serving while terminating):
    /// without one the service rejects; with one but none usable here it drops.
    pub has_any: bool,
}

fn uses_cluster(svc: &ServicePort) -> bool {
    !svc.internal_policy_local || (svc.has_external_destinations() && !svc.external_policy_local)
}

fn uses_local(svc: &ServicePort) -> bool {
    svc.internal_policy_local || (svc.has_external_destinations() && svc.external_policy_local)
}

fn can_use_topology(endpoints: &[Endpoint], zone: Option<&str>) -> bool {
    let Some(zone) = zone else { return false };
    let mut has_for_zone = false;
    for ep in endpoints.iter().filter(|e| e.ready) {
        match &ep.zone_hints {
            Some(h) if !h.is_empty() => has_for_zone |= h.iter().any(|z| z == zone),
            _ => return false,
        }
    }
    has_for_zone
}

fn hinted_for(ep: &Endpoint, zone: Option<&str>) -> bool {
    match (&ep.zone_hints, zone) {
        (Some(h), Some(z)) => h.iter().any(|x| x == z),
        _ => true,
    }
}

/// Splits `endpoints` as upstream's CategorizeEndpoints does.
pub fn categorize(svc: &ServicePort, endpoints: &[Endpoint], zone: Option<&str>) -> Categorized {
    let mut out = Categorized::default();
    if uses_cluster(svc) {
        let topo = can_use_topology(endpoints, zone);
        out.cluster = endpoints
            .iter()
            .filter(|e| e.ready && (!topo || hinted_for(e, zone)))
            .cloned()
            .collect();
        if out.cluster.is_empty() {
            out.cluster = endpoints
                .iter()
                .filter(|e| e.serving && e.terminating)
                .cloned()
                .collect();
        }
        out.has_any = !out.cluster.is_empty();
    }
    if !uses_local(svc) {
        return out;
    }
    let mut local_ready = false;
    let mut local_terminating = false;
    for ep in endpoints {
        if ep.ready {
            out.has_any = true;
            local_ready |= ep.is_local;
        } else if ep.serving && ep.terminating {
            out.has_any = true;
            local_terminating |= ep.is_local;
        }
    }
    if local_ready {
        out.local = endpoints
            .iter()
            .filter(|e| e.ready && e.is_local)
            .cloned()
            .collect();
    } else if local_terminating {
        out.local = endpoints
            .iter()
            .filter(|e| e.is_local && e.serving && e.terminating)
            .cloned()
            .collect();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Protocol, ServicePortName};
    use std::net::Ipv4Addr;

    fn svc() -> ServicePort {
        ServicePort {
            name: ServicePortName {
                namespace: "ns".into(),
                name: "s".into(),
                port: String::new(),
                protocol: Protocol::Tcp,
            },
            cluster_ip: Ipv4Addr::new(10, 96, 0, 1),
            port: 80,
            node_port: None,
            external_ips: vec![],
            load_balancer_ips: vec![],
            load_balancer_source_ranges: vec![],
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            affinity_timeout_seconds: None,
        }
    }

    fn ep(last: u8, ready: bool, terminating: bool, local: bool) -> Endpoint {
        Endpoint {
            ip: Ipv4Addr::new(10, 0, 0, last),
            port: 8080,
            ready,
            serving: ready || terminating,
            terminating,
            is_local: local,
            zone_hints: None,
        }
    }

    #[test]
    fn terminating_endpoints_are_used_only_when_none_is_ready() {
        let eps = vec![ep(1, true, false, false), ep(2, false, true, false)];
        let c = categorize(&svc(), &eps, None);
        assert_eq!(c.cluster, vec![eps[0].clone()]);
        let eps = vec![ep(2, false, true, false)];
        let c = categorize(&svc(), &eps, None);
        assert_eq!(c.cluster, eps);
        assert!(c.has_any);
    }

    #[test]
    fn internal_policy_local_uses_only_local_endpoints() {
        let mut s = svc();
        s.internal_policy_local = true;
        let eps = vec![ep(1, true, false, false), ep(2, true, false, true)];
        let c = categorize(&s, &eps, None);
        assert!(c.cluster.is_empty());
        assert_eq!(c.local, vec![eps[1].clone()]);
        let c = categorize(&s, &eps[..1], None);
        assert!(c.local.is_empty() && c.has_any);
    }

    #[test]
    fn zone_hints_apply_only_when_every_ready_endpoint_has_them() {
        let mut a = ep(1, true, false, false);
        a.zone_hints = Some(vec!["z1".into()]);
        let mut b = ep(2, true, false, false);
        b.zone_hints = Some(vec!["z2".into()]);
        let c = categorize(&svc(), &[a.clone(), b.clone()], Some("z1"));
        assert_eq!(c.cluster, vec![a.clone()]);
        let unhinted = ep(3, true, false, false);
        let c = categorize(&svc(), &[a, b, unhinted], Some("z1"));
        assert_eq!(c.cluster.len(), 3);
    }
}
