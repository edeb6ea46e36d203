//! The iptables backend (`--proxy-mode iptables`), with upstream's chain structure
//! (pkg/proxy/iptables/proxier.go): nat `KUBE-SERVICES` matches each VIP + port and jumps
//! to `KUBE-SVC-<hash>`, which picks a `KUBE-SEP-<hash>` with the statistic module; the
//! endpoint chain DNATs. `KUBE-NODEPORTS`, `KUBE-EXT-*` (external traffic), `KUBE-SVL-*`
//! (local endpoints), `KUBE-FW-*` (loadBalancerSourceRanges), `KUBE-MARK-MASQ` and
//! `KUBE-POSTROUTING` as upstream; the filter table's `KUBE-SERVICES`,
//! `KUBE-EXTERNAL-SERVICES` and `KUBE-PROXY-FIREWALL` reject or drop.
//!
//! A partial sync is one `iptables-restore --noflush` that rewrites the shared chains
//! (`KUBE-SERVICES`, `KUBE-NODEPORTS` and the filter chains, which list every service — the
//! linear part of iptables mode) and only the changed services' own chains.

use crate::backend::{Backend, BackendError, Runner, SyncOutcome};
use crate::model::{Endpoint, NodeContext, ServiceEntry, ServicePortName, Snapshot};
use crate::topology::categorize;
use sha2::Digest as _;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

const MASQ: &str = "0x4000";

/// One service port's share of the tables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fragment {
    /// Its own nat chains → rules (without `-A CHAIN`).
    pub nat_chains: BTreeMap<String, Vec<String>>,
    /// Its rules in nat KUBE-SERVICES.
    pub nat_services: Vec<String>,
    /// Its rules in KUBE-NODEPORTS.
    pub nat_nodeports: Vec<String>,
    /// (filter chain, rule).
    pub filter: Vec<(&'static str, String)>,
}

fn hash16(s: &str) -> String {
    let h = sha2::Sha256::digest(s.as_bytes());
    data_encoding::BASE32.encode(&h)[..16].to_string()
}

fn svc_str(n: &ServicePortName) -> String {
    format!("{}/{}:{}", n.namespace, n.name, n.port)
}

fn chain(prefix: &str, n: &ServicePortName) -> String {
    format!(
        "{prefix}-{}",
        hash16(&format!("{}{}", svc_str(n), n.protocol.as_str()))
    )
}

fn sep_chain(n: &ServicePortName, ep: &Endpoint) -> String {
    format!(
        "KUBE-SEP-{}",
        hash16(&format!(
            "{}{}{}",
            svc_str(n),
            n.protocol.as_str(),
            ep.addr()
        ))
    )
}

/// Renders one service port.
pub fn render_service(entry: &ServiceEntry, ctx: &NodeContext) -> Fragment {
    let svc = &entry.port;
    let n = &svc.name;
    let p = n.protocol.as_str();
    let name = svc_str(n);
    let cat = categorize(svc, &entry.endpoints, ctx.zone.as_deref());
    let svc_chain = chain("KUBE-SVC", n);
    let svl_chain = chain("KUBE-SVL", n);
    let ext_chain = chain("KUBE-EXT", n);
    let fw_chain = chain("KUBE-FW", n);
    let mut f = Fragment::default();

    let endpoints = |f: &mut Fragment, eps: &[Endpoint]| -> Vec<String> {
        eps.iter()
            .map(|ep| {
                let c = sep_chain(n, ep);
                let comment = format!("-m comment --comment \"{name}\"");
                let mut rules = vec![format!("{comment} -s {}/32 -j KUBE-MARK-MASQ", ep.ip)];
                let recent = if svc.affinity_timeout_seconds.is_some() {
                    format!(" -m recent --name {c} --mask 255.255.255.255 --rsource --set")
                } else {
                    String::new()
                };
                rules.push(format!(
                    "{comment} -p {p}{recent} -m {p} -j DNAT --to-destination {}",
                    ep.addr()
                ));
                f.nat_chains.insert(c.clone(), rules);
                c
            })
            .collect()
    };
    let balance = |names: &[String]| -> Vec<String> {
        let mut rules = Vec::new();
        if let Some(t) = svc.affinity_timeout_seconds {
            for c in names {
                rules.push(format!(
                    "-m comment --comment \"{name}\" -m recent --name {c} --mask 255.255.255.255 --rsource --rcheck --seconds {t} --reap -j {c}"
                ));
            }
        }
        let total = names.len();
        for (i, c) in names.iter().enumerate() {
            if i + 1 == total {
                rules.push(format!("-m comment --comment \"{name}\" -j {c}"));
            } else {
                let prob = 1.0 / (total - i) as f64;
                rules.push(format!(
                    "-m comment --comment \"{name}\" -m statistic --mode random --probability {prob:.10} -j {c}"
                ));
            }
        }
        rules
    };
    let has_cluster = !cat.cluster.is_empty();
    let has_local = !cat.local.is_empty();
    if has_cluster {
        let names = endpoints(&mut f, &cat.cluster);
        let mut rules = Vec::new();
        let dst = format!(
            "-d {}/32 -p {p} -m {p} --dport {}",
            svc.cluster_ip, svc.port
        );
        if ctx.masquerade_all {
            rules.push(format!(
                "-m comment --comment \"{name} cluster IP\" {dst} -j KUBE-MARK-MASQ"
            ));
        } else if let Some(cidr) = ctx.cluster_cidr {
            rules.push(format!(
                "-m comment --comment \"{name} cluster IP\" ! -s {cidr} {dst} -j KUBE-MARK-MASQ"
            ));
        }
        rules.extend(balance(&names));
        f.nat_chains.insert(svc_chain.clone(), rules);
    }
    if has_local {
        let names = endpoints(&mut f, &cat.local);
        f.nat_chains.insert(svl_chain.clone(), balance(&names));
    }
    let internal = if svc.internal_policy_local {
        has_local.then(|| svl_chain.clone())
    } else {
        has_cluster.then(|| svc_chain.clone())
    };
    let external = if svc.external_policy_local {
        has_local.then(|| svl_chain.clone())
    } else {
        has_cluster.then(|| svc_chain.clone())
    };
    let no_ep = |usable: bool| {
        if cat.has_any && !usable {
            "DROP"
        } else {
            "REJECT"
        }
    };
    let vip = format!(
        "-d {}/32 -p {p} -m {p} --dport {}",
        svc.cluster_ip, svc.port
    );
    match &internal {
        Some(c) => f.nat_services.push(format!(
            "-m comment --comment \"{name} cluster IP\" {vip} -j {c}"
        )),
        None => f.filter.push((
            "KUBE-SERVICES",
            format!(
                "-m comment --comment \"{name} has no endpoints\" {vip} -j {}",
                no_ep(false)
            ),
        )),
    }
    if svc.has_external_destinations() {
        if let Some(target) = &external {
            let mut rules = Vec::new();
            if svc.external_policy_local {
                let short = if has_cluster { &svc_chain } else { target };
                if let Some(cidr) = ctx.cluster_cidr {
                    rules.push(format!("-s {cidr} -j {short}"));
                }
                rules.push("-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ".into());
                rules.push(format!("-m addrtype --src-type LOCAL -j {short}"));
                rules.push(format!("-j {target}"));
            } else {
                rules.push("-j KUBE-MARK-MASQ".into());
                rules.push(format!("-j {target}"));
            }
            f.nat_chains.insert(ext_chain.clone(), rules);
        }
        for ip in &svc.external_ips {
            let d = format!("-d {ip}/32 -p {p} -m {p} --dport {}", svc.port);
            match &external {
                Some(_) => f.nat_services.push(format!(
                    "-m comment --comment \"{name} external IP\" {d} -j {ext_chain}"
                )),
                None => f.filter.push((
                    "KUBE-EXTERNAL-SERVICES",
                    format!(
                        "-m comment --comment \"{name} has no local endpoints\" {d} -j {}",
                        no_ep(false)
                    ),
                )),
            }
        }
        let fw = !svc.load_balancer_source_ranges.is_empty();
        for ip in &svc.load_balancer_ips {
            let d = format!("-d {ip}/32 -p {p} -m {p} --dport {}", svc.port);
            match &external {
                Some(_) => f.nat_services.push(format!(
                    "-m comment --comment \"{name} loadbalancer IP\" {d} -j {}",
                    if fw { &fw_chain } else { &ext_chain }
                )),
                None => f.filter.push((
                    "KUBE-EXTERNAL-SERVICES",
                    format!(
                        "-m comment --comment \"{name} has no local endpoints\" {d} -j {}",
                        no_ep(false)
                    ),
                )),
            }
            if fw {
                f.filter.push((
                    "KUBE-PROXY-FIREWALL",
                    format!("-m comment --comment \"{name} traffic not accepted by {fw_chain}\" {d} -j DROP"),
                ));
            }
        }
        if fw && external.is_some() && !svc.load_balancer_ips.is_empty() {
            let rules = svc
                .load_balancer_source_ranges
                .iter()
                .map(|r| {
                    format!("-m comment --comment \"{name} loadbalancer IP\" -s {r} -j {ext_chain}")
                })
                .collect();
            f.nat_chains.insert(fw_chain.clone(), rules);
        }
        if let Some(np) = svc.node_port {
            let d = format!("-p {p} -m {p} --dport {np}");
            match &external {
                Some(_) => f
                    .nat_nodeports
                    .push(format!("-m comment --comment \"{name}\" {d} -j {ext_chain}")),
                None => f.filter.push((
                    "KUBE-EXTERNAL-SERVICES",
                    format!(
                        "-m comment --comment \"{name} has no endpoints\" -m addrtype --dst-type LOCAL {d} -j {}",
                        no_ep(false)
                    ),
                )),
            }
        }
    }
    f
}

const NAT_BASE: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
];
const FILTER_BASE: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-PROXY-FIREWALL",
];
/// (table, chain, jump rule) the kernel's built-in chains get, once.
const JUMPS: &[(&str, &str, &str)] = &[
    (
        "nat",
        "PREROUTING",
        "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
    ),
    (
        "nat",
        "OUTPUT",
        "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
    ),
    (
        "nat",
        "POSTROUTING",
        "-m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
    ),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
    ),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
    ),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
    ),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
    ),
];

/// `iptables-restore --noflush` and `iptables` in the calling process's network namespace.
pub struct RestoreRunner;

impl Runner for RestoreRunner {
    fn apply(&mut self, text: &str) -> Result<(), String> {
        crate::backend::run_with_stdin("iptables-restore", &["--noflush", "-w", "5"], text)
            .map(|_| ())
    }
    fn list(&mut self) -> Option<String> {
        let mut all = String::new();
        for t in ["nat", "filter"] {
            let out = std::process::Command::new("iptables-save")
                .args(["-t", t])
                .output()
                .ok()?;
            all.push_str(&String::from_utf8_lossy(&out.stdout));
        }
        Some(all)
    }
}

/// The iptables backend's memory of what it programmed.
pub struct Iptables {
    runner: Box<dyn Runner>,
    programmed: HashMap<ServicePortName, Fragment>,
    ctx: Option<NodeContext>,
    jumps_done: bool,
}

fn own_chain(c: &str) -> bool {
    [
        "KUBE-SVC-",
        "KUBE-SVL-",
        "KUBE-EXT-",
        "KUBE-FW-",
        "KUBE-SEP-",
    ]
    .iter()
    .any(|p| c.starts_with(p))
}

impl Iptables {
    pub fn new(runner: Box<dyn Runner>) -> Iptables {
        Iptables {
            runner,
            programmed: HashMap::new(),
            ctx: None,
            jumps_done: false,
        }
    }

    fn nodeports_rule(ctx: &NodeContext) -> Vec<String> {
        if ctx.nodeport_ips.is_empty() {
            vec!["-m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS".into()]
        } else {
            ctx.nodeport_ips
                .iter()
                .map(|ip| format!("-m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -d {ip}/32 -j KUBE-NODEPORTS"))
                .collect()
        }
    }

    /// The restore payload: shared chains in full, `write` chains rewritten, `delete`
    /// chains flushed and removed.
    pub fn render(
        frags: &BTreeMap<&ServicePortName, &Fragment>,
        ctx: &NodeContext,
        write: &BTreeMap<String, Vec<String>>,
        delete: &BTreeSet<String>,
    ) -> String {
        let mut t = String::new();
        t.push_str("*filter\n");
        for c in FILTER_BASE {
            let _ = writeln!(t, ":{c} - [0:0]");
        }
        for c in FILTER_BASE {
            for f in frags.values() {
                for (fc, r) in &f.filter {
                    if fc == c {
                        let _ = writeln!(t, "-A {c} {r}");
                    }
                }
            }
        }
        t.push_str("COMMIT\n*nat\n");
        for c in NAT_BASE {
            let _ = writeln!(t, ":{c} - [0:0]");
        }
        for c in write.keys().chain(delete.iter()) {
            let _ = writeln!(t, ":{c} - [0:0]");
        }
        let _ = writeln!(t, "-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ}");
        let _ = writeln!(
            t,
            "-A KUBE-POSTROUTING -m mark ! --mark {MASQ}/{MASQ} -j RETURN"
        );
        let _ = writeln!(t, "-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ}");
        let _ = writeln!(
            t,
            "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
        );
        for f in frags.values() {
            for r in &f.nat_services {
                let _ = writeln!(t, "-A KUBE-SERVICES {r}");
            }
        }
        for r in Self::nodeports_rule(ctx) {
            let _ = writeln!(t, "-A KUBE-SERVICES {r}");
        }
        for f in frags.values() {
            for r in &f.nat_nodeports {
                let _ = writeln!(t, "-A KUBE-NODEPORTS {r}");
            }
        }
        for (c, rules) in write {
            for r in rules {
                let _ = writeln!(t, "-A {c} {r}");
            }
        }
        for c in delete {
            let _ = writeln!(t, "-X {c}");
        }
        t.push_str("COMMIT\n");
        t
    }

    fn ensure_jumps(&mut self) -> Result<(), String> {
        if self.jumps_done {
            return Ok(());
        }
        for (table, chain, rule) in JUMPS {
            let args = shell_words(rule);
            let mut check = vec!["-w", "5", "-t", table, "-C", chain];
            check.extend(args.iter().map(|s| s.as_str()));
            let ok = std::process::Command::new("iptables")
                .args(&check)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if !ok {
                let mut ins = vec!["-w", "5", "-t", table, "-I", chain];
                ins.extend(args.iter().map(|s| s.as_str()));
                let out = std::process::Command::new("iptables")
                    .args(&ins)
                    .output()
                    .map_err(|e| format!("cannot run iptables: {e}"))?;
                if !out.status.success() {
                    return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
                }
            }
        }
        self.jumps_done = true;
        Ok(())
    }
}

/// Splits a rule into arguments, keeping "quoted comments" whole.
fn shell_words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn err(e: String) -> BackendError {
    BackendError::Tool {
        tool: "iptables-restore".into(),
        err: e,
    }
}

impl Backend for Iptables {
    fn full_sync(
        &mut self,
        snap: &Snapshot,
        ctx: &NodeContext,
    ) -> Result<SyncOutcome, BackendError> {
        let mut out = SyncOutcome::default();
        let listed = self.runner.list().unwrap_or_default();
        let frags: BTreeMap<ServicePortName, Fragment> = snap
            .iter()
            .map(|(n, e)| (n.clone(), render_service(e, ctx)))
            .collect();
        let write: BTreeMap<String, Vec<String>> = frags
            .values()
            .flat_map(|f| f.nat_chains.iter().map(|(c, r)| (c.clone(), r.clone())))
            .collect();
        let mut stale: BTreeSet<String> = self
            .programmed
            .values()
            .flat_map(|f| f.nat_chains.keys().cloned())
            .collect();
        stale.extend(listed.lines().filter_map(|l| {
            let c = l.strip_prefix(':')?.split_whitespace().next()?;
            own_chain(c).then(|| c.to_string())
        }));
        stale.retain(|c| !write.contains_key(c));
        let refs: BTreeMap<&ServicePortName, &Fragment> = frags.iter().collect();
        let text = Self::render(&refs, ctx, &write, &stale);
        out.transactions += 1;
        out.bytes += text.len();
        if let Err(e) = self.runner.apply(&text) {
            // Find the services the kernel refuses by programming them one at a time.
            let mut good: BTreeMap<ServicePortName, Fragment> = BTreeMap::new();
            for (n, f) in frags {
                let mut trial: BTreeMap<&ServicePortName, &Fragment> = good.iter().collect();
                trial.insert(&n, &f);
                let t = Self::render(&trial, ctx, &f.nat_chains, &BTreeSet::new());
                out.transactions += 1;
                match self.runner.apply(&t) {
                    Ok(()) => {
                        good.insert(n, f);
                    }
                    Err(e2) => {
                        tracing::error!(service = %n, error = %e2, "the kernel refused this service's rules; service skipped");
                        out.failed.push((n, e2));
                    }
                }
            }
            if good.is_empty() && !out.failed.is_empty() && snap.len() == out.failed.len() {
                return Err(err(e));
            }
            self.programmed = good.into_iter().collect();
        } else {
            self.programmed = frags.into_iter().collect();
        }
        self.ctx = Some(ctx.clone());
        self.ensure_jumps().map_err(err)?;
        Ok(out)
    }

    fn partial_sync(
        &mut self,
        snap: &Snapshot,
        ctx: &NodeContext,
        changed: &BTreeSet<ServicePortName>,
    ) -> Result<SyncOutcome, BackendError> {
        if self.ctx.as_ref() != Some(ctx) {
            return self.full_sync(snap, ctx);
        }
        let mut out = SyncOutcome::default();
        let mut write = BTreeMap::new();
        let mut delete = BTreeSet::new();
        let mut news: Vec<(ServicePortName, Option<Fragment>)> = Vec::new();
        for n in changed {
            let old = self.programmed.get(n).cloned().unwrap_or_default();
            let new = snap.get(n).map(|e| render_service(e, ctx));
            let nf = new.clone().unwrap_or_default();
            if old == nf {
                continue;
            }
            for (c, r) in &nf.nat_chains {
                if old.nat_chains.get(c) != Some(r) {
                    write.insert(c.clone(), r.clone());
                }
            }
            for c in old.nat_chains.keys() {
                if !nf.nat_chains.contains_key(c) {
                    delete.insert(c.clone());
                }
            }
            news.push((n.clone(), new));
        }
        if news.is_empty() {
            return Ok(out);
        }
        let mut next = self.programmed.clone();
        for (n, f) in &news {
            match f {
                Some(f) => next.insert(n.clone(), f.clone()),
                None => next.remove(n),
            };
        }
        let refs: BTreeMap<&ServicePortName, &Fragment> = next.iter().collect();
        let text = Self::render(&refs, ctx, &write, &delete);
        out.transactions += 1;
        out.bytes += text.len();
        match self.runner.apply(&text) {
            Ok(()) => {
                self.programmed = next;
                Ok(out)
            }
            Err(e) => {
                for (n, _) in &news {
                    tracing::error!(service = %n, error = %e, "iptables-restore refused the change; retrying with a full sync");
                }
                let mut full = self.full_sync(snap, ctx)?;
                full.transactions += out.transactions;
                Ok(full)
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
            for r in &f.nat_services {
                let _ = writeln!(t, "  -t nat -A KUBE-SERVICES {r}");
            }
            for r in &f.nat_nodeports {
                let _ = writeln!(t, "  -t nat -A KUBE-NODEPORTS {r}");
            }
            for (c, r) in &f.filter {
                let _ = writeln!(t, "  -t filter -A {c} {r}");
            }
            for (c, rules) in &f.nat_chains {
                for r in rules {
                    let _ = writeln!(t, "  -t nat -A {c} {r}");
                }
            }
            t.push('\n');
        }
        t
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        for (table, chain, rule) in JUMPS {
            let args = shell_words(rule);
            let mut del = vec!["-w", "5", "-t", table, "-D", chain];
            del.extend(args.iter().map(|s| s.as_str()));
            let _ = std::process::Command::new("iptables").args(&del).output();
        }
        let listed = self.runner.list().unwrap_or_default();
        let mut t = String::new();
        let mut table = "";
        let mut chains: Vec<(String, String)> = Vec::new();
        for l in listed.lines() {
            if let Some(tb) = l.strip_prefix('*') {
                table = if tb == "nat" { "nat" } else { "filter" };
            } else if let Some(c) = l
                .strip_prefix(':')
                .and_then(|c| c.split_whitespace().next())
                && (own_chain(c)
                    || (table == "nat" && NAT_BASE.contains(&c))
                    || (table == "filter" && FILTER_BASE.contains(&c)))
            {
                // Only this proxy's chains: the kubelet's KUBE-FIREWALL and canaries stay.
                chains.push((table.to_string(), c.to_string()));
            }
        }
        for tb in ["filter", "nat"] {
            let mine: Vec<&String> = chains
                .iter()
                .filter(|(t, _)| t == tb)
                .map(|(_, c)| c)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let _ = writeln!(t, "*{tb}");
            for c in &mine {
                let _ = writeln!(t, ":{c} - [0:0]");
            }
            for c in &mine {
                let _ = writeln!(t, "-X {c}");
            }
            t.push_str("COMMIT\n");
        }
        if !t.is_empty() {
            self.runner.apply(&t).map_err(err)?;
        }
        self.programmed.clear();
        self.ctx = None;
        self.jumps_done = false;
        Ok(())
    }
}
