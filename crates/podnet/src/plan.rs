//! The desired kernel state from the cluster's subnet leases: which routes, neighbours and
//! FDB entries this node needs, and which pod CIDRs make up the pod network. Pure: the
//! Nodes come in as [`Lease`]s, the kernel is not looked at.

use ipnet::Ipv4Net;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// k3s's `--flannel-backend`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// A route per node via its InternalIP: nodes share one L2 segment.
    #[default]
    #[value(name = "host-gw")]
    HostGw,
    /// A VXLAN overlay (`nodus.1`, VNI 1, UDP 8472): nodes only need to reach each other.
    Vxlan,
    /// Nothing is programmed: the user brings their own CNI.
    None,
}

impl Backend {
    /// The value of flannel's `backend-type` annotation.
    pub fn annotation(self) -> &'static str {
        match self {
            Backend::HostGw => "host-gw",
            Backend::Vxlan => "vxlan",
            Backend::None => "none",
        }
    }
}

/// One node's share of the pod network, as flannel's subnet manager sees a Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub node: String,
    /// `metadata.creationTimestamp` as RFC 3339 text (orders leases: the older one wins an
    /// overlap). Empty when unknown.
    pub created: String,
    /// The node's IPv4 pod CIDR.
    pub pod_cidr: Ipv4Net,
    /// The node's InternalIP: the next hop (host-gw) or the VTEP's underlay address (vxlan).
    pub public_ip: Ipv4Addr,
    /// The VTEP MAC the node's agent published, when its backend is vxlan.
    pub vtep_mac: Option<Mac>,
}

/// A MAC address in iproute2's form (lower-case, colon-separated).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(String);

impl Mac {
    /// Parses `aa:bb:cc:dd:ee:ff` (any case); `None` for anything else.
    pub fn parse(s: &str) -> Option<Mac> {
        let parts: Vec<&str> = s.split(':').collect();
        let ok = parts.len() == 6
            && parts
                .iter()
                .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()));
        ok.then(|| Mac(s.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A route this agent owns: `dst via gateway [dev dev onlink]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dst: Ipv4Net,
    pub gateway: Ipv4Addr,
    /// Set for vxlan routes (the VXLAN device, reached `onlink`); host-gw routes let the
    /// kernel pick the interface that reaches the gateway.
    pub dev: Option<String>,
}

/// Two nodes whose pod CIDRs overlap: `node` (the later) gets no route.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Conflict {
    pub node: String,
    pub pod_cidr: Ipv4Net,
    pub with_node: String,
    pub with_cidr: Ipv4Net,
}

impl Conflict {
    pub fn message(&self) -> String {
        format!(
            "pod CIDR {} of node {} overlaps pod CIDR {} of node {}: no route to node {} is programmed",
            self.pod_cidr, self.node, self.with_cidr, self.with_node, self.node
        )
    }
}

/// What the kernel of this node should hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Keyed by destination.
    pub routes: BTreeMap<Ipv4Net, Route>,
    /// vxlan: `<peer podCIDR>.0 lladdr <peer VTEP MAC>` on the VXLAN device.
    pub neighbours: BTreeMap<Ipv4Addr, Mac>,
    /// vxlan: `<peer VTEP MAC> dst <peer InternalIP>` on the VXLAN device.
    pub fdb: BTreeMap<Mac, Ipv4Addr>,
    /// Every accepted node's pod CIDR, this node's included: the pod network, inside which
    /// nothing is masqueraded.
    pub pod_cidrs: Vec<Ipv4Net>,
    pub conflicts: Vec<Conflict>,
    /// vxlan peers whose agent has not published a VTEP MAC yet.
    pub waiting: Vec<String>,
}

/// The name of the VXLAN device (flannel's `flannel.<VNI>`).
pub const VXLAN_DEVICE: &str = "nodus.1";

/// The address a node's VTEP answers on: its pod CIDR's network address (`<podCIDR>.0`).
pub fn vtep_address(pod_cidr: Ipv4Net) -> Ipv4Addr {
    pod_cidr.network()
}

/// The plan for node `own` with `backend`, given every node's lease (this node's included).
///
/// Leases are taken oldest first (creation time, then name); one whose CIDR overlaps an
/// accepted one is a [`Conflict`] and gets nothing. A peer overlapping this node's own pod
/// CIDR never gets a route either, whichever is older: local pods come first.
pub fn plan(own: &str, backend: Backend, leases: &[Lease]) -> Plan {
    let mut out = Plan::default();
    if backend == Backend::None {
        return out;
    }
    let mut ordered: Vec<&Lease> = leases.iter().collect();
    ordered.sort_by(|a, b| (&a.created, &a.node).cmp(&(&b.created, &b.node)));
    let mut accepted: Vec<&Lease> = Vec::new();
    for l in ordered {
        if let Some(w) = accepted.iter().find(|a| overlaps(a.pod_cidr, l.pod_cidr)) {
            out.conflicts.push(Conflict {
                node: l.node.clone(),
                pod_cidr: l.pod_cidr,
                with_node: w.node.clone(),
                with_cidr: w.pod_cidr,
            });
            continue;
        }
        accepted.push(l);
    }
    let own_cidr = leases.iter().find(|l| l.node == own).map(|l| l.pod_cidr);
    for l in &accepted {
        out.pod_cidrs.push(l.pod_cidr);
        if l.node == own || own_cidr.is_some_and(|c| overlaps(c, l.pod_cidr)) {
            continue;
        }
        match backend {
            Backend::HostGw => {
                out.routes.insert(
                    l.pod_cidr,
                    Route {
                        dst: l.pod_cidr,
                        gateway: l.public_ip,
                        dev: None,
                    },
                );
            }
            Backend::Vxlan => {
                let Some(mac) = &l.vtep_mac else {
                    out.waiting.push(l.node.clone());
                    continue;
                };
                let vtep = vtep_address(l.pod_cidr);
                out.routes.insert(
                    l.pod_cidr,
                    Route {
                        dst: l.pod_cidr,
                        gateway: vtep,
                        dev: Some(VXLAN_DEVICE.to_string()),
                    },
                );
                out.neighbours.insert(vtep, mac.clone());
                out.fdb.insert(mac.clone(), l.public_ip);
            }
            Backend::None => {}
        }
    }
    // This node's pods are in the pod network even when its lease lost an overlap.
    if let Some(c) = own_cidr
        && !out.pod_cidrs.contains(&c)
    {
        out.pod_cidrs.push(c);
    }
    out.pod_cidrs.sort();
    out.conflicts.sort();
    out
}

fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(node: &str, created: &str, cidr: &str, ip: &str, mac: Option<&str>) -> Lease {
        Lease {
            node: node.into(),
            created: created.into(),
            pod_cidr: cidr.parse().unwrap(),
            public_ip: ip.parse().unwrap(),
            vtep_mac: mac.map(|m| Mac::parse(m).unwrap()),
        }
    }

    fn routes(p: &Plan) -> Vec<String> {
        p.routes
            .values()
            .map(|r| match &r.dev {
                Some(d) => format!("{} via {} dev {d} onlink", r.dst, r.gateway),
                None => format!("{} via {}", r.dst, r.gateway),
            })
            .collect()
    }

    #[test]
    fn macs_are_validated_and_lower_cased() {
        assert_eq!(
            Mac::parse("AA:bb:0c:DD:ee:0F").unwrap().as_str(),
            "aa:bb:0c:dd:ee:0f"
        );
        for bad in [
            "",
            "aa:bb:cc:dd:ee",
            "aa:bb:cc:dd:ee:fg",
            "aabb.ccdd.eeff",
            "a:b:c:d:e:f",
        ] {
            assert!(Mac::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn plan_table() {
        let a = lease(
            "a",
            "2026-01-01T00:00:01Z",
            "10.42.1.0/24",
            "192.168.0.11",
            Some("02:00:00:00:00:0a"),
        );
        let b = lease(
            "b",
            "2026-01-01T00:00:02Z",
            "10.42.2.0/24",
            "192.168.0.12",
            Some("02:00:00:00:00:0b"),
        );
        let c_no_mac = lease(
            "c",
            "2026-01-01T00:00:03Z",
            "10.42.3.0/24",
            "192.168.1.13",
            None,
        );
        // Overlaps b exactly, created later: b keeps the CIDR.
        let d_dup_b = lease(
            "d",
            "2026-01-01T00:00:04Z",
            "10.42.2.0/24",
            "192.168.0.14",
            Some("02:00:00:00:00:0d"),
        );
        // A /23 over a's /24, created earlier than a: a loses (but a is local on node a).
        let e_wide = lease(
            "e",
            "2026-01-01T00:00:00Z",
            "10.42.0.0/23",
            "192.168.0.15",
            Some("02:00:00:00:00:0e"),
        );

        struct Case {
            name: &'static str,
            own: &'static str,
            backend: Backend,
            leases: Vec<Lease>,
            routes: Vec<&'static str>,
            neighbours: Vec<(&'static str, &'static str)>,
            fdb: Vec<(&'static str, &'static str)>,
            pod_cidrs: Vec<&'static str>,
            conflicts: Vec<(&'static str, &'static str)>,
            waiting: Vec<&'static str>,
        }
        let cases = vec![
            Case {
                name: "host-gw: a route per other node, none to itself",
                own: "a",
                backend: Backend::HostGw,
                leases: vec![a.clone(), b.clone(), c_no_mac.clone()],
                routes: vec![
                    "10.42.2.0/24 via 192.168.0.12",
                    "10.42.3.0/24 via 192.168.1.13",
                ],
                neighbours: vec![],
                fdb: vec![],
                pod_cidrs: vec!["10.42.1.0/24", "10.42.2.0/24", "10.42.3.0/24"],
                conflicts: vec![],
                waiting: vec![],
            },
            Case {
                name: "host-gw: alone, only its own CIDR in the pod network",
                own: "a",
                backend: Backend::HostGw,
                leases: vec![a.clone()],
                routes: vec![],
                neighbours: vec![],
                fdb: vec![],
                pod_cidrs: vec!["10.42.1.0/24"],
                conflicts: vec![],
                waiting: vec![],
            },
            Case {
                name: "vxlan: route via the peer's .0 onlink, neighbour and fdb; a peer without a MAC waits",
                own: "b",
                backend: Backend::Vxlan,
                leases: vec![a.clone(), b.clone(), c_no_mac.clone()],
                routes: vec!["10.42.1.0/24 via 10.42.1.0 dev nodus.1 onlink"],
                neighbours: vec![("10.42.1.0", "02:00:00:00:00:0a")],
                fdb: vec![("02:00:00:00:00:0a", "192.168.0.11")],
                pod_cidrs: vec!["10.42.1.0/24", "10.42.2.0/24", "10.42.3.0/24"],
                conflicts: vec![],
                waiting: vec!["c"],
            },
            Case {
                name: "overlap: the later node gets nothing and is reported",
                own: "a",
                backend: Backend::HostGw,
                leases: vec![d_dup_b.clone(), a.clone(), b.clone()],
                routes: vec!["10.42.2.0/24 via 192.168.0.12"],
                neighbours: vec![],
                fdb: vec![],
                pod_cidrs: vec!["10.42.1.0/24", "10.42.2.0/24"],
                conflicts: vec![("d", "b")],
                waiting: vec![],
            },
            Case {
                name: "overlap with this node: an older peer is still never routed over local pods",
                own: "a",
                backend: Backend::Vxlan,
                leases: vec![a.clone(), b.clone(), e_wide.clone()],
                routes: vec!["10.42.2.0/24 via 10.42.2.0 dev nodus.1 onlink"],
                neighbours: vec![("10.42.2.0", "02:00:00:00:00:0b")],
                fdb: vec![("02:00:00:00:00:0b", "192.168.0.12")],
                pod_cidrs: vec!["10.42.0.0/23", "10.42.1.0/24", "10.42.2.0/24"],
                conflicts: vec![("a", "e")],
                waiting: vec![],
            },
            Case {
                name: "none: nothing at all",
                own: "a",
                backend: Backend::None,
                leases: vec![a.clone(), b.clone(), d_dup_b.clone()],
                routes: vec![],
                neighbours: vec![],
                fdb: vec![],
                pod_cidrs: vec![],
                conflicts: vec![],
                waiting: vec![],
            },
            Case {
                name: "this node without a lease yet: peers are routed",
                own: "z",
                backend: Backend::HostGw,
                leases: vec![a.clone()],
                routes: vec!["10.42.1.0/24 via 192.168.0.11"],
                neighbours: vec![],
                fdb: vec![],
                pod_cidrs: vec!["10.42.1.0/24"],
                conflicts: vec![],
                waiting: vec![],
            },
        ];
        for c in cases {
            let p = plan(c.own, c.backend, &c.leases);
            assert_eq!(routes(&p), c.routes, "{}", c.name);
            let neigh: Vec<(String, String)> = p
                .neighbours
                .iter()
                .map(|(ip, m)| (ip.to_string(), m.to_string()))
                .collect();
            let want: Vec<(String, String)> = c
                .neighbours
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            assert_eq!(neigh, want, "{}", c.name);
            let fdb: Vec<(String, String)> = p
                .fdb
                .iter()
                .map(|(m, ip)| (m.to_string(), ip.to_string()))
                .collect();
            let want: Vec<(String, String)> = c
                .fdb
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            assert_eq!(fdb, want, "{}", c.name);
            let cidrs: Vec<String> = p.pod_cidrs.iter().map(|c| c.to_string()).collect();
            assert_eq!(cidrs, c.pod_cidrs, "{}", c.name);
            let conflicts: Vec<(&str, &str)> = p
                .conflicts
                .iter()
                .map(|x| (x.node.as_str(), x.with_node.as_str()))
                .collect();
            assert_eq!(conflicts, c.conflicts, "{}", c.name);
            assert_eq!(p.waiting, c.waiting, "{}", c.name);
        }
    }

    #[test]
    fn a_moved_node_moves_its_route() {
        let a = lease(
            "a",
            "1",
            "10.42.1.0/24",
            "192.168.0.11",
            Some("02:00:00:00:00:0a"),
        );
        let mut b = lease(
            "b",
            "2",
            "10.42.2.0/24",
            "192.168.0.12",
            Some("02:00:00:00:00:0b"),
        );
        let before = plan("a", Backend::Vxlan, &[a.clone(), b.clone()]);
        b.public_ip = "192.168.0.99".parse().unwrap();
        let after = plan("a", Backend::Vxlan, &[a, b]);
        assert_eq!(before.routes, after.routes);
        assert_eq!(
            after
                .fdb
                .values()
                .map(|i| i.to_string())
                .collect::<Vec<_>>(),
            ["192.168.0.99"]
        );
        let msg = Conflict {
            node: "d".into(),
            pod_cidr: "10.42.2.0/24".parse().unwrap(),
            with_node: "b".into(),
            with_cidr: "10.42.2.0/24".parse().unwrap(),
        }
        .message();
        assert_eq!(
            msg,
            "pod CIDR 10.42.2.0/24 of node d overlaps pod CIDR 10.42.2.0/24 of node b: no route to node d is programmed"
        );
    }
}
