//! Services and EndpointSlices from the API turned into the model, with the set of
//! services changed since the last sync (upstream's ServiceChangeTracker and
//! EndpointsChangeTracker, folded into one: a sync needs both halves of a service anyway).
//!
//! Bad input never stops the others: a port that is invalid or conflicts with another,
//! an IPv6 family on this IPv4-only proxy, a slice for a service that does not exist — each
//! is logged with the service's name and skipped.

use crate::model::{Cidr, Endpoint, Protocol, ServiceEntry, ServicePort, ServicePortName};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::time::SystemTime;

/// `namespace/name` of a Service.
pub type NsName = (String, String);

/// Upstream's label marking a service for another proxy: kube-proxy leaves it alone.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Upstream's label marking a headless service.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// The label tying an EndpointSlice to its service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// When the EndpointSlice controller saw the change that produced a slice.
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";
const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;

#[derive(Clone, Debug)]
struct SliceEndpoints {
    service: NsName,
    /// (port name, protocol) → port number.
    ports: Vec<(String, Protocol, u16)>,
    endpoints: Vec<RawEndpoint>,
}

#[derive(Clone, Debug)]
struct RawEndpoint {
    ip: Ipv4Addr,
    ready: bool,
    serving: bool,
    terminating: bool,
    node_name: Option<String>,
    zone_hints: Option<Vec<String>>,
}

/// The accumulated API state and what changed since the last [`ChangeTracker::take_changes`].
#[derive(Debug)]
pub struct ChangeTracker {
    hostname: String,
    services: HashMap<NsName, Vec<ServicePort>>,
    slices: HashMap<NsName, SliceEndpoints>,
    slices_by_service: HashMap<NsName, BTreeSet<String>>,
    dirty: BTreeSet<NsName>,
    trigger_times: Vec<SystemTime>,
}

/// What a sync has to apply.
#[derive(Debug, Default)]
pub struct Changes {
    pub services: BTreeSet<NsName>,
    /// Trigger times of the slice changes included, for the network programming latency.
    pub trigger_times: Vec<SystemTime>,
}

impl ChangeTracker {
    pub fn new(hostname: &str) -> ChangeTracker {
        ChangeTracker {
            hostname: hostname.to_string(),
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            dirty: BTreeSet::new(),
            trigger_times: Vec::new(),
        }
    }

    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty()
    }

    pub fn service_update(&mut self, svc: &Service) {
        let key = ns_name(&svc.metadata.namespace, &svc.metadata.name);
        let ports = service_ports(svc);
        let changed = self.services.get(&key) != Some(&ports);
        if ports.is_empty() {
            if self.services.remove(&key).is_some() {
                self.dirty.insert(key);
            }
            return;
        }
        self.services.insert(key.clone(), ports);
        if changed {
            self.dirty.insert(key);
        }
    }

    pub fn service_delete(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        if self.services.remove(&key).is_some() {
            self.dirty.insert(key);
        }
    }

    pub fn slice_update(&mut self, slice: &EndpointSlice) {
        let key = ns_name(&slice.metadata.namespace, &slice.metadata.name);
        let Some(parsed) = parse_slice(slice) else {
            self.slice_delete(&key.0, &key.1);
            return;
        };
        if let Some(t) = slice
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TRIGGER_TIME_ANNOTATION))
            .and_then(|t| parse_rfc3339(t))
        {
            self.trigger_times.push(t);
        }
        if !self.services.contains_key(&parsed.service) {
            tracing::debug!(
                slice = %format!("{}/{}", key.0, key.1),
                service = %format!("{}/{}", parsed.service.0, parsed.service.1),
                "EndpointSlice for a service this proxy does not know (yet); kept until it appears"
            );
        }
        if let Some(old) = self.slices.get(&key)
            && old.service != parsed.service
            && let Some(set) = self.slices_by_service.get_mut(&old.service)
        {
            set.remove(&key.1);
            self.dirty.insert(old.service.clone());
        }
        self.slices_by_service
            .entry(parsed.service.clone())
            .or_default()
            .insert(key.1.clone());
        self.dirty.insert(parsed.service.clone());
        self.slices.insert(key, parsed);
    }

    pub fn slice_delete(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        if let Some(old) = self.slices.remove(&key) {
            if let Some(set) = self.slices_by_service.get_mut(&old.service) {
                set.remove(name);
                if set.is_empty() {
                    self.slices_by_service.remove(&old.service);
                }
            }
            self.dirty.insert(old.service);
        }
    }

    /// Every service is dirty: the next sync recomputes all (a full resync).
    pub fn all_services(&self) -> BTreeSet<NsName> {
        self.services.keys().cloned().collect()
    }

    pub fn take_changes(&mut self) -> Changes {
        Changes {
            services: std::mem::take(&mut self.dirty),
            trigger_times: std::mem::take(&mut self.trigger_times),
        }
    }

    /// The current entries of one service (empty if it is gone or ignored).
    pub fn entries(&self, svc: &NsName) -> Vec<ServiceEntry> {
        let Some(ports) = self.services.get(svc) else {
            return Vec::new();
        };
        let slices: Vec<&SliceEndpoints> = self
            .slices_by_service
            .get(svc)
            .into_iter()
            .flatten()
            .filter_map(|n| self.slices.get(&(svc.0.clone(), n.clone())))
            .collect();
        ports
            .iter()
            .map(|port| {
                let mut seen = BTreeMap::new();
                for s in &slices {
                    let Some(&(_, _, num)) = s
                        .ports
                        .iter()
                        .find(|(n, p, _)| *n == port.name.port && *p == port.name.protocol)
                    else {
                        continue;
                    };
                    for e in &s.endpoints {
                        seen.entry((e.ip, num)).or_insert_with(|| Endpoint {
                            ip: e.ip,
                            port: num,
                            ready: e.ready,
                            serving: e.serving,
                            terminating: e.terminating,
                            is_local: e.node_name.as_deref() == Some(self.hostname.as_str()),
                            zone_hints: e.zone_hints.clone(),
                        });
                    }
                }
                ServiceEntry {
                    port: port.clone(),
                    endpoints: seen.into_values().collect(),
                }
            })
            .collect()
    }
}

fn ns_name(ns: &Option<String>, name: &Option<String>) -> NsName {
    (
        ns.clone().unwrap_or_else(|| "default".into()),
        name.clone().unwrap_or_default(),
    )
}

fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let t = k8s_openapi::jiff::Timestamp::from_str(s).ok()?;
    Some(SystemTime::from(t))
}

use std::str::FromStr as _;

fn parse_v4(s: &str, service: &str, what: &str) -> Option<Ipv4Addr> {
    match s.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => Some(ip),
        Ok(IpAddr::V6(_)) => {
            tracing::warn!(
                service,
                address = s,
                "{what} is IPv6 but this proxy is IPv4-only; skipped"
            );
            None
        }
        Err(_) => {
            tracing::warn!(service, address = s, "{what} is not an IP address; skipped");
            None
        }
    }
}

/// The service's ports in the model, or none when the proxy must ignore it.
pub fn service_ports(svc: &Service) -> Vec<ServicePort> {
    let (ns, name) = ns_name(&svc.metadata.namespace, &svc.metadata.name);
    let shown = format!("{ns}/{name}");
    let labels = svc.metadata.labels.clone().unwrap_or_default();
    if labels.contains_key(SERVICE_PROXY_NAME_LABEL) || labels.contains_key(HEADLESS_LABEL) {
        return Vec::new();
    }
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Vec::new();
    }
    let ip = match spec.cluster_ip.as_deref() {
        None | Some("") | Some("None") => return Vec::new(),
        Some(ip) => ip,
    };
    let Some(cluster_ip) = parse_v4(ip, &shown, "clusterIP") else {
        return Vec::new();
    };
    let typ = spec.type_.as_deref().unwrap_or("ClusterIP");
    let external_ips: Vec<Ipv4Addr> = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|s| parse_v4(s, &shown, "externalIP"))
        .collect();
    let lb_ips: Vec<Ipv4Addr> = if typ == "LoadBalancer" {
        svc.status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.as_deref())
            .filter_map(|s| parse_v4(s, &shown, "load balancer ingress IP"))
            .collect()
    } else {
        Vec::new()
    };
    let ranges: Vec<Cidr> = spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .filter_map(|r| match r.trim().parse::<Cidr>() {
            Ok(c) => Some(c.trunc()),
            Err(_) => {
                tracing::warn!(service = %shown, range = %r, "loadBalancerSourceRange is not an IPv4 CIDR; skipped");
                None
            }
        })
        .collect();
    let affinity = if spec.session_affinity.as_deref() == Some("ClientIP") {
        Some(
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .filter(|t| *t > 0)
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT),
        )
    } else {
        None
    };
    let etp_local = spec.external_traffic_policy.as_deref() == Some("Local");
    let itp_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let mut out: Vec<ServicePort> = Vec::new();
    for p in spec.ports.iter().flatten() {
        let pname = p.name.clone().unwrap_or_default();
        let Some(protocol) = Protocol::parse(p.protocol.as_deref().unwrap_or("TCP")) else {
            tracing::warn!(service = %shown, port = %pname, protocol = ?p.protocol, "unsupported protocol; port skipped");
            continue;
        };
        let Ok(port) = u16::try_from(p.port) else {
            tracing::warn!(service = %shown, port = %pname, number = p.port, "invalid port number; port skipped");
            continue;
        };
        if port == 0 {
            tracing::warn!(service = %shown, port = %pname, "port 0 is invalid; port skipped");
            continue;
        }
        if let Some(other) = out
            .iter()
            .find(|o| o.name.protocol == protocol && (o.port == port || o.name.port == pname))
        {
            tracing::warn!(
                service = %shown, port = %pname, number = port, conflicts_with = %other.name.port,
                "port conflicts with another port of the service; skipped"
            );
            continue;
        }
        let node_port = if typ == "NodePort" || typ == "LoadBalancer" {
            p.node_port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
        } else {
            None
        };
        let mut sp = ServicePort {
            name: ServicePortName {
                namespace: ns.clone(),
                name: name.clone(),
                port: pname,
                protocol,
            },
            cluster_ip,
            port,
            node_port,
            external_ips: external_ips.clone(),
            load_balancer_ips: lb_ips.clone(),
            load_balancer_source_ranges: ranges.clone(),
            external_policy_local: false,
            internal_policy_local: itp_local,
            health_check_node_port: None,
            affinity_timeout_seconds: affinity,
        };
        if sp.has_external_destinations() && etp_local {
            sp.external_policy_local = true;
            sp.health_check_node_port = spec
                .health_check_node_port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0);
        }
        out.push(sp);
    }
    out
}

fn parse_slice(slice: &EndpointSlice) -> Option<SliceEndpoints> {
    let ns = slice
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let slice_name = slice.metadata.name.clone().unwrap_or_default();
    let Some(svc) = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
    else {
        tracing::debug!(slice = %format!("{ns}/{slice_name}"), "EndpointSlice without {SERVICE_NAME_LABEL}; ignored");
        return None;
    };
    if slice.address_type != "IPv4" {
        tracing::debug!(
            service = %format!("{ns}/{svc}"), slice = %slice_name, address_type = %slice.address_type,
            "EndpointSlice is not IPv4; ignored by this IPv4-only proxy"
        );
        return None;
    }
    let ports = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            let proto = Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))?;
            let num = u16::try_from(p.port?).ok().filter(|n| *n > 0)?;
            Some((p.name.clone().unwrap_or_default(), proto, num))
        })
        .collect();
    let endpoints = slice
        .endpoints
        .iter()
        .filter_map(|e| {
            let ip = e.addresses.first()?.parse::<Ipv4Addr>().ok()?;
            let c = e.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            Some(RawEndpoint {
                ip,
                ready,
                serving,
                terminating,
                node_name: e.node_name.clone(),
                zone_hints: e
                    .hints
                    .as_ref()
                    .and_then(|h| h.for_zones.as_ref())
                    .map(|z| z.iter().map(|z| z.name.clone()).collect()),
            })
        })
        .collect();
    Some(SliceEndpoints {
        service: (ns, svc.clone()),
        ports,
        endpoints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(yaml: &str) -> Service {
        serde_yaml::from_str(yaml).expect("service yaml")
    }

    const BASE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: ns}\n";

    #[test]
    fn conflicting_and_invalid_ports_are_skipped_others_kept() {
        let s = svc(&format!(
            "{BASE}spec:\n  clusterIP: 10.96.0.5\n  ports:\n  - {{name: a, port: 80}}\n  - {{name: b, port: 80}}\n  - {{name: c, port: 0}}\n  - {{name: d, port: 70000}}\n  - {{name: e, port: 53, protocol: UDP}}\n"
        ));
        let ports = service_ports(&s);
        let names: Vec<&str> = ports.iter().map(|p| p.name.port.as_str()).collect();
        assert_eq!(names, ["a", "e"]);
    }

    #[test]
    fn ipv6_headless_external_name_and_other_proxies_are_ignored() {
        for spec in [
            "spec:\n  clusterIP: fd00::5\n  ports:\n  - {port: 80}\n",
            "spec:\n  clusterIP: None\n  ports:\n  - {port: 80}\n",
            "spec:\n  type: ExternalName\n  externalName: example.org\n",
        ] {
            assert!(
                service_ports(&svc(&format!("{BASE}{spec}"))).is_empty(),
                "{spec}"
            );
        }
        let labelled = "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n  namespace: ns\n  labels: {service.kubernetes.io/service-proxy-name: other}\nspec:\n  clusterIP: 10.96.0.5\n  ports:\n  - {port: 80}\n";
        assert!(service_ports(&svc(labelled)).is_empty());
    }

    #[test]
    fn slice_for_unknown_service_waits_for_it() {
        let mut t = ChangeTracker::new("node1");
        let slice: EndpointSlice = serde_yaml::from_str(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: s-1\n  namespace: ns\n  labels: {kubernetes.io/service-name: s}\naddressType: IPv4\nports:\n- {name: \"\", port: 8080, protocol: TCP}\nendpoints:\n- addresses: [10.0.0.1]\n  nodeName: node1\n",
        )
        .expect("slice");
        t.slice_update(&slice);
        let key = ("ns".to_string(), "s".to_string());
        assert!(t.entries(&key).is_empty());
        t.service_update(&svc(&format!(
            "{BASE}spec:\n  clusterIP: 10.96.0.5\n  ports:\n  - {{port: 80, targetPort: 8080}}\n"
        )));
        let e = t.entries(&key);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].endpoints.len(), 1);
        assert!(e[0].endpoints[0].is_local && e[0].endpoints[0].ready);
        assert!(t.take_changes().services.contains(&key));
    }
}
