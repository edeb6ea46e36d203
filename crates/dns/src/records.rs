//! The store: Services and EndpointSlices reduced to what the kubernetes plugin looks up —
//! per service its kind and ports, per service its ready endpoints (from every slice labelled
//! `kubernetes.io/service-name`), and a reverse index from IP to the names that own it.
//!
//! Keys are lowercase: DNS names match case-insensitively, as CoreDNS's `strings.EqualFold`.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

/// The label tying an EndpointSlice to its Service.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// (namespace, name), lowercase.
pub(crate) type Key = (String, String);

fn key(ns: &str, name: &str) -> Key {
    (ns.to_ascii_lowercase(), name.to_ascii_lowercase())
}

/// What a Service name resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Its ClusterIPs (both families when dual-stack).
    ClusterIp(Vec<IpAddr>),
    /// `clusterIP: None`: the ready endpoints.
    Headless,
    /// A CNAME to `spec.externalName`.
    ExternalName(String),
}

/// A port's protocol, as the `_tcp`/`_udp`/`_sctp` label of SRV names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The API's value; unset means TCP (the API's default).
    fn parse(s: Option<&str>) -> Option<Self> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// The SRV label without its underscore.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// A service or endpoint port. An EndpointSlice without ports gets one with `port: None`, as
/// CoreDNS's sentinel port -1: it still yields address records, never SRV records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Port {
    /// Lowercase; empty when unnamed.
    pub(crate) name: String,
    pub(crate) protocol: Option<Protocol>,
    pub(crate) port: Option<u16>,
}

impl Port {
    /// CoreDNS's `matchPortAndProtocol`: an absent label matches anything.
    pub(crate) fn matches(&self, port: Option<&str>, protocol: Option<&str>) -> bool {
        port.is_none_or(|p| p.eq_ignore_ascii_case(&self.name))
            && protocol.is_none_or(|p| {
                self.protocol
                    .is_some_and(|own| p.eq_ignore_ascii_case(own.label()))
            })
    }
}

/// A Service as DNS sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServiceInfo {
    pub(crate) kind: Kind,
    pub(crate) ports: Vec<Port>,
}

/// One ready endpoint address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) ip: IpAddr,
    /// The endpoint's `hostname`, else its address with dashes (CoreDNS's `endpointHostname`).
    pub(crate) hostname: String,
}

/// The ready endpoints of one EndpointSlice, with the slice's ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Slice {
    pub(crate) endpoints: Vec<Endpoint>,
    pub(crate) ports: Vec<Port>,
}

/// Who owns an IP, for PTR.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Owner {
    ClusterIp(Key),
    Endpoint {
        service: Key,
        slice: String,
        hostname: String,
    },
}

/// A name a reverse lookup answers, relative to the cluster zone:
/// `<svc>.<ns>.svc` or `<hostname>.<svc>.<ns>.svc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReverseName {
    pub(crate) hostname: Option<String>,
    pub(crate) service: Key,
}

/// Which watch has listed everything once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Watched {
    Services,
    EndpointSlices,
}

#[derive(Debug)]
pub(crate) struct Records {
    services: HashMap<Key, ServiceInfo>,
    /// Services per namespace: a namespace with a Service exists (the node cannot list
    /// Namespaces, which CoreDNS watches for this).
    namespaces: HashMap<String, usize>,
    /// (namespace, service) → slice name → slice.
    slices: HashMap<Key, BTreeMap<String, Slice>>,
    /// (namespace, slice) → the service it was filed under, to move or drop it.
    slice_service: HashMap<Key, String>,
    reverse: HashMap<IpAddr, Vec<Owner>>,
    serial: u32,
    services_synced: bool,
    slices_synced: bool,
}

impl Default for Records {
    fn default() -> Self {
        Self::new()
    }
}

fn now_serial() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0)
}

fn is_none_ip(s: &str) -> bool {
    s.eq_ignore_ascii_case("None")
}

/// The Service's DNS view; `None` for kinds DNS does not serve (an ExternalName that is an
/// IP literal, as CoreDNS only answers names there).
fn service_info(svc: &Service) -> Option<ServiceInfo> {
    let spec = svc.spec.as_ref()?;
    let ports = spec
        .ports
        .iter()
        .flatten()
        .map(|p| Port {
            name: p.name.clone().unwrap_or_default().to_ascii_lowercase(),
            protocol: Protocol::parse(p.protocol.as_deref()),
            port: u16::try_from(p.port).ok(),
        })
        .collect();
    let kind = if spec.type_.as_deref() == Some("ExternalName") {
        let name = spec.external_name.clone().unwrap_or_default();
        let name = name.trim_end_matches('.').to_string();
        if name.is_empty() || name.parse::<IpAddr>().is_ok() {
            return None;
        }
        Kind::ExternalName(name)
    } else if spec.cluster_ip.as_deref().is_some_and(is_none_ip) {
        Kind::Headless
    } else {
        let mut ips: Vec<IpAddr> = spec
            .cluster_ips
            .iter()
            .flatten()
            .filter_map(|s| s.parse().ok())
            .collect();
        if ips.is_empty()
            && let Some(ip) = spec.cluster_ip.as_deref().and_then(|s| s.parse().ok())
        {
            ips.push(ip);
        }
        Kind::ClusterIp(ips)
    };
    Some(ServiceInfo { kind, ports })
}

/// The address as a DNS label: dots or colons become dashes.
pub(crate) fn dashed(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

/// The slice's ready endpoints; FQDN slices carry no addresses DNS can serve.
fn slice_info(s: &EndpointSlice) -> Slice {
    let ports = match s.ports.as_deref() {
        None | Some([]) => vec![Port {
            name: String::new(),
            protocol: None,
            port: None,
        }],
        Some(ps) => ps
            .iter()
            .map(|p| Port {
                name: p.name.clone().unwrap_or_default().to_ascii_lowercase(),
                protocol: Protocol::parse(p.protocol.as_deref()),
                port: p.port.and_then(|p| u16::try_from(p).ok()),
            })
            .collect(),
    };
    let mut endpoints = Vec::new();
    if s.address_type == "IPv4" || s.address_type == "IPv6" {
        for ep in &s.endpoints {
            // Unknown readiness counts as ready (the API's advice, CoreDNS's reading).
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if !ready {
                continue;
            }
            for a in &ep.addresses {
                let Ok(ip) = a.parse::<IpAddr>() else {
                    continue;
                };
                let hostname = match ep.hostname.as_deref() {
                    Some(h) if !h.is_empty() => h.to_ascii_lowercase(),
                    _ => dashed(&ip),
                };
                endpoints.push(Endpoint { ip, hostname });
            }
        }
    }
    Slice { endpoints, ports }
}

impl Records {
    pub(crate) fn new() -> Self {
        Self {
            services: HashMap::new(),
            namespaces: HashMap::new(),
            slices: HashMap::new(),
            slice_service: HashMap::new(),
            reverse: HashMap::new(),
            serial: now_serial(),
            services_synced: false,
            slices_synced: false,
        }
    }

    fn touch(&mut self) {
        // The SOA serial must grow with every change, even several within a second.
        self.serial = now_serial().max(self.serial.wrapping_add(1));
    }

    fn unindex(&mut self, ips: impl IntoIterator<Item = IpAddr>, keep: impl Fn(&Owner) -> bool) {
        for ip in ips {
            if let Some(owners) = self.reverse.get_mut(&ip) {
                owners.retain(&keep);
                if owners.is_empty() {
                    self.reverse.remove(&ip);
                }
            }
        }
    }

    /// Adds or replaces a Service.
    pub(crate) fn apply_service(&mut self, svc: &Service) {
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let k = key(ns, name);
        let Some(info) = service_info(svc) else {
            self.delete_service(ns, name);
            return;
        };
        if self.services.get(&k) == Some(&info) {
            return;
        }
        self.delete_service(ns, name);
        if let Kind::ClusterIp(ips) = &info.kind {
            for ip in ips {
                self.reverse
                    .entry(*ip)
                    .or_default()
                    .push(Owner::ClusterIp(k.clone()));
            }
        }
        *self.namespaces.entry(k.0.clone()).or_default() += 1;
        self.services.insert(k, info);
        self.touch();
    }

    /// Removes a Service; its slices stay until they are deleted themselves.
    pub(crate) fn delete_service(&mut self, ns: &str, name: &str) {
        let k = key(ns, name);
        let Some(old) = self.services.remove(&k) else {
            return;
        };
        if let Kind::ClusterIp(ips) = old.kind {
            self.unindex(ips, |o| *o != Owner::ClusterIp(k.clone()));
        }
        if let Some(n) = self.namespaces.get_mut(&k.0) {
            *n -= 1;
            if *n == 0 {
                self.namespaces.remove(&k.0);
            }
        }
        self.touch();
    }

    /// Adds or replaces an EndpointSlice, filed under its `kubernetes.io/service-name`.
    pub(crate) fn apply_slice(&mut self, s: &EndpointSlice) {
        let ns = s.metadata.namespace.as_deref().unwrap_or("default");
        let name = s.metadata.name.as_deref().unwrap_or_default();
        let Some(service) = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
        else {
            self.delete_slice(ns, name);
            return;
        };
        let svc_key = key(ns, service);
        let slice_name = name.to_ascii_lowercase();
        let info = slice_info(s);
        if self.slices.get(&svc_key).and_then(|m| m.get(&slice_name)) == Some(&info) {
            return;
        }
        self.delete_slice(ns, name);
        for ep in &info.endpoints {
            self.reverse
                .entry(ep.ip)
                .or_default()
                .push(Owner::Endpoint {
                    service: svc_key.clone(),
                    slice: slice_name.clone(),
                    hostname: ep.hostname.clone(),
                });
        }
        self.slice_service.insert(key(ns, name), svc_key.1.clone());
        self.slices
            .entry(svc_key)
            .or_default()
            .insert(slice_name, info);
        self.touch();
    }

    pub(crate) fn delete_slice(&mut self, ns: &str, name: &str) {
        let sk = key(ns, name);
        let Some(service) = self.slice_service.remove(&sk) else {
            return;
        };
        let svc_key = (sk.0.clone(), service);
        let Some(map) = self.slices.get_mut(&svc_key) else {
            return;
        };
        let Some(old) = map.remove(&sk.1) else {
            return;
        };
        if map.is_empty() {
            self.slices.remove(&svc_key);
        }
        self.unindex(old.endpoints.iter().map(|e| e.ip), |o| {
            !matches!(o, Owner::Endpoint { service, slice, .. } if *service == svc_key && *slice == sk.1)
        });
        self.touch();
    }

    /// Marks one watch as having listed everything.
    pub(crate) fn set_synced(&mut self, what: Watched) {
        match what {
            Watched::Services => self.services_synced = true,
            Watched::EndpointSlices => self.slices_synced = true,
        }
    }

    /// Both watches have listed everything once: until then a missing name may only be
    /// missing here, and the answer is SERVFAIL rather than NXDOMAIN (as CoreDNS).
    pub(crate) fn synced(&self) -> bool {
        self.services_synced && self.slices_synced
    }

    /// The SOA serial: the time of the last change, as CoreDNS's `Modified`.
    pub(crate) fn serial(&self) -> u32 {
        self.serial
    }

    /// The Service `name` in `ns`; both lowercase.
    pub(crate) fn service(&self, ns: &str, name: &str) -> Option<&ServiceInfo> {
        self.services.get(&(ns.to_string(), name.to_string()))
    }

    /// Whether `ns` (lowercase) has a Service.
    pub(crate) fn namespace_exists(&self, ns: &str) -> bool {
        self.namespaces.contains_key(ns)
    }

    /// The ready endpoints of the Service `name` in `ns` (lowercase), slice by slice.
    pub(crate) fn slices(&self, ns: &str, name: &str) -> impl Iterator<Item = &Slice> {
        self.slices
            .get(&(ns.to_string(), name.to_string()))
            .into_iter()
            .flat_map(|m| m.values())
    }

    /// The names owning `ip`: a Service's ClusterIP wins alone; otherwise every endpoint
    /// with that address (CoreDNS's `serviceRecordForIP`).
    pub(crate) fn reverse(&self, ip: &IpAddr) -> Vec<ReverseName> {
        let Some(owners) = self.reverse.get(ip) else {
            return Vec::new();
        };
        if let Some(Owner::ClusterIp(k)) = owners.iter().find(|o| matches!(o, Owner::ClusterIp(_)))
        {
            return vec![ReverseName {
                hostname: None,
                service: k.clone(),
            }];
        }
        let mut out: Vec<ReverseName> = Vec::new();
        for o in owners {
            if let Owner::Endpoint {
                service, hostname, ..
            } = o
            {
                let n = ReverseName {
                    hostname: Some(hostname.clone()),
                    service: service.clone(),
                };
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        out
    }

    /// How many Services are stored.
    pub(crate) fn service_count(&self) -> usize {
        self.services.len()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::EndpointPort;
    use k8s_openapi::api::discovery::v1::{Endpoint as ApiEndpoint, EndpointConditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    pub(crate) fn svc(
        ns: &str,
        name: &str,
        cluster_ips: &[&str],
        ports: &[(&str, &str, i32)],
    ) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: cluster_ips.first().map(|s| s.to_string()),
                cluster_ips: Some(cluster_ips.iter().map(|s| s.to_string()).collect()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, proto, port)| ServicePort {
                            name: (!n.is_empty()).then(|| n.to_string()),
                            protocol: Some(proto.to_string()),
                            port: *port,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub(crate) fn external(ns: &str, name: &str, target: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("ExternalName".into()),
                external_name: Some(target.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// endpoints: (address, hostname, ready)
    pub(crate) fn slice(
        ns: &str,
        name: &str,
        service: &str,
        family: &str,
        endpoints: &[(&str, Option<&str>, Option<bool>)],
        ports: &[(&str, &str, i32)],
    ) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some([(SERVICE_NAME_LABEL.to_string(), service.to_string())].into()),
                ..Default::default()
            },
            address_type: family.into(),
            endpoints: endpoints
                .iter()
                .map(|(a, h, ready)| ApiEndpoint {
                    addresses: vec![a.to_string()],
                    hostname: h.map(str::to_string),
                    conditions: Some(EndpointConditions {
                        ready: *ready,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, proto, port)| EndpointPort {
                        name: Some(n.to_string()),
                        protocol: Some(proto.to_string()),
                        port: Some(*port),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn service_kinds() {
        let cases: Vec<(Service, Option<Kind>)> = vec![
            (
                svc("ns", "web", &["10.96.0.10"], &[]),
                Some(Kind::ClusterIp(vec![ip("10.96.0.10")])),
            ),
            (
                svc("ns", "dual", &["10.96.0.11", "fd00::11"], &[]),
                Some(Kind::ClusterIp(vec![ip("10.96.0.11"), ip("fd00::11")])),
            ),
            (svc("ns", "hl", &["None"], &[]), Some(Kind::Headless)),
            (
                external("ns", "ext", "example.org."),
                Some(Kind::ExternalName("example.org".into())),
            ),
            // CoreDNS serves ExternalName only as a CNAME: an IP literal is not served.
            (external("ns", "extip", "192.0.2.1"), None),
        ];
        for (s, want) in cases {
            let mut r = Records::new();
            r.apply_service(&s);
            let name = s.metadata.name.clone().unwrap();
            assert_eq!(
                r.service("ns", &name).map(|i| i.kind.clone()),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn ports_and_matching() {
        let mut r = Records::new();
        r.apply_service(&svc(
            "ns",
            "Web",
            &["10.96.0.10"],
            &[("HTTP", "TCP", 80), ("dns", "UDP", 53), ("", "TCP", 8080)],
        ));
        let info = r.service("ns", "web").expect("case-insensitive key");
        let table: &[(Option<&str>, Option<&str>, [bool; 3])] = &[
            (None, None, [true, true, true]),
            (Some("http"), Some("tcp"), [true, false, false]),
            (Some("http"), Some("udp"), [false, false, false]),
            (Some("dns"), None, [false, true, false]),
            (None, Some("TCP"), [true, false, true]),
        ];
        for (port, proto, want) in table {
            let got: Vec<bool> = info
                .ports
                .iter()
                .map(|p| p.matches(*port, *proto))
                .collect();
            assert_eq!(got, want.to_vec(), "{port:?} {proto:?}");
        }
    }

    #[test]
    fn slices_keep_ready_endpoints_with_hostnames() {
        let mut r = Records::new();
        r.apply_slice(&slice(
            "ns",
            "hl-abc",
            "hl",
            "IPv4",
            &[
                ("10.0.0.1", Some("web-0"), Some(true)),
                ("10.0.0.2", None, None),
                ("10.0.0.3", None, Some(false)),
            ],
            &[("http", "TCP", 80)],
        ));
        r.apply_slice(&slice(
            "ns",
            "hl-v6",
            "hl",
            "IPv6",
            &[("fd00::2", None, Some(true))],
            &[("http", "TCP", 80)],
        ));
        let eps: Vec<(IpAddr, String)> = r
            .slices("ns", "hl")
            .flat_map(|s| s.endpoints.iter().map(|e| (e.ip, e.hostname.clone())))
            .collect();
        assert_eq!(
            eps,
            vec![
                (ip("10.0.0.1"), "web-0".into()),
                (ip("10.0.0.2"), "10-0-0-2".into()),
                (ip("fd00::2"), "fd00--2".into()),
            ]
        );
        // FQDN slices carry nothing DNS serves.
        r.apply_slice(&slice(
            "ns",
            "f",
            "hl",
            "FQDN",
            &[("a.example", None, None)],
            &[],
        ));
        assert_eq!(
            r.slices("ns", "hl")
                .map(|s| s.endpoints.len())
                .sum::<usize>(),
            3
        );
    }

    #[test]
    fn slice_without_ports_gets_the_sentinel() {
        let mut r = Records::new();
        let mut s = slice("ns", "x", "hl", "IPv4", &[("10.0.0.1", None, None)], &[]);
        s.ports = None;
        r.apply_slice(&s);
        let ports: Vec<Port> = r.slices("ns", "hl").flat_map(|s| s.ports.clone()).collect();
        assert_eq!(
            ports,
            vec![Port {
                name: String::new(),
                protocol: None,
                port: None
            }]
        );
    }

    #[test]
    fn reverse_prefers_cluster_ip_then_lists_endpoints() {
        let mut r = Records::new();
        r.apply_service(&svc("ns", "web", &["10.96.0.10"], &[]));
        r.apply_slice(&slice(
            "ns",
            "a",
            "hl",
            "IPv4",
            &[("10.0.0.1", Some("h"), None)],
            &[],
        ));
        r.apply_slice(&slice(
            "other",
            "b",
            "hl2",
            "IPv4",
            &[("10.0.0.1", None, None)],
            &[],
        ));
        assert_eq!(
            r.reverse(&ip("10.96.0.10")),
            vec![ReverseName {
                hostname: None,
                service: ("ns".into(), "web".into())
            }]
        );
        assert_eq!(
            r.reverse(&ip("10.0.0.1")),
            vec![
                ReverseName {
                    hostname: Some("h".into()),
                    service: ("ns".into(), "hl".into())
                },
                ReverseName {
                    hostname: Some("10-0-0-1".into()),
                    service: ("other".into(), "hl2".into())
                },
            ]
        );
        assert!(r.reverse(&ip("10.0.0.9")).is_empty());
    }

    #[test]
    fn updates_and_deletes_reindex() {
        let mut r = Records::new();
        r.apply_service(&svc("ns", "web", &["10.96.0.10"], &[]));
        let s0 = r.serial();
        r.apply_service(&svc("ns", "web", &["10.96.0.20"], &[]));
        assert!(r.serial() > s0, "a change moves the serial");
        assert!(r.reverse(&ip("10.96.0.10")).is_empty());
        assert_eq!(r.reverse(&ip("10.96.0.20")).len(), 1);
        assert!(r.namespace_exists("ns"));
        r.delete_service("ns", "web");
        assert!(r.reverse(&ip("10.96.0.20")).is_empty());
        assert!(r.service("ns", "web").is_none());
        assert!(!r.namespace_exists("ns"), "no Service left in ns");

        r.apply_slice(&slice(
            "ns",
            "a",
            "hl",
            "IPv4",
            &[("10.0.0.1", None, None)],
            &[],
        ));
        // The slice moves to another service: it leaves the first.
        r.apply_slice(&slice(
            "ns",
            "a",
            "hl2",
            "IPv4",
            &[("10.0.0.2", None, None)],
            &[],
        ));
        assert_eq!(r.slices("ns", "hl").count(), 0);
        assert_eq!(r.slices("ns", "hl2").count(), 1);
        assert!(r.reverse(&ip("10.0.0.1")).is_empty());
        r.delete_slice("ns", "a");
        assert_eq!(r.slices("ns", "hl2").count(), 0);
        assert!(r.reverse(&ip("10.0.0.2")).is_empty());
    }

    #[test]
    fn synced_needs_both_watches() {
        let mut r = Records::new();
        assert!(!r.synced());
        r.set_synced(Watched::Services);
        assert!(!r.synced());
        r.set_synced(Watched::EndpointSlices);
        assert!(r.synced());
    }
}
