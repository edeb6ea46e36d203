//! The proxy's desired model: one [`ServicePort`] per (service, port) with the endpoints
//! that back it (upstream's `ServicePortName`, `BaseServicePortInfo` and `BaseEndpointInfo`).
//!
//! Backends render only this model, never API objects, so the benchmark and the golden
//! tests can drive them without an API server.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

/// The L4 protocol of a service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The lower-case name nftables, iptables and chain names use.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// `namespace/name:port-name` plus protocol: the identity of one service port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub namespace: String,
    pub name: String,
    /// The port's `name` (empty for a single unnamed port).
    pub port: String,
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}/{}", self.namespace, self.name)
        } else {
            write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
        }
    }
}

/// An IPv4 prefix (`loadBalancerSourceRanges`, `--cluster-cidr`, `--nodeport-addresses`).
pub type Cidr = ipnet::Ipv4Net;

/// Everything the data path needs to know about one port of one service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    pub node_port: Option<u16>,
    pub external_ips: Vec<Ipv4Addr>,
    pub load_balancer_ips: Vec<Ipv4Addr>,
    pub load_balancer_source_ranges: Vec<Cidr>,
    /// externalTrafficPolicy: Local (only for services with external destinations).
    pub external_policy_local: bool,
    /// internalTrafficPolicy: Local.
    pub internal_policy_local: bool,
    pub health_check_node_port: Option<u16>,
    /// sessionAffinity: ClientIP, with its timeout in seconds.
    pub affinity_timeout_seconds: Option<u32>,
}

impl ServicePort {
    /// NodePort, externalIPs or LoadBalancer ingress: traffic that can come from outside.
    pub fn has_external_destinations(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }
}

/// One endpoint of a service port, from an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Whether the endpoint is on this node (its `nodeName` is ours).
    pub is_local: bool,
    /// `hints.forZones`, if the slice carries hints for this endpoint.
    pub zone_hints: Option<Vec<String>>,
}

impl Endpoint {
    /// `ip:port`, as upstream names endpoints in chain names and logs.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }
}

/// A service port and its endpoints: the unit a backend renders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEntry {
    pub port: ServicePort,
    pub endpoints: Vec<Endpoint>,
}

/// The whole desired state, ordered so renderings are deterministic.
pub type Snapshot = BTreeMap<ServicePortName, ServiceEntry>;

/// Node-wide facts rendering depends on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeContext {
    /// Traffic from outside this prefix to a ClusterIP is masqueraded (`--cluster-cidr`).
    pub cluster_cidr: Option<Cidr>,
    /// Addresses NodePorts answer on; empty means every local address but 127.0.0.0/8.
    pub nodeport_ips: Vec<Ipv4Addr>,
    /// The node's `topology.kubernetes.io/zone`, for topology hints.
    pub zone: Option<String>,
    /// Masquerade every service packet (`masqueradeAll`).
    pub masquerade_all: bool,
}
