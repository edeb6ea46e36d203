//! Query → response, as CoreDNS's kubernetes plugin answers under the cluster zone and its
//! reverse zones (with `pods insecure` and `fallthrough in-addr.arpa ip6.arpa`, the default
//! Corefile): pure, no I/O. What is not ours is handed back as [`Reply::Forward`].

use crate::records::{Kind, Records};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use std::net::IpAddr;

/// The schema version `dns-version.<zone>` answers (the specification's 1.1.0).
pub(crate) const DNS_SCHEMA_VERSION: &str = "1.1.0";
/// CoreDNS's TTL of the `dns-version` TXT record.
const DNS_VERSION_TTL: u32 = 28800;
/// CoreDNS's SOA timers (refresh, retry, expire).
const SOA_REFRESH: i32 = 7200;
const SOA_RETRY: i32 = 1800;
const SOA_EXPIRE: i32 = 86400;
/// How many in-zone CNAMEs are followed (CoreDNS stops at 8).
const MAX_CNAME_DEPTH: usize = 8;
/// The largest UDP payload we advertise and honour (RFC 6891's practical ceiling).
const MAX_EDNS_PAYLOAD: u16 = 4096;

/// The served zone and answer settings.
#[derive(Clone, Debug)]
pub(crate) struct Zone {
    /// Lowercase, fully qualified.
    name: Name,
    ttl: u32,
    ns: Name,
    mbox: Name,
}

impl Zone {
    pub(crate) fn new(domain: &str, ttl: u32) -> Result<Self, String> {
        let mut name = Name::from_ascii(domain.trim_end_matches('.'))
            .map_err(|e| format!("cluster domain {domain:?}: {e}"))?
            .to_lowercase();
        name.set_fqdn(true);
        if name.num_labels() == 0 {
            return Err(format!("cluster domain {domain:?} is the root"));
        }
        let sub = |l: &str| Name::from_ascii(l).and_then(|n| n.append_domain(&name));
        let ns = sub("ns.dns").map_err(|e| e.to_string())?;
        let mbox = sub("hostmaster").map_err(|e| e.to_string())?;
        Ok(Self {
            name,
            ttl,
            ns,
            mbox,
        })
    }

    fn soa(&self, serial: u32) -> Record {
        Record::from_rdata(
            self.name.clone(),
            self.ttl,
            RData::SOA(SOA::new(
                self.ns.clone(),
                self.mbox.clone(),
                serial,
                SOA_REFRESH,
                SOA_RETRY,
                SOA_EXPIRE,
                self.ttl,
            )),
        )
    }

    /// `labels` (relative to the zone) + the zone.
    fn name(&self, labels: &[String]) -> Option<Name> {
        Name::from_labels(labels.iter().map(|l| l.as_bytes()))
            .and_then(|n| n.append_domain(&self.name))
            .ok()
    }

    /// The labels of `name` below the zone, lowercase; `None` when outside it.
    fn relative(&self, name: &Name) -> Option<Vec<String>> {
        if !self.name.zone_of(name) {
            return None;
        }
        // Count labels by iterating: `num_labels` leaves out a leading `*`.
        let below = name.iter().count() - self.name.iter().count();
        Some(
            name.iter()
                .take(below)
                .map(|l| String::from_utf8_lossy(l).to_ascii_lowercase())
                .collect(),
        )
    }
}

/// What to do with a query.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The complete response.
    Local(Message),
    /// Not ours: the query goes to the upstream resolvers as it is.
    Forward,
    /// An ExternalName's CNAME to a name outside the zone: `response` holds the CNAME;
    /// the target's records of `qtype`, resolved upstream, are appended to it.
    Chase {
        response: Message,
        target: Name,
        qtype: RecordType,
    },
}

/// Why a datagram gets no normal answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Rejected {
    /// Undecodable, but the ID was readable: answer FORMERR with it.
    FormErr(u16),
    /// Unreadable, or a response, which must never be answered: drop it.
    Drop,
}

impl Rejected {
    /// The FORMERR response, if one is owed.
    pub(crate) fn response(&self) -> Option<Message> {
        match self {
            Self::FormErr(id) => Some(Message::error_msg(
                *id,
                OpCode::Query,
                ResponseCode::FormErr,
            )),
            Self::Drop => None,
        }
    }
}

/// Decodes a query.
pub(crate) fn decode(bytes: &[u8]) -> Result<Message, Rejected> {
    match Message::from_vec(bytes) {
        Ok(m) if m.metadata.message_type == MessageType::Response => Err(Rejected::Drop),
        Ok(m) => Ok(m),
        Err(_) if bytes.len() >= 2 => {
            // A set QR bit marks a response: never answer it, so two servers cannot loop.
            if bytes.len() > 2 && bytes[2] & 0x80 != 0 {
                return Err(Rejected::Drop);
            }
            Err(Rejected::FormErr(u16::from_be_bytes([bytes[0], bytes[1]])))
        }
        Err(_) => Err(Rejected::Drop),
    }
}

/// The UDP payload size the client accepts: 512 without EDNS.
pub(crate) fn udp_limit(req: &Message) -> usize {
    req.edns
        .as_ref()
        .map(|e| e.max_payload().clamp(512, MAX_EDNS_PAYLOAD))
        .unwrap_or(512) as usize
}

/// A response to `req` carrying its question, ID, RD and EDNS presence.
pub(crate) fn response(req: &Message, rcode: ResponseCode) -> Message {
    let mut m = Message::response(req.metadata.id, req.metadata.op_code);
    m.metadata.recursion_desired = req.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.metadata.response_code = rcode;
    m.queries = req.queries.clone();
    if req.edns.is_some() {
        let mut e = Edns::new();
        e.set_max_payload(MAX_EDNS_PAYLOAD);
        m.edns = Some(e);
    }
    m
}

/// Drops every record and sets TC: the client retries over TCP.
pub(crate) fn truncated(resp: &Message) -> Message {
    let mut m = resp.clone();
    m.answers.clear();
    m.authorities.clear();
    m.additionals.clear();
    m.metadata.truncation = true;
    m
}

/// Where a name points.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Host {
    Ip(IpAddr),
    Cname(String),
}

/// One record source, as CoreDNS's `msg.Service`: the name it lives at (relative to the
/// zone), where it points, and the port for SRV.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    labels: Vec<String>,
    host: Host,
    port: Option<u16>,
}

/// The name does not exist (NXDOMAIN).
#[derive(Debug, PartialEq, Eq)]
struct NameError;

fn strip_underscore(s: &str) -> &str {
    s.strip_prefix('_').unwrap_or(s)
}

/// `a-b-c-d` or `fd00--1` back to an address.
fn pod_ip(label: &str) -> Option<IpAddr> {
    let text = if label.matches('-').count() == 3 && !label.contains("--") {
        label.replace('-', ".")
    } else {
        label.replace('-', ":")
    };
    text.parse().ok()
}

/// CoreDNS's `parseRequest` + `findServices`/`findPods`: the entries behind the labels below
/// the zone. `Ok(empty)` is a name that exists without records (NODATA).
fn lookup(store: &Records, rel: &[String]) -> Result<Vec<Entry>, NameError> {
    let n = rel.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let pod = match rel[n - 1].as_str() {
        "svc" => false,
        "pod" => true,
        _ => return Err(NameError),
    };
    if n == 1 {
        return Ok(Vec::new());
    }
    let ns = rel[n - 2].as_str();
    if pod {
        // Pods insecure: any well-formed address answers itself.
        return match n {
            2 => Ok(Vec::new()),
            3 => pod_ip(&rel[0])
                .map(|ip| {
                    vec![Entry {
                        labels: rel.to_vec(),
                        host: Host::Ip(ip),
                        port: None,
                    }]
                })
                .ok_or(NameError),
            _ => Err(NameError),
        };
    }
    if !store.namespace_exists(ns) {
        return Err(NameError);
    }
    if n == 2 {
        return Ok(Vec::new());
    }
    let service = rel[n - 3].as_str();
    // One label left is an endpoint; two are `_port._protocol`; more is too long.
    let (endpoint, port, proto) = match n {
        3 => (None, None, None),
        4 => (Some(rel[0].as_str()), None, None),
        5 => (
            None,
            Some(strip_underscore(&rel[0])),
            Some(strip_underscore(&rel[1])),
        ),
        _ => return Err(NameError),
    };
    let Some(info) = store.service(ns, service) else {
        return Err(NameError);
    };
    let svc_labels = || vec![service.to_string(), ns.to_string(), "svc".to_string()];
    let mut out = Vec::new();
    match &info.kind {
        Kind::ExternalName(target) => {
            if endpoint.is_some() {
                return Err(NameError);
            }
            out.push(Entry {
                labels: svc_labels(),
                host: Host::Cname(target.clone()),
                port: None,
            });
        }
        // Endpoint names resolve for every Service with endpoints, as in CoreDNS.
        _ if matches!(info.kind, Kind::Headless) || endpoint.is_some() => {
            for slice in store.slices(ns, service) {
                for ep in &slice.endpoints {
                    if endpoint.is_some_and(|e| e != ep.hostname) {
                        continue;
                    }
                    for p in slice.ports.iter().filter(|p| p.matches(port, proto)) {
                        let mut labels = svc_labels();
                        labels.insert(0, ep.hostname.clone());
                        out.push(Entry {
                            labels,
                            host: Host::Ip(ep.ip),
                            port: p.port,
                        });
                    }
                }
            }
        }
        Kind::ClusterIp(ips) => {
            for p in info.ports.iter().filter(|p| p.matches(port, proto)) {
                for ip in ips {
                    out.push(Entry {
                        labels: svc_labels(),
                        host: Host::Ip(*ip),
                        port: p.port,
                    });
                }
            }
        }
        Kind::Headless => unreachable!("matched above"),
    }
    if out.is_empty() {
        Err(NameError)
    } else {
        Ok(out)
    }
}

fn address_record(owner: &Name, ip: IpAddr, ttl: u32) -> Record {
    let data = match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    };
    Record::from_rdata(owner.clone(), ttl, data)
}

fn wants(qtype: RecordType, ip: &IpAddr) -> bool {
    matches!(
        (qtype, ip),
        (RecordType::A, IpAddr::V4(_)) | (RecordType::AAAA, IpAddr::V6(_))
    )
}

/// A/AAAA records for `owner`, following CNAMEs inside the zone; a CNAME leaving the zone
/// is returned for the caller to chase upstream.
fn addresses(
    zone: &Zone,
    store: &Records,
    owner: &Name,
    entries: &[Entry],
    qtype: RecordType,
    depth: usize,
    out: &mut Vec<Record>,
) -> Option<Name> {
    let mut chase = None;
    for e in entries {
        match &e.host {
            Host::Ip(ip) if wants(qtype, ip) => {
                let r = address_record(owner, *ip, zone.ttl);
                if !out.contains(&r) {
                    out.push(r);
                }
            }
            Host::Ip(_) => {}
            Host::Cname(target) => {
                let Ok(mut target) = Name::from_ascii(target) else {
                    continue;
                };
                target.set_fqdn(true);
                if target.eq(owner) {
                    continue;
                }
                out.push(Record::from_rdata(
                    owner.clone(),
                    zone.ttl,
                    RData::CNAME(CNAME(target.clone())),
                ));
                match zone.relative(&target) {
                    Some(rel) if depth < MAX_CNAME_DEPTH => {
                        if let Ok(next) = lookup(store, &rel) {
                            chase = chase.or(addresses(
                                zone,
                                store,
                                &target,
                                &next,
                                qtype,
                                depth + 1,
                                out,
                            ));
                        }
                    }
                    Some(_) => {}
                    None => chase = chase.or(Some(target)),
                }
            }
        }
    }
    chase
}

/// CoreDNS's SRV: priority 0, the weight shared evenly (100 / entries, at least 1), one
/// record per (target, port), the targets' addresses as additional records.
fn srv(
    zone: &Zone,
    owner: &Name,
    entries: &[Entry],
    answers: &mut Vec<Record>,
    extra: &mut Vec<Record>,
) {
    let internal: Vec<&Entry> = entries
        .iter()
        .filter(|e| matches!(e.host, Host::Ip(_)))
        .collect();
    if internal.is_empty() {
        return;
    }
    let weight = ((100.0 / internal.len() as f64).floor() as u16).max(1);
    for e in internal {
        let (Host::Ip(ip), Some(port)) = (&e.host, e.port) else {
            continue;
        };
        let Some(target) = zone.name(&e.labels) else {
            continue;
        };
        let r = Record::from_rdata(
            owner.clone(),
            zone.ttl,
            RData::SRV(SRV::new(0, weight, port, target.clone())),
        );
        if !answers.contains(&r) {
            answers.push(r);
        }
        let a = address_record(&target, *ip, zone.ttl);
        if !extra.contains(&a) {
            extra.push(a);
        }
    }
}

/// A reverse name's address when it names a whole one.
fn reverse_ip(name: &Name) -> Option<IpAddr> {
    let net = name.parse_arpa_name().ok()?;
    (net.prefix_len() == net.max_prefix_len()).then(|| net.addr())
}

fn is_reverse(name: &Name) -> bool {
    let mut labels = name.iter().rev();
    labels
        .next()
        .is_some_and(|l| l.eq_ignore_ascii_case(b"arpa"))
        && labels
            .next()
            .is_some_and(|l| l.eq_ignore_ascii_case(b"in-addr") || l.eq_ignore_ascii_case(b"ip6"))
}

/// Answers `req` from `store`, or says it goes upstream.
pub(crate) fn answer(zone: &Zone, store: &Records, req: &Message) -> Reply {
    if req.metadata.op_code != OpCode::Query {
        return Reply::Local(response(req, ResponseCode::NotImp));
    }
    let [query] = req.queries.as_slice() else {
        return Reply::Local(response(req, ResponseCode::FormErr));
    };
    let qname = query.name();
    let qtype = query.query_type();
    if query.query_class() != DNSClass::IN {
        return Reply::Forward;
    }
    let Some(rel) = zone.relative(qname) else {
        // Reverse names we own are answered; the rest fall through to the forwarder.
        if qtype == RecordType::PTR
            && is_reverse(qname)
            && let Some(ip) = reverse_ip(qname)
        {
            let names = store.reverse(&ip);
            if !names.is_empty() {
                let mut m = response(req, ResponseCode::NoError);
                m.metadata.authoritative = true;
                for n in names {
                    let mut labels = vec![n.service.1, n.service.0, "svc".to_string()];
                    if let Some(h) = n.hostname {
                        labels.insert(0, h);
                    }
                    if let Some(target) = zone.name(&labels) {
                        m.answers.push(Record::from_rdata(
                            qname.clone(),
                            zone.ttl,
                            RData::PTR(PTR(target)),
                        ));
                    }
                }
                return Reply::Local(m);
            }
        }
        return Reply::Forward;
    };

    let mut m = response(req, ResponseCode::NoError);
    m.metadata.authoritative = true;
    if matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
        m.metadata.authoritative = false;
        m.metadata.response_code = ResponseCode::Refused;
        return Reply::Local(m);
    }
    if rel.is_empty() && qtype == RecordType::SOA {
        m.answers.push(zone.soa(store.serial()));
        return Reply::Local(m);
    }
    if rel.is_empty() && qtype == RecordType::NS {
        m.answers.push(Record::from_rdata(
            qname.clone(),
            zone.ttl,
            RData::NS(NS(zone.ns.clone())),
        ));
        return Reply::Local(m);
    }
    if qtype == RecordType::TXT && rel == ["dns-version"] {
        m.answers.push(Record::from_rdata(
            qname.clone(),
            DNS_VERSION_TTL,
            RData::TXT(TXT::new(vec![DNS_SCHEMA_VERSION.to_string()])),
        ));
        return Reply::Local(m);
    }

    let entries = match lookup(store, &rel) {
        Ok(e) => e,
        Err(NameError) => {
            // Before the first full list a name may only be missing here.
            if !store.synced() {
                m.metadata.authoritative = false;
                m.metadata.response_code = ResponseCode::ServFail;
                return Reply::Local(m);
            }
            m.metadata.response_code = ResponseCode::NXDomain;
            m.authorities.push(zone.soa(store.serial()));
            return Reply::Local(m);
        }
    };
    let mut chase = None;
    match qtype {
        RecordType::A | RecordType::AAAA => {
            chase = addresses(zone, store, qname, &entries, qtype, 0, &mut m.answers);
        }
        RecordType::CNAME => {
            for e in &entries {
                if let Host::Cname(t) = &e.host
                    && let Ok(mut t) = Name::from_ascii(t)
                {
                    t.set_fqdn(true);
                    m.answers.push(Record::from_rdata(
                        qname.clone(),
                        zone.ttl,
                        RData::CNAME(CNAME(t)),
                    ));
                }
            }
        }
        RecordType::SRV => {
            let mut extra = Vec::new();
            srv(zone, qname, &entries, &mut m.answers, &mut extra);
            m.additionals = extra;
        }
        _ => {}
    }
    if m.answers.is_empty() {
        // NODATA: the name exists, without records of this type.
        m.authorities.push(zone.soa(store.serial()));
    }
    match chase {
        Some(target) => Reply::Chase {
            response: m,
            target,
            qtype,
        },
        None => Reply::Local(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Watched;
    use crate::records::tests::{external, slice, svc};
    use hickory_proto::op::Query;
    use std::str::FromStr;

    fn store() -> Records {
        let mut r = Records::new();
        r.apply_service(&svc(
            "default",
            "web",
            &["10.96.0.10"],
            &[("http", "TCP", 80), ("dns", "UDP", 53)],
        ));
        r.apply_service(&svc(
            "default",
            "dual",
            &["10.96.0.11", "fd00::11"],
            &[("", "TCP", 80)],
        ));
        r.apply_service(&svc("default", "hl", &["None"], &[("http", "TCP", 80)]));
        r.apply_service(&svc("default", "empty", &["None"], &[]));
        r.apply_service(&external("default", "ext", "example.org"));
        r.apply_service(&external(
            "default",
            "alias",
            "web.default.svc.cluster.local",
        ));
        r.apply_slice(&slice(
            "default",
            "hl-1",
            "hl",
            "IPv4",
            &[
                ("10.0.0.1", Some("web-0"), Some(true)),
                ("10.0.0.2", None, None),
                ("10.0.0.3", Some("down"), Some(false)),
            ],
            &[("http", "TCP", 8080)],
        ));
        r.apply_slice(&slice(
            "default",
            "web-1",
            "web",
            "IPv4",
            &[("10.0.1.1", None, Some(true))],
            &[("http", "TCP", 8080)],
        ));
        r.set_synced(Watched::Services);
        r.set_synced(Watched::EndpointSlices);
        r
    }

    fn zone() -> Zone {
        Zone::new("cluster.local", 5).unwrap()
    }

    fn query(name: &str, t: RecordType) -> Message {
        let mut m = Message::query();
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m
    }

    /// The response's rcode and its answers as `type data` strings.
    fn ask(
        store: &Records,
        name: &str,
        t: RecordType,
    ) -> (ResponseCode, Vec<String>, Vec<String>, bool) {
        match answer(&zone(), store, &query(name, t)) {
            Reply::Local(m) | Reply::Chase { response: m, .. } => (
                m.metadata.response_code,
                m.answers
                    .iter()
                    .map(|r| format!("{} {} {}", r.name, r.record_type(), r.data))
                    .collect(),
                m.additionals
                    .iter()
                    .map(|r| format!("{} {} {}", r.name, r.record_type(), r.data))
                    .collect(),
                m.authorities
                    .iter()
                    .any(|r| r.record_type() == RecordType::SOA),
            ),
            Reply::Forward => (
                ResponseCode::Unknown(0xfff),
                vec!["forward".into()],
                vec![],
                false,
            ),
        }
    }

    use RecordType as T;
    const NX: ResponseCode = ResponseCode::NXDomain;
    const OK: ResponseCode = ResponseCode::NoError;

    #[test]
    fn answers_by_rule() {
        let s = store();
        let z = "cluster.local.";
        #[rustfmt::skip]
        let table: Vec<(&str, RecordType, ResponseCode, Vec<String>)> = vec![
            // ClusterIP services: their ClusterIPs, by family.
            ("web.default.svc.cluster.local.", T::A, OK, vec![format!("web.default.svc.{z} A 10.96.0.10")]),
            ("WEB.Default.svc.cluster.local.", T::A, OK, vec![format!("WEB.Default.svc.{z} A 10.96.0.10")]),
            ("web.default.svc.cluster.local.", T::AAAA, OK, vec![]),
            ("dual.default.svc.cluster.local.", T::AAAA, OK, vec![format!("dual.default.svc.{z} AAAA fd00::11")]),
            // Endpoint names resolve for ClusterIP services too (CoreDNS).
            ("10-0-1-1.web.default.svc.cluster.local.", T::A, OK, vec![format!("10-0-1-1.web.default.svc.{z} A 10.0.1.1")]),
            // Headless: one record per ready endpoint; hostnames name their endpoint.
            ("hl.default.svc.cluster.local.", T::A, OK, vec![
                format!("hl.default.svc.{z} A 10.0.0.1"),
                format!("hl.default.svc.{z} A 10.0.0.2"),
            ]),
            ("web-0.hl.default.svc.cluster.local.", T::A, OK, vec![format!("web-0.hl.default.svc.{z} A 10.0.0.1")]),
            ("10-0-0-2.hl.default.svc.cluster.local.", T::A, OK, vec![format!("10-0-0-2.hl.default.svc.{z} A 10.0.0.2")]),
            ("down.hl.default.svc.cluster.local.", T::A, NX, vec![]),
            ("nope.hl.default.svc.cluster.local.", T::A, NX, vec![]),
            // A headless service without ready endpoints does not exist (CoreDNS).
            ("empty.default.svc.cluster.local.", T::A, NX, vec![]),
            // ExternalName: a CNAME; inside the zone it is followed.
            ("ext.default.svc.cluster.local.", T::CNAME, OK, vec![format!("ext.default.svc.{z} CNAME example.org.")]),
            ("alias.default.svc.cluster.local.", T::A, OK, vec![
                format!("alias.default.svc.{z} CNAME web.default.svc.{z}"),
                format!("web.default.svc.{z} A 10.96.0.10"),
            ]),
            ("x.ext.default.svc.cluster.local.", T::A, NX, vec![]),
            // Pods insecure.
            ("10-244-1-5.default.pod.cluster.local.", T::A, OK, vec![format!("10-244-1-5.default.pod.{z} A 10.244.1.5")]),
            ("fd00--5.any.pod.cluster.local.", T::AAAA, OK, vec![format!("fd00--5.any.pod.{z} AAAA fd00::5")]),
            ("10-244-1-5.default.pod.cluster.local.", T::AAAA, OK, vec![]),
            ("not-an-ip.default.pod.cluster.local.", T::A, NX, vec![]),
            // Names that exist without records: NODATA.
            ("cluster.local.", T::A, OK, vec![]),
            ("svc.cluster.local.", T::A, OK, vec![]),
            ("default.svc.cluster.local.", T::A, OK, vec![]),
            ("default.pod.cluster.local.", T::A, OK, vec![]),
            ("web.default.svc.cluster.local.", T::MX, OK, vec![]),
            ("web.default.svc.cluster.local.", T::TXT, OK, vec![]),
            ("web.default.svc.cluster.local.", T::PTR, OK, vec![]),
            // Names that do not exist: NXDOMAIN.
            ("nope.default.svc.cluster.local.", T::A, NX, vec![]),
            ("web.nons.svc.cluster.local.", T::A, NX, vec![]),
            ("nope.default.svc.cluster.local.", T::MX, NX, vec![]),
            ("foo.cluster.local.", T::A, NX, vec![]),
            // No wildcards (CoreDNS dropped them).
            ("*.default.svc.cluster.local.", T::A, NX, vec![]),
            ("a.b._http._tcp.web.default.svc.cluster.local.", T::A, NX, vec![]),
            // Schema version.
            ("dns-version.cluster.local.", T::TXT, OK, vec![format!("dns-version.{z} TXT 1.1.0")]),
            // Apex.
            ("cluster.local.", T::NS, OK, vec![format!("{z} NS ns.dns.{z}")]),
        ];
        for (name, t, rcode, want) in table {
            let (got_rcode, got, _, soa) = ask(&s, name, t);
            assert_eq!((got_rcode, &got), (rcode, &want), "{name} {t}");
            assert_eq!(
                soa,
                got.is_empty(),
                "{name} {t}: SOA in authority iff negative"
            );
        }
    }

    #[test]
    fn srv_records() {
        let s = store();
        let z = "cluster.local.";
        #[rustfmt::skip]
        let table: Vec<(&str, ResponseCode, Vec<String>, Vec<String>)> = vec![
            // ClusterIP: the target is the service name.
            ("_http._tcp.web.default.svc.cluster.local.", OK,
                vec![format!("_http._tcp.web.default.svc.{z} SRV 0 100 80 web.default.svc.{z}")],
                vec![format!("web.default.svc.{z} A 10.96.0.10")]),
            ("_dns._udp.web.default.svc.cluster.local.", OK,
                vec![format!("_dns._udp.web.default.svc.{z} SRV 0 100 53 web.default.svc.{z}")],
                vec![format!("web.default.svc.{z} A 10.96.0.10")]),
            ("_http._udp.web.default.svc.cluster.local.", NX, vec![], vec![]),
            ("_nope._tcp.web.default.svc.cluster.local.", NX, vec![], vec![]),
            // Without port labels every port answers.
            ("web.default.svc.cluster.local.", OK,
                vec![
                    format!("web.default.svc.{z} SRV 0 50 80 web.default.svc.{z}"),
                    format!("web.default.svc.{z} SRV 0 50 53 web.default.svc.{z}"),
                ],
                vec![format!("web.default.svc.{z} A 10.96.0.10")]),
            // Headless: one per endpoint, the endpoint's port, target by hostname or dashed IP.
            ("_http._tcp.hl.default.svc.cluster.local.", OK,
                vec![
                    format!("_http._tcp.hl.default.svc.{z} SRV 0 50 8080 web-0.hl.default.svc.{z}"),
                    format!("_http._tcp.hl.default.svc.{z} SRV 0 50 8080 10-0-0-2.hl.default.svc.{z}"),
                ],
                vec![
                    format!("web-0.hl.default.svc.{z} A 10.0.0.1"),
                    format!("10-0-0-2.hl.default.svc.{z} A 10.0.0.2"),
                ]),
            // ExternalName has no SRV (NODATA).
            ("ext.default.svc.cluster.local.", OK, vec![], vec![]),
        ];
        for (name, rcode, want, extra) in table {
            let (got_rcode, got, got_extra, _) = ask(&s, name, T::SRV);
            assert_eq!((got_rcode, got, got_extra), (rcode, want, extra), "{name}");
        }
    }

    #[test]
    fn reverse_names() {
        let s = store();
        let z = "cluster.local.";
        #[rustfmt::skip]
        let table: Vec<(&str, RecordType, Vec<String>)> = vec![
            ("10.0.96.10.in-addr.arpa.", T::PTR, vec![format!("10.0.96.10.in-addr.arpa. PTR web.default.svc.{z}")]),
            ("1.0.0.10.in-addr.arpa.", T::PTR, vec![format!("1.0.0.10.in-addr.arpa. PTR web-0.hl.default.svc.{z}")]),
            ("2.0.0.10.in-addr.arpa.", T::PTR, vec![format!("2.0.0.10.in-addr.arpa. PTR 10-0-0-2.hl.default.svc.{z}")]),
            ("1.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", T::PTR,
                vec![format!("1.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa. PTR dual.default.svc.{z}")]),
            // Unknown addresses, partial names and other types go upstream.
            ("9.9.9.10.in-addr.arpa.", T::PTR, vec!["forward".into()]),
            ("96.10.in-addr.arpa.", T::PTR, vec!["forward".into()]),
            ("10.0.96.10.in-addr.arpa.", T::A, vec!["forward".into()]),
            ("example.org.", T::A, vec!["forward".into()]),
        ];
        for (name, t, want) in table {
            let (_, got, _, _) = ask(&s, name, t);
            assert_eq!(got, want, "{name} {t}");
        }
    }

    #[test]
    fn external_name_outside_the_zone_is_chased() {
        let s = store();
        match answer(&zone(), &s, &query("ext.default.svc.cluster.local.", T::A)) {
            Reply::Chase {
                response,
                target,
                qtype,
            } => {
                assert_eq!(target, Name::from_str("example.org.").unwrap());
                assert_eq!(qtype, T::A);
                assert_eq!(response.answers.len(), 1, "the CNAME itself");
                assert_eq!(response.answers[0].record_type(), T::CNAME);
            }
            other => panic!("want a chase, got {other:?}"),
        }
    }

    #[test]
    fn soa_ttl_and_negative_answers() {
        let s = store();
        let z = Zone::new("Cluster.Local.", 30).unwrap();
        let Reply::Local(m) = answer(&z, &s, &query("cluster.local.", T::SOA)) else {
            panic!("local")
        };
        let r = &m.answers[0];
        assert_eq!(r.ttl, 30);
        let RData::SOA(soa) = &r.data else { panic!() };
        assert_eq!(soa.mname.to_string(), "ns.dns.cluster.local.");
        assert_eq!(soa.rname.to_string(), "hostmaster.cluster.local.");
        assert_eq!(
            (soa.refresh, soa.retry, soa.expire, soa.minimum),
            (7200, 1800, 86400, 30)
        );
        assert_eq!(soa.serial, s.serial());
        assert!(m.metadata.authoritative);
        let Reply::Local(m) = answer(&z, &s, &query("web.default.svc.cluster.local.", T::A)) else {
            panic!("local")
        };
        assert_eq!(m.answers[0].ttl, 30);
    }

    #[test]
    fn unsynced_store_fails_instead_of_denying() {
        let mut s = Records::new();
        s.apply_service(&svc(
            "default",
            "web",
            &["10.96.0.10"],
            &[("http", "TCP", 80)],
        ));
        let (rcode, ..) = ask(&s, "nope.default.svc.cluster.local.", T::A);
        assert_eq!(rcode, ResponseCode::ServFail);
        let (rcode, got, ..) = ask(&s, "web.default.svc.cluster.local.", T::A);
        assert_eq!((rcode, got.len()), (OK, 1), "what is known answers already");
    }

    #[test]
    fn malformed_and_odd_queries() {
        let s = store();
        // Garbage with a readable ID: FORMERR echoing the ID.
        let err = decode(&[0xab, 0xcd, 0x01, 0x00, 0xff])
            .unwrap_err()
            .response()
            .expect("formerr");
        assert_eq!(err.metadata.id, 0xabcd);
        assert_eq!(err.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(err.metadata.message_type, MessageType::Response);
        // Too short for an ID, or a response: dropped.
        assert_eq!(decode(&[0x01]).unwrap_err(), Rejected::Drop);
        assert_eq!(
            decode(&[0xab, 0xcd, 0x81, 0x00, 0xff]).unwrap_err(),
            Rejected::Drop
        );
        let mut resp = query("a.", T::A);
        resp.metadata.message_type = MessageType::Response;
        assert_eq!(decode(&resp.to_vec().unwrap()).unwrap_err(), Rejected::Drop);
        // Two questions: FORMERR; no question: FORMERR; another opcode: NOTIMP.
        let mut two = query("web.default.svc.cluster.local.", T::A);
        two.add_query(Query::query(Name::from_str("x.").unwrap(), T::A));
        let mut none = query("x.", T::A);
        none.queries.clear();
        let mut notify = query("cluster.local.", T::SOA);
        notify.metadata.op_code = OpCode::Notify;
        for (m, want) in [
            (two, ResponseCode::FormErr),
            (none, ResponseCode::FormErr),
            (notify, ResponseCode::NotImp),
        ] {
            let Reply::Local(r) = answer(&zone(), &s, &m) else {
                panic!("local")
            };
            assert_eq!(r.metadata.response_code, want);
        }
        let (rcode, ..) = ask(&s, "cluster.local.", T::AXFR);
        assert_eq!(rcode, ResponseCode::Refused);
    }

    #[test]
    fn edns_and_truncation() {
        let mut q = query("web.default.svc.cluster.local.", T::A);
        assert_eq!(udp_limit(&q), 512);
        let mut e = Edns::new();
        e.set_max_payload(1232);
        q.edns = Some(e);
        assert_eq!(udp_limit(&q), 1232);
        let Reply::Local(m) = answer(&zone(), &store(), &q) else {
            panic!()
        };
        assert!(m.edns.is_some(), "EDNS answered with EDNS");
        let t = truncated(&m);
        assert!(t.metadata.truncation && t.answers.is_empty());
        assert_eq!(t.queries, m.queries);
    }
}
