//! The nftables backend (the default mode), structured after upstream's
//! `pkg/proxy/nftables/proxier.go`: base chains hooked into the kernel jump to a
//! `services` chain that finds a packet's service by (daddr, protocol, dport) in maps —
//! constant time however many services exist.
//!
//! Where nodus differs from upstream: a ClusterIP of a service without session affinity
//! needs no chain at all. Its endpoints are interval elements of `service-endpoints-<proto>`
//! keyed by (ClusterIP, port, a `numgen random mod 65536` range), one range per endpoint,
//! and one `dnat … map` rule per protocol picks the endpoint with equal shares. Hairpin
//! masquerading looks (saddr, daddr) up in `endpoint-hairpin`. Adding or changing such a
//! service is then element changes only: the kernel re-validates the table's whole jump
//! graph on every commit that adds a rule, and with a chain (or three) per service that
//! graph grows with the cluster; here it stays a few dozen chains. Services with session
//! affinity, and the external paths (NodePort, externalIPs, LoadBalancer) keep upstream's
//! shape: a `service-ips`/`service-nodeports` verdict map jumps to per-service chains, where
//! `numgen random mod N == 0` rules pick an endpoint (with affinity, an endpoint chain that
//! records the client).//!
//! All of it lives in one table, `ip kube-proxy`, exactly upstream's name: nodus's proxy
//! replaces kube-proxy on a node, and sharing the name means a node switched from one to the
//! other never keeps two competing sets of service rules, while every other table on the
//! node (the CNI's, the firewall's) is never touched.
//!
//! Syncs: a full sync declares everything, rewrites every service chain in chunks of
//! [`CHUNK`] service ports per transaction (so a 30k-service rewrite never holds the
//! kernel's nftables mutex for long), then swaps all map contents in one final transaction
//! and deletes chains nobody references any more. A partial sync diffs each changed
//! service's fragment against what was programmed and sends only the difference, in one
//! atomic transaction, without listing the kernel's table.

use crate::backend::{Backend, BackendError, Runner, SyncOutcome, hash_and_truncate};
use crate::model::{Endpoint, NodeContext, Protocol, ServiceEntry, ServicePortName, Snapshot};
use crate::topology::categorize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

/// The table all rules live in.
pub const TABLE: &str = "kube-proxy";
/// Service ports per transaction in a full sync.
pub const CHUNK: usize = 1000;
const MAX_NAME: usize = 200;
const MASQ_MARK: &str = "0x00004000";

/// The table's fixed chains, the only ones no service owns.
const BASE_CHAINS: &[&str] = &[
    "filter-prerouting",
    "filter-input",
    "filter-forward",
    "filter-output",
    "filter-output-post-dnat",
    "nat-prerouting",
    "nat-output",
    "nat-postrouting",
    "firewall-check",
    "reject-chain",
    "cluster-ips-check",
    "mark-for-masquerade",
    "masquerading",
    "nodeport-endpoints-check",
    "service-endpoints-check",
    "services",
];

/// The maps whose elements services own (name, declaration, comment); flushed and refilled
/// by a full sync.
const MAPS: &[(&str, &str, &str)] = &[
    (
        "service-ips",
        "type ipv4_addr . inet_proto . inet_service : verdict",
        "ClusterIP, ExternalIP and LoadBalancer IP traffic",
    ),
    (
        "service-endpoints-tcp",
        "typeof ip daddr . tcp dport . numgen random mod 65536 : ip daddr . tcp dport ; flags interval",
        "TCP ClusterIP traffic of services without session affinity: endpoint by numgen range",
    ),
    (
        "service-endpoints-udp",
        "typeof ip daddr . udp dport . numgen random mod 65536 : ip daddr . udp dport ; flags interval",
        "UDP ClusterIP traffic of services without session affinity: endpoint by numgen range",
    ),
    (
        "service-endpoints-sctp",
        "typeof ip daddr . sctp dport . numgen random mod 65536 : ip daddr . sctp dport ; flags interval",
        "SCTP ClusterIP traffic of services without session affinity: endpoint by numgen range",
    ),
    (
        "service-nodeports",
        "type inet_proto . inet_service : verdict",
        "NodePort traffic",
    ),
    (
        "no-endpoint-services",
        "type ipv4_addr . inet_proto . inet_service : verdict",
        "vmap to drop or reject packets to services with no endpoints",
    ),
    (
        "no-endpoint-nodeports",
        "type inet_proto . inet_service : verdict",
        "vmap to drop or reject packets to service nodeports with no endpoints",
    ),
    (
        "firewall-ips",
        "type ipv4_addr . inet_proto . inet_service : verdict",
        "destinations that are subject to LoadBalancerSourceRanges",
    ),
];
/// Sets (name, type, comment); those in [`SERVICE_SETS`] hold elements services own,
/// counted by reference since services share them.
const SETS: &[(&str, &str, &str)] = &[
    ("cluster-ips", "ipv4_addr", "Active ClusterIPs"),
    (
        "nodeport-ips",
        "ipv4_addr",
        "IPs that accept NodePort traffic",
    ),
    (
        "endpoint-hairpin",
        "ipv4_addr . ipv4_addr",
        "endpoint . endpoint: a pod reaching itself through a service",
    ),
];
const SERVICE_SETS: &[&str] = &["cluster-ips", "endpoint-hairpin"];

/// One service port's share of the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fragment {
    /// Chain name → rules, in order.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Affinity set name → its declaration body.
    pub sets: BTreeMap<String, String>,
    /// (map, key) → verdict.
    pub map_elements: BTreeMap<(&'static str, String), String>,
    /// (set, element) of sets several services share (a ClusterIP with several ports).
    pub set_elements: BTreeSet<(&'static str, String)>,
}

fn base_name(n: &ServicePortName) -> String {
    format!(
        "{}/{}/{}/{}",
        n.namespace,
        n.name,
        n.protocol.as_str(),
        n.port
    )
}

fn chain(prefix: &str, base: &str) -> String {
    format!("{prefix}-{}", hash_and_truncate(base, MAX_NAME))
}

fn endpoint_base(n: &ServicePortName, ep: &Endpoint) -> String {
    format!("{}__{}/{}", base_name(n), ep.ip, ep.port)
}

/// The `numgen` range a ClusterIP's endpoints divide between them in `service-endpoints`.
const SHARES: u32 = 65536;

/// The map of ClusterIP endpoints for `proto` (see [`MAPS`]).
fn endpoints_map(proto: Protocol) -> &'static str {
    match proto {
        Protocol::Tcp => "service-endpoints-tcp",
        Protocol::Udp => "service-endpoints-udp",
        Protocol::Sctp => "service-endpoints-sctp",
    }
}

/// Renders one service port (upstream's per-service part of syncProxyRules).
pub fn render_service(entry: &ServiceEntry, ctx: &NodeContext) -> Fragment {
    let svc = &entry.port;
    let n = &svc.name;
    let proto = n.protocol.as_str();
    let base = base_name(n);
    let cat = categorize(svc, &entry.endpoints, ctx.zone.as_deref());
    let cluster_chain = chain("service", &base);
    let local_chain = chain("local", &base);
    let external_chain = chain("external", &base);
    let firewall_chain = chain("firewall", &base);
    let affinity = svc.affinity_timeout_seconds;
    let mut f = Fragment::default();

    // Hairpin (a pod reaching itself through its own service) is masqueraded by one rule
    // in `masquerading` that looks (saddr, daddr) up in this set, instead of a rule per
    // endpoint chain as upstream writes it: no endpoint then needs a chain of its own.
    for ep in cat.cluster.iter().chain(&cat.local) {
        f.set_elements
            .insert(("endpoint-hairpin", format!("{} . {}", ep.ip, ep.ip)));
    }

    let has_cluster = !cat.cluster.is_empty();
    let has_local = !cat.local.is_empty();
    let internal_eps = if svc.internal_policy_local {
        &cat.local
    } else {
        &cat.cluster
    };
    // Chains exist only while something jumps to them; with no session affinity the
    // ClusterIP path needs none (see `service-endpoints-*` below).
    let mut referenced: BTreeSet<String> = BTreeSet::new();
    let no_endpoints = |usable: bool| -> &'static str {
        if cat.has_any && !usable {
            "drop"
        } else {
            "goto reject-chain"
        }
    };

    let vip_key = format!("{} . {proto} . {}", svc.cluster_ip, svc.port);
    let vip_port = format!("{} . {}", svc.cluster_ip, svc.port);
    f.set_elements
        .insert(("cluster-ips", svc.cluster_ip.to_string()));
    if internal_eps.is_empty() {
        f.map_elements.insert(
            ("no-endpoint-services", vip_key),
            no_endpoints(false).into(),
        );
    } else if affinity.is_some() {
        let c = if svc.internal_policy_local {
            &local_chain
        } else {
            &cluster_chain
        };
        referenced.insert(c.clone());
        f.map_elements
            .insert(("service-ips", vip_key), format!("goto {c}"));
    } else {
        // Equal shares of the numgen range, one interval element per endpoint: the
        // ClusterIP path is then data in one map per protocol, with no rule and no chain per service,
        // so adding or changing a service never grows the jump graph the kernel
        // re-validates on every commit that adds a rule.
        let count = internal_eps.len() as u32;
        for (i, ep) in internal_eps.iter().enumerate() {
            let i = i as u32;
            let lo = i * SHARES / count;
            let hi = (i + 1) * SHARES / count - 1;
            f.map_elements.insert(
                (endpoints_map(n.protocol), format!("{vip_port} . {lo}-{hi}")),
                format!("{} . {}", ep.ip, ep.port),
            );
        }
    }

    let external = if svc.external_policy_local {
        has_local.then(|| local_chain.clone())
    } else {
        has_cluster.then(|| cluster_chain.clone())
    };

    if svc.has_external_destinations() {
        if let Some(target) = &external {
            let mut rules = Vec::new();
            if svc.external_policy_local {
                // Short-circuit: pods and the node itself reach a Local service through
                // the cluster-wide endpoints, as upstream does, since "local" means the
                // client's node and they are already on one.
                let short = if has_cluster { &cluster_chain } else { target };
                if let Some(cidr) = ctx.cluster_cidr {
                    rules.push(format!("ip saddr {cidr} goto {short}"));
                }
                rules.push("fib saddr type local jump mark-for-masquerade".into());
                rules.push(format!("fib saddr type local goto {short}"));
                rules.push(format!("goto {target}"));
                referenced.insert(short.clone());
            } else {
                rules.push("jump mark-for-masquerade".into());
                rules.push(format!("goto {target}"));
            }
            referenced.insert(target.clone());
            f.chains.insert(external_chain.clone(), rules);
        }
        let ext_verdict = match &external {
            Some(_) => ("service-ips", format!("goto {external_chain}")),
            None => ("no-endpoint-services", no_endpoints(false).into()),
        };
        for ip in svc.external_ips.iter().chain(&svc.load_balancer_ips) {
            let key = format!("{ip} . {proto} . {}", svc.port);
            f.map_elements
                .insert((ext_verdict.0, key), ext_verdict.1.clone());
        }
        if let Some(np) = svc.node_port {
            let key = format!("{proto} . {np}");
            match &external {
                Some(_) => f
                    .map_elements
                    .insert(("service-nodeports", key), format!("goto {external_chain}")),
                None => f
                    .map_elements
                    .insert(("no-endpoint-nodeports", key), no_endpoints(false).into()),
            };
        }
        if !svc.load_balancer_source_ranges.is_empty() && !svc.load_balancer_ips.is_empty() {
            let ranges: Vec<String> = svc
                .load_balancer_source_ranges
                .iter()
                .map(|c| c.to_string())
                .collect();
            f.chains.insert(
                firewall_chain.clone(),
                vec![format!("ip saddr != {{ {} }} drop", ranges.join(", "))],
            );
            for ip in &svc.load_balancer_ips {
                f.map_elements.insert(
                    ("firewall-ips", format!("{ip} . {proto} . {}", svc.port)),
                    format!("goto {firewall_chain}"),
                );
            }
        }
    }

    for (name, eps) in [(&cluster_chain, &cat.cluster), (&local_chain, &cat.local)] {
        if referenced.contains(name) {
            let rules = balance(&mut f, n, proto, affinity, eps);
            f.chains.insert(name.clone(), rules);
        }
    }
    f
}

/// The rules of a service's cluster or local chain: an equal-share choice of one of `eps`.
/// Without session affinity each choice DNATs directly; with it, each endpoint gets a
/// chain that records the client in the endpoint's affinity set, and clients found in a
/// set go straight back to that endpoint.
fn balance(
    f: &mut Fragment,
    n: &ServicePortName,
    proto: &str,
    affinity: Option<u32>,
    eps: &[Endpoint],
) -> Vec<String> {
    let mut rules = Vec::new();
    let targets: Vec<String> = match affinity {
        None => eps
            .iter()
            .map(|ep| format!("meta l4proto {proto} dnat to {}:{}", ep.ip, ep.port))
            .collect(),
        Some(t) => {
            let mut targets = Vec::new();
            for ep in eps {
                let eb = endpoint_base(n, ep);
                let name = chain("endpoint", &eb);
                let set = chain("affinity", &eb);
                f.sets.insert(
                    set.clone(),
                    format!("type ipv4_addr ; flags dynamic,timeout ; timeout {t}s ;"),
                );
                f.chains.insert(
                    name.clone(),
                    vec![
                        format!("update @{set} {{ ip saddr }}"),
                        format!("meta l4proto {proto} dnat to {}:{}", ep.ip, ep.port),
                    ],
                );
                rules.push(format!("ip saddr @{set} goto {name}"));
                targets.push(format!("goto {name}"));
            }
            targets
        }
    };
    // Equal shares without an anonymous verdict map: rule i of N takes the flow with
    // probability 1/(N-i). upstream writes `numgen random mod N vmap { … }`, but each such
    // rule creates an anonymous set, and the kernel allocates anonymous set names (and looks
    // sets up) by scanning every set of the table: 10k services cost 18 s of kernel time in
    // one transaction here. Only a new flow's first packet walks them, and only its own
    // service's endpoints.
    let total = targets.len();
    for (i, t) in targets.into_iter().enumerate() {
        let left = total - i;
        if left == 1 {
            rules.push(t);
        } else {
            rules.push(format!("numgen random mod {left} == 0 {t}"));
        }
    }
    rules
}

/// The table's fixed part: declarations of base chains, maps and sets, and the base
/// chains' rules.
pub fn render_base(ctx: &NodeContext) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "add table ip {TABLE} {{ comment \"rules for kube-proxy\" ; }}"
    );
    let hooks: &[(&str, &str, &str, i32)] = &[
        ("filter-prerouting", "filter", "prerouting", -110),
        ("filter-input", "filter", "input", -110),
        ("filter-forward", "filter", "forward", -110),
        ("filter-output", "filter", "output", -110),
        ("filter-output-post-dnat", "filter", "output", -90),
        ("nat-prerouting", "nat", "prerouting", -100),
        ("nat-output", "nat", "output", -100),
        ("nat-postrouting", "nat", "postrouting", 100),
    ];
    for (name, typ, hook, prio) in hooks {
        let _ = writeln!(
            t,
            "add chain ip {TABLE} {name} {{ type {typ} hook {hook} priority {prio} ; }}"
        );
    }
    for (name, typ, comment) in MAPS {
        let _ = writeln!(
            t,
            "add map ip {TABLE} {name} {{ {typ} ; comment \"{comment}\" ; }}"
        );
    }
    for (name, typ, comment) in SETS {
        let _ = writeln!(
            t,
            "add set ip {TABLE} {name} {{ type {typ} ; comment \"{comment}\" ; }}"
        );
    }
    let nodeport_match = if ctx.nodeport_ips.is_empty() {
        "fib daddr type local ip daddr != 127.0.0.0/8"
    } else {
        "ip daddr @nodeport-ips"
    };
    // Traffic to a ClusterIP from outside the cluster CIDR is masqueraded (upstream writes
    // this rule into every service chain; one rule over the ClusterIP set does the same).
    let mut services = Vec::new();
    if ctx.masquerade_all {
        services.push("ip daddr @cluster-ips jump mark-for-masquerade".to_string());
    } else if let Some(cidr) = ctx.cluster_cidr {
        services.push(format!(
            "ip daddr @cluster-ips ip saddr != {cidr} jump mark-for-masquerade"
        ));
    }
    services.push("ip daddr . meta l4proto . th dport vmap @service-ips".into());
    for p in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
        let proto = p.as_str();
        // One map per protocol: nft 1.0.6 cannot add a rule naming a map it read back
        // from the kernel whose key is typed `th dport` (it reports conflicting protocols).
        services.push(format!(
            "meta l4proto {proto} dnat ip to ip daddr . {proto} dport . numgen random mod {SHARES} map @{}",
            endpoints_map(p)
        ));
    }
    services.push(format!(
        "{nodeport_match} meta l4proto . th dport vmap @service-nodeports"
    ));
    let chains: Vec<(&str, Vec<String>)> = vec![
        (
            "filter-prerouting",
            vec!["ct state new jump firewall-check".into()],
        ),
        (
            "filter-input",
            vec![
                "ct state new jump nodeport-endpoints-check".into(),
                "ct state new jump service-endpoints-check".into(),
            ],
        ),
        (
            "filter-forward",
            vec![
                "ct state new jump service-endpoints-check".into(),
                "ct state new jump cluster-ips-check".into(),
            ],
        ),
        (
            "filter-output",
            vec![
                "ct state new jump service-endpoints-check".into(),
                "ct state new jump firewall-check".into(),
            ],
        ),
        (
            "filter-output-post-dnat",
            vec!["ct state new jump cluster-ips-check".into()],
        ),
        ("nat-prerouting", vec!["jump services".into()]),
        ("nat-output", vec!["jump services".into()]),
        ("nat-postrouting", vec!["jump masquerading".into()]),
        (
            "firewall-check",
            vec!["ip daddr . meta l4proto . th dport vmap @firewall-ips".into()],
        ),
        ("reject-chain", vec!["reject".into()]),
        (
            "cluster-ips-check",
            vec![
                "ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""
                    .into(),
            ],
        ),
        (
            "mark-for-masquerade",
            vec![format!("meta mark set meta mark | {MASQ_MARK}")],
        ),
        (
            "masquerading",
            vec![
                "ct status dnat ip saddr . ip daddr @endpoint-hairpin jump mark-for-masquerade"
                    .into(),
                format!("meta mark & {MASQ_MARK} == 0 return"),
                format!("meta mark set meta mark ^ {MASQ_MARK}"),
                "masquerade fully-random".into(),
            ],
        ),
        (
            "nodeport-endpoints-check",
            vec![format!(
                "{nodeport_match} meta l4proto . th dport vmap @no-endpoint-nodeports"
            )],
        ),
        (
            "service-endpoints-check",
            vec!["ip daddr . meta l4proto . th dport vmap @no-endpoint-services".into()],
        ),
        ("services", services),
    ];
    // Declare every chain before any rule refers to it.
    for (name, _) in &chains {
        if !hooks.iter().any(|h| h.0 == *name) {
            let _ = writeln!(t, "add chain ip {TABLE} {name}");
        }
    }
    for (name, rules) in &chains {
        let _ = writeln!(t, "flush chain ip {TABLE} {name}");
        for r in rules {
            let _ = writeln!(t, "add rule ip {TABLE} {name} {r}");
        }
    }
    let _ = writeln!(t, "flush set ip {TABLE} nodeport-ips");
    if !ctx.nodeport_ips.is_empty() {
        let ips: Vec<String> = ctx.nodeport_ips.iter().map(|i| i.to_string()).collect();
        let _ = writeln!(
            t,
            "add element ip {TABLE} nodeport-ips {{ {} }}",
            ips.join(", ")
        );
    }
    t
}

fn write_chain(t: &mut String, name: &str, rules: &[String]) {
    let _ = writeln!(t, "flush chain ip {TABLE} {name}");
    for r in rules {
        let _ = writeln!(t, "add rule ip {TABLE} {name} {r}");
    }
}

fn write_elements<'a>(
    t: &mut String,
    verb: &str,
    container: &str,
    items: impl Iterator<Item = &'a str>,
) {
    let items: Vec<&str> = items.collect();
    for batch in items.chunks(500) {
        let _ = writeln!(
            t,
            "{verb} element ip {TABLE} {container} {{ {} }}",
            batch.join(", ")
        );
    }
}

/// Writes `f`'s declarations and chain contents (the part a chunk of a full sync holds).
fn write_fragment_chains(t: &mut String, f: &Fragment) {
    for name in f.chains.keys() {
        let _ = writeln!(t, "add chain ip {TABLE} {name}");
    }
    for (name, body) in &f.sets {
        let _ = writeln!(t, "add set ip {TABLE} {name} {{ {body} }}");
    }
    for (name, rules) in &f.chains {
        write_chain(t, name, rules);
    }
}

/// The nftables backend's memory of what it programmed.
pub struct Nftables {
    runner: Box<dyn Runner>,
    programmed: HashMap<ServicePortName, Fragment>,
    refs: HashMap<(&'static str, String), usize>,
    base_ctx: Option<NodeContext>,
}

/// Sends transactions to the kernel of the calling process's network namespace: through
/// one long-lived libnftables context when the library loads (no process per transaction),
/// else by running `nft -f -` for each one.
pub struct NftRunner {
    lib: Option<crate::libnft::Context>,
    /// The kernel changed since the context's cache was last filled (see `idle`).
    stale: bool,
    /// Whether the `nft` binary runs here (full syncs prefer it, see `apply_bulk`).
    exec: bool,
}

/// Set to `1` to force the `nft -f -` path (benchmarks, debugging).
pub const FORCE_EXEC_ENV: &str = "NODUS_PROXY_NFT_EXEC";

impl NftRunner {
    /// Opens the libnftables context now, in the caller's network namespace, and logs
    /// which path the proxy will use.
    pub fn new() -> NftRunner {
        let exec = std::process::Command::new("nft")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if std::env::var(FORCE_EXEC_ENV).is_ok_and(|v| v == "1") {
            tracing::info!("nftables: running nft -f for each transaction ({FORCE_EXEC_ENV}=1)");
            return NftRunner {
                lib: None,
                stale: false,
                exec,
            };
        }
        match crate::libnft::Context::new() {
            Ok(c) => {
                tracing::info!("nftables: using libnftables in-process for partial syncs");
                NftRunner {
                    lib: Some(c),
                    stale: true,
                    exec,
                }
            }
            Err(e) => {
                tracing::info!(reason = %e, "nftables: libnftables unavailable; running nft -f for each transaction");
                NftRunner {
                    lib: None,
                    stale: false,
                    exec,
                }
            }
        }
    }
}

impl Default for NftRunner {
    fn default() -> Self {
        NftRunner::new()
    }
}

impl Runner for NftRunner {
    fn apply(&mut self, text: &str) -> Result<(), String> {
        self.stale = true;
        match &mut self.lib {
            Some(c) => c.run(text).map(|_| ()),
            None => crate::backend::run_with_stdin("nft", &["-f", "-"], text).map(|_| ()),
        }
    }
    /// Refills the context's object cache ahead of the next partial sync. libnftables 1.0.6
    /// fetches every chain of the table before a transaction that adds a rule or touches an
    /// element, and throws its cache away whenever the ruleset generation moved — which our
    /// own commit always does. A dry run (the kernel checks the batch and aborts it, so
    /// nothing changes and the generation stays) of commands needing the same cache refills
    /// it now, while minSyncPeriod holds the next sync back; that sync then skips the fetch
    /// unless something else changed the ruleset meanwhile, which the library detects.
    fn idle(&mut self) {
        if !self.stale {
            return;
        }
        let Some(c) = &mut self.lib else {
            return;
        };
        // A counter rule and a plain-set element need the chain and set caches but no
        // jump-graph validation in the kernel, so the dry run stays cheap.
        let warm = format!(
            "add rule ip {TABLE} mark-for-masquerade counter\nadd element ip {TABLE} cluster-ips {{ 127.0.0.1 }}\n"
        );
        match c.check(&warm) {
            Ok(()) => self.stale = false,
            Err(e) => tracing::debug!(error = %e, "nftables: cache warm-up failed"),
        }
    }
    /// A full sync's chunks go through a short-lived `nft` process when there is one: the
    /// parse of a thousand services takes tens of MB that glibc would keep in the proxy's
    /// heap for good, while a process per chunk costs a few ms against seconds of sync.
    fn apply_bulk(&mut self, text: &str) -> Result<(), String> {
        self.stale = true;
        match &mut self.lib {
            Some(c) if !self.exec => c.run(text).map(|_| ()),
            _ => crate::backend::run_with_stdin("nft", &["-f", "-"], text).map(|_| ()),
        }
    }
    /// Through `nft` when it runs here, for the same reason as `apply_bulk`: a listing
    /// builds the whole table in memory.
    fn list(&mut self) -> Option<String> {
        let cmd = format!("list table ip {TABLE}");
        if let Some(c) = &mut self.lib
            && !self.exec
        {
            return c.run(&cmd).ok();
        }
        let out = std::process::Command::new("nft")
            .args(cmd.split(' '))
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Names of chains and sets in `nft list table` output.
fn listed_objects(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut chains = BTreeSet::new();
    let mut sets = BTreeSet::new();
    for line in text.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("chain ") {
            if let Some(name) = rest.split_whitespace().next() {
                chains.insert(name.trim_matches('"').to_string());
            }
        } else if let Some(rest) = l.strip_prefix("set ")
            && let Some(name) = rest.split_whitespace().next()
        {
            sets.insert(name.trim_matches('"').to_string());
        }
    }
    (chains, sets)
}

impl Nftables {
    pub fn new(runner: Box<dyn Runner>) -> Nftables {
        Nftables {
            runner,
            programmed: HashMap::new(),
            refs: HashMap::new(),
            base_ctx: None,
        }
    }

    /// The rendering a partial sync would send for `changed`, without sending it, and the
    /// new fragments; `None` fragment means the service port is gone.
    fn diff(
        &self,
        snap: &Snapshot,
        ctx: &NodeContext,
        changed: &BTreeSet<ServicePortName>,
    ) -> (String, Vec<(ServicePortName, Option<Fragment>)>) {
        let empty = Fragment::default();
        let mut news = Vec::new();
        let mut del_elems: Vec<(&'static str, String)> = Vec::new();
        let mut add_elems: Vec<(&'static str, String, String)> = Vec::new();
        let mut new_chains: BTreeSet<String> = BTreeSet::new();
        let mut writes: Vec<(String, Vec<String>)> = Vec::new();
        let mut gone_chains: BTreeSet<String> = BTreeSet::new();
        let mut new_sets: BTreeMap<String, String> = BTreeMap::new();
        let mut gone_sets: BTreeSet<String> = BTreeSet::new();
        let mut ref_delta: BTreeMap<(&'static str, String), i64> = BTreeMap::new();
        for name in changed {
            let old = self.programmed.get(name).unwrap_or(&empty);
            let newf = snap.get(name).map(|e| render_service(e, ctx));
            let new = newf.as_ref().unwrap_or(&empty);
            if old == new {
                continue;
            }
            for (k, v) in &old.map_elements {
                if new.map_elements.get(k) != Some(v) {
                    del_elems.push((k.0, k.1.clone()));
                }
            }
            for (k, v) in &new.map_elements {
                if old.map_elements.get(k) != Some(v) {
                    add_elems.push((k.0, k.1.clone(), v.clone()));
                }
            }
            // A set whose timeout changed is recreated, so every rule naming it is rewritten.
            let sets_changed = new
                .sets
                .iter()
                .any(|(s, b)| old.sets.get(s).is_some_and(|o| o != b));
            for (c, rules) in &new.chains {
                match old.chains.get(c) {
                    Some(r) if r == rules && !sets_changed => {}
                    Some(_) => writes.push((c.clone(), rules.clone())),
                    None => {
                        new_chains.insert(c.clone());
                        writes.push((c.clone(), rules.clone()));
                    }
                }
            }
            for c in old.chains.keys() {
                if !new.chains.contains_key(c) {
                    gone_chains.insert(c.clone());
                }
            }
            for (s, body) in &new.sets {
                if old.sets.get(s) != Some(body) {
                    if old.sets.contains_key(s) {
                        gone_sets.insert(s.clone());
                    }
                    new_sets.insert(s.clone(), body.clone());
                }
            }
            for s in old.sets.keys() {
                if !new.sets.contains_key(s) {
                    gone_sets.insert(s.clone());
                }
            }
            for e in old.set_elements.difference(&new.set_elements) {
                *ref_delta.entry(e.clone()).or_default() -= 1;
            }
            for e in new.set_elements.difference(&old.set_elements) {
                *ref_delta.entry(e.clone()).or_default() += 1;
            }
            news.push((name.clone(), newf));
        }
        let mut t = String::new();
        // 1. Elements that point at chains about to change or vanish go first.
        for (map, key) in &del_elems {
            let _ = writeln!(t, "delete element ip {TABLE} {map} {{ {key} }}");
        }
        for ((set, elem), d) in &ref_delta {
            let before = self.refs.get(&(*set, elem.clone())).copied().unwrap_or(0) as i64;
            if before > 0 && before + d <= 0 {
                let _ = writeln!(t, "delete element ip {TABLE} {set} {{ {elem} }}");
            }
        }
        // 2. Sets whose timeout changed are recreated; new chains and sets declared.
        for c in &new_chains {
            let _ = writeln!(t, "add chain ip {TABLE} {c}");
        }
        // Chains that stop existing are emptied before anything is deleted, so references
        // between them (service chain → endpoint chain) are gone by the time of deletion.
        for c in &gone_chains {
            let _ = writeln!(t, "flush chain ip {TABLE} {c}");
        }
        for (c, _) in &writes {
            if !new_chains.contains(c) {
                let _ = writeln!(t, "flush chain ip {TABLE} {c}");
            }
        }
        for s in &gone_sets {
            let _ = writeln!(t, "delete set ip {TABLE} {s}");
        }
        for (s, body) in &new_sets {
            let _ = writeln!(t, "add set ip {TABLE} {s} {{ {body} }}");
        }
        for (c, rules) in &writes {
            for r in rules {
                let _ = writeln!(t, "add rule ip {TABLE} {c} {r}");
            }
        }
        for c in &gone_chains {
            let _ = writeln!(t, "delete chain ip {TABLE} {c}");
        }
        for (map, key, verdict) in &add_elems {
            let _ = writeln!(t, "add element ip {TABLE} {map} {{ {key} : {verdict} }}");
        }
        for ((set, elem), d) in &ref_delta {
            let before = self.refs.get(&(*set, elem.clone())).copied().unwrap_or(0) as i64;
            if before <= 0 && before + d > 0 {
                let _ = writeln!(t, "add element ip {TABLE} {set} {{ {elem} }}");
            }
        }
        (t, news)
    }

    fn commit(&mut self, news: Vec<(ServicePortName, Option<Fragment>)>) {
        for (name, f) in news {
            if let Some(old) = self.programmed.remove(&name) {
                for e in old.set_elements {
                    if let Some(n) = self.refs.get_mut(&e) {
                        *n = n.saturating_sub(1);
                        if *n == 0 {
                            self.refs.remove(&e);
                        }
                    }
                }
            }
            if let Some(f) = f {
                for e in &f.set_elements {
                    *self.refs.entry(e.clone()).or_default() += 1;
                }
                self.programmed.insert(name, f);
            }
        }
    }

    fn render_maps<'a>(frags: impl Iterator<Item = &'a Fragment> + Clone) -> String {
        let mut t = String::new();
        for (map, _, _) in MAPS {
            let _ = writeln!(t, "flush map ip {TABLE} {map}");
            let items: Vec<String> = frags
                .clone()
                .flat_map(|f| f.map_elements.iter())
                .filter(|((m, _), _)| m == map)
                .map(|((_, k), v)| format!("{k} : {v}"))
                .collect();
            write_elements(&mut t, "add", map, items.iter().map(|s| s.as_str()));
        }
        for set in SERVICE_SETS {
            let _ = writeln!(t, "flush set ip {TABLE} {set}");
            let elems: BTreeSet<&str> = frags
                .clone()
                .flat_map(|f| f.set_elements.iter())
                .filter(|(s, _)| s == set)
                .map(|(_, e)| e.as_str())
                .collect();
            write_elements(&mut t, "add", set, elems.into_iter());
        }
        t
    }

    fn apply_counted(&mut self, text: &str, out: &mut SyncOutcome) -> Result<(), String> {
        if text.is_empty() {
            return Ok(());
        }
        out.transactions += 1;
        out.bytes += text.len();
        self.runner.apply(text)
    }

    fn apply_bulk_counted(&mut self, text: &str, out: &mut SyncOutcome) -> Result<(), String> {
        if text.is_empty() {
            return Ok(());
        }
        out.transactions += 1;
        out.bytes += text.len();
        self.runner.apply_bulk(text)
    }
}

impl Backend for Nftables {
    fn full_sync(
        &mut self,
        snap: &Snapshot,
        ctx: &NodeContext,
    ) -> Result<SyncOutcome, BackendError> {
        let mut out = SyncOutcome::default();
        let existing = self.runner.list();
        let base = render_base(ctx);
        let frags: Vec<(ServicePortName, Fragment)> = snap
            .iter()
            .map(|(n, e)| (n.clone(), render_service(e, ctx)))
            .collect();
        self.apply_bulk_counted(&base, &mut out)
            .map_err(|err| BackendError::Tool {
                tool: "nft".into(),
                err,
            })?;
        self.base_ctx = Some(ctx.clone());
        let mut bad: BTreeSet<ServicePortName> = BTreeSet::new();
        // Each chunk's text is rendered just before it is sent, so the whole table's text
        // never sits in memory at once.
        for (i, chunk) in frags.chunks(CHUNK).enumerate() {
            let mut text = String::new();
            for (_, f) in chunk {
                write_fragment_chains(&mut text, f);
            }
            if self.apply_bulk_counted(&text, &mut out).is_ok() {
                continue;
            }
            // One service the kernel refuses must not cost the others: retry one by one.
            for (name, f) in frags.iter().skip(i * CHUNK).take(CHUNK) {
                let mut t = String::new();
                write_fragment_chains(&mut t, f);
                if let Err(e) = self.apply_counted(&t, &mut out) {
                    tracing::error!(service = %name, error = %e, "the kernel refused this service's rules; service skipped");
                    out.failed.push((name.clone(), e));
                    bad.insert(name.clone());
                }
            }
        }
        let good: Vec<(ServicePortName, Fragment)> = frags
            .into_iter()
            .filter(|(n, _)| !bad.contains(n))
            .collect();
        let mut fin = Self::render_maps(good.iter().map(|(_, f)| f));
        let keep_chains: BTreeSet<&String> =
            good.iter().flat_map(|(_, f)| f.chains.keys()).collect();
        let keep_sets: BTreeSet<&String> = good.iter().flat_map(|(_, f)| f.sets.keys()).collect();
        // Only what the kernel listed is deleted, never what we remember programming: if the
        // table vanished under us (someone deleted it, the refusal that brought us here),
        // deleting a remembered chain would fail this transaction and every full sync after
        // it. No listing means no table before this sync, so nothing is stale.
        let (known_chains, known_sets) = match &existing {
            Some(text) => listed_objects(text),
            None => Default::default(),
        };
        // Every chain but the fixed ones belongs to some service; unwanted ones go.
        let stale: Vec<&String> = known_chains
            .iter()
            .filter(|c| !BASE_CHAINS.contains(&c.as_str()) && !keep_chains.contains(c))
            .collect();
        for c in &stale {
            let _ = writeln!(fin, "flush chain ip {TABLE} {c}");
        }
        for c in &stale {
            let _ = writeln!(fin, "delete chain ip {TABLE} {c}");
        }
        for s in known_sets
            .iter()
            .filter(|s| s.starts_with("affinity-") && !keep_sets.contains(s))
        {
            let _ = writeln!(fin, "delete set ip {TABLE} {s}");
        }
        self.apply_bulk_counted(&fin, &mut out)
            .map_err(|err| BackendError::Tool {
                tool: "nft".into(),
                err,
            })?;
        self.programmed.clear();
        self.refs.clear();
        self.commit(good.into_iter().map(|(n, f)| (n, Some(f))).collect());
        Ok(out)
    }

    fn partial_sync(
        &mut self,
        snap: &Snapshot,
        ctx: &NodeContext,
        changed: &BTreeSet<ServicePortName>,
    ) -> Result<SyncOutcome, BackendError> {
        if self.base_ctx.as_ref() != Some(ctx) || changed.len() > CHUNK {
            return self.full_sync(snap, ctx);
        }
        let mut out = SyncOutcome::default();
        let (text, news) = self.diff(snap, ctx, changed);
        match self.apply_counted(&text, &mut out) {
            Ok(()) => {
                self.commit(news);
                Ok(out)
            }
            Err(e) if changed.len() == 1 => {
                let name = changed.iter().next().cloned();
                if let Some(name) = name {
                    tracing::error!(service = %name, error = %e, "the kernel refused this service's rules; service skipped");
                    out.failed.push((name, e));
                }
                Ok(out)
            }
            Err(_) => {
                for name in changed {
                    let one = BTreeSet::from([name.clone()]);
                    let (text, news) = self.diff(snap, ctx, &one);
                    match self.apply_counted(&text, &mut out) {
                        Ok(()) => self.commit(news),
                        Err(e) => {
                            tracing::error!(service = %name, error = %e, "the kernel refused this service's rules; service skipped");
                            out.failed.push((name.clone(), e));
                        }
                    }
                }
                Ok(out)
            }
        }
    }

    fn show_rules(&self, snap: &Snapshot, ctx: &NodeContext) -> String {
        let mut t = String::new();
        for (name, entry) in snap {
            let f = render_service(entry, ctx);
            let _ = writeln!(
                t,
                "# {name} ({} {}:{})",
                name.protocol.as_str(),
                entry.port.cluster_ip,
                entry.port.port
            );
            for ((map, key), v) in &f.map_elements {
                let _ = writeln!(t, "  map {map}: {key} : {v}");
            }
            for (c, rules) in &f.chains {
                let _ = writeln!(t, "  chain {c}");
                for r in rules {
                    let _ = writeln!(t, "    {r}");
                }
            }
            t.push('\n');
        }
        t
    }

    fn idle(&mut self) {
        self.runner.idle();
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        let text = format!("add table ip {TABLE}\ndelete table ip {TABLE}\n");
        self.runner.apply(&text).map_err(|err| BackendError::Tool {
            tool: "nft".into(),
            err,
        })?;
        self.programmed.clear();
        self.refs.clear();
        self.base_ctx = None;
        Ok(())
    }
}
