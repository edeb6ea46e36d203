//! The kernel side: reads this agent's routes, neighbours and FDB entries with iproute2's
//! JSON output and reconciles them to a [`Plan`]. Every command goes through a [`Runner`]
//! (as kube-proxy's nft backend does), so tests can see the exact commands.
//!
//! Ownership: a route is this agent's when its protocol is [`RTPROT_NODUS`]; neighbours and
//! FDB entries only ever live on the agent's own VXLAN device. Anything else is read (to
//! avoid clobbering a route for the same prefix) but never changed.

use crate::plan::{Mac, Plan, Route, VXLAN_DEVICE};
use ipnet::Ipv4Net;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// The routing protocol number marking this agent's routes (`ip route … proto 151`): an
/// unassigned value in iproute2's rt_protos, so no routing daemon shares it.
pub const RTPROT_NODUS: u8 = 151;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("running {cmd}: {err}")]
    Spawn { cmd: String, err: String },
    #[error("{cmd}: {stderr}")]
    Failed { cmd: String, stderr: String },
    #[error("{cmd}: unexpected output: {err}")]
    Parse { cmd: String, err: String },
}

/// Runs one command (`ip`, `bridge`, `nft`) in this network namespace.
pub trait Runner: Send + Sync {
    /// Runs `program args…` with `stdin`; returns its standard output.
    fn run(
        &mut self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, KernelError>;
}

/// The real thing: fork and exec.
pub struct ExecRunner;

impl Runner for ExecRunner {
    fn run(
        &mut self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, KernelError> {
        use std::io::Write as _;
        use std::process::{Command, Stdio};
        let cmd = format!("{program} {}", args.join(" "));
        let mut child = Command::new(program)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| KernelError::Spawn {
                cmd: cmd.clone(),
                err: e.to_string(),
            })?;
        if let (Some(text), Some(mut si)) = (stdin, child.stdin.take()) {
            si.write_all(text.as_bytes())
                .map_err(|e| KernelError::Spawn {
                    cmd: cmd.clone(),
                    err: e.to_string(),
                })?;
        }
        let out = child.wait_with_output().map_err(|e| KernelError::Spawn {
            cmd: cmd.clone(),
            err: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(KernelError::Failed {
                cmd,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// A route as the kernel lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRoute {
    pub dst: Ipv4Net,
    pub gateway: Option<Ipv4Addr>,
    pub dev: String,
    pub protocol: String,
}

/// What one reconcile did.
#[derive(Debug, Default)]
pub struct Report {
    /// Commands that changed something (`ip route replace …`).
    pub changes: Vec<String>,
    /// Failures, each naming the command; the rest of the plan was still applied.
    pub errors: Vec<String>,
}

/// The kernel of this network namespace, through a runner.
pub struct Kernel {
    runner: Box<dyn Runner>,
}

fn json(cmd: &str, out: &str) -> Result<Vec<Value>, KernelError> {
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str::<Vec<Value>>(out).map_err(|e| KernelError::Parse {
        cmd: cmd.to_string(),
        err: e.to_string(),
    })
}

fn parse_dst(s: &str) -> Option<Ipv4Net> {
    if s.contains('/') {
        s.parse().ok()
    } else {
        s.parse::<Ipv4Addr>().ok().map(Ipv4Net::from)
    }
}

impl Kernel {
    pub fn new(runner: Box<dyn Runner>) -> Kernel {
        Kernel { runner }
    }

    /// Runs a command through the runner.
    pub fn run(
        &mut self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, KernelError> {
        self.runner.run(program, args, stdin)
    }

    /// Every IPv4 route of the main table.
    pub fn routes(&mut self) -> Result<Vec<KernelRoute>, KernelError> {
        let args = ["-4", "-json", "route", "show", "table", "main"];
        let out = self.run("ip", &args, None)?;
        Ok(json("ip route show", &out)?
            .iter()
            .filter_map(|r| {
                Some(KernelRoute {
                    dst: parse_dst(r["dst"].as_str()?)?,
                    gateway: r["gateway"].as_str().and_then(|g| g.parse().ok()),
                    dev: r["dev"].as_str().unwrap_or_default().to_string(),
                    protocol: r["protocol"].as_str().unwrap_or_default().to_string(),
                })
            })
            .collect())
    }

    /// Whether a link named `dev` exists.
    pub fn link_exists(&mut self, dev: &str) -> bool {
        self.run("ip", &["-json", "link", "show", "dev", dev], None)
            .is_ok()
    }

    /// The permanent IPv4 neighbours on `dev`.
    pub fn neighbours(&mut self, dev: &str) -> Result<BTreeMap<Ipv4Addr, Mac>, KernelError> {
        let args = [
            "-4",
            "-json",
            "neigh",
            "show",
            "dev",
            dev,
            "nud",
            "permanent",
        ];
        let out = self.run("ip", &args, None)?;
        Ok(json("ip neigh show", &out)?
            .iter()
            .filter_map(|n| {
                Some((
                    n["dst"].as_str()?.parse().ok()?,
                    Mac::parse(n["lladdr"].as_str()?)?,
                ))
            })
            .collect())
    }

    /// The unicast FDB entries of `dev` that name a remote VTEP.
    pub fn fdb(&mut self, dev: &str) -> Result<BTreeMap<Mac, Ipv4Addr>, KernelError> {
        let out = self.run("bridge", &["-json", "fdb", "show", "dev", dev], None)?;
        Ok(json("bridge fdb show", &out)?
            .iter()
            .filter_map(|f| {
                let mac = Mac::parse(f["mac"].as_str()?)?;
                if mac.as_str() == "00:00:00:00:00:00" {
                    return None;
                }
                Some((mac, f["dst"].as_str()?.parse().ok()?))
            })
            .collect())
    }

    /// Makes this agent's routes, neighbours and FDB entries those of `plan`: adds and
    /// changes what is missing or different, deletes what the plan no longer has. A prefix
    /// already routed by someone else is left alone and reported.
    pub fn sync(&mut self, plan: &Plan) -> Report {
        let mut rep = Report::default();
        let routes = match self.routes() {
            Ok(r) => r,
            Err(e) => {
                rep.errors.push(e.to_string());
                return rep;
            }
        };
        let proto = RTPROT_NODUS.to_string();
        let (ours, foreign): (Vec<KernelRoute>, Vec<KernelRoute>) =
            routes.into_iter().partition(|r| r.protocol == proto);
        let vxlan = self.link_exists(VXLAN_DEVICE);
        let (neigh, fdb) = if vxlan {
            (
                self.neighbours(VXLAN_DEVICE).unwrap_or_else(|e| {
                    rep.errors.push(e.to_string());
                    BTreeMap::new()
                }),
                self.fdb(VXLAN_DEVICE).unwrap_or_else(|e| {
                    rep.errors.push(e.to_string());
                    BTreeMap::new()
                }),
            )
        } else {
            Default::default()
        };

        // Removals first: a route, then what it went through.
        // A changed route is replaced below; only a gone one is deleted.
        for r in ours.iter().filter(|r| !plan.routes.contains_key(&r.dst)) {
            let dst = r.dst.to_string();
            let gw = r.gateway.map(|g| g.to_string());
            let mut args = vec!["route", "del", &dst, "proto", &proto];
            if let Some(g) = &gw {
                args.extend(["via", g.as_str()]);
            }
            self.apply(&mut rep, "ip", &args);
        }
        for ip in neigh.keys().filter(|ip| !plan.neighbours.contains_key(ip)) {
            let ip = ip.to_string();
            self.apply(&mut rep, "ip", &["neigh", "del", &ip, "dev", VXLAN_DEVICE]);
        }
        for (mac, ip) in &fdb {
            if plan.fdb.get(mac) != Some(ip) {
                let ip = ip.to_string();
                let args = [
                    "fdb",
                    "del",
                    mac.as_str(),
                    "dev",
                    VXLAN_DEVICE,
                    "dst",
                    &ip,
                    "self",
                ];
                self.apply(&mut rep, "bridge", &args);
            }
        }

        // Then additions: FDB and neighbour before the route that needs them (flannel's
        // order), so the first packet over a new route already finds its VTEP.
        for (mac, ip) in &plan.fdb {
            if fdb.get(mac) != Some(ip) {
                let ip = ip.to_string();
                let args = [
                    "fdb",
                    "append",
                    mac.as_str(),
                    "dev",
                    VXLAN_DEVICE,
                    "dst",
                    &ip,
                    "self",
                    "permanent",
                ];
                self.apply(&mut rep, "bridge", &args);
            }
        }
        for (ip, mac) in &plan.neighbours {
            if neigh.get(ip) != Some(mac) {
                let ip = ip.to_string();
                let args = [
                    "neigh",
                    "replace",
                    &ip,
                    "lladdr",
                    mac.as_str(),
                    "dev",
                    VXLAN_DEVICE,
                    "nud",
                    "permanent",
                ];
                self.apply(&mut rep, "ip", &args);
            }
        }
        for (dst, want) in &plan.routes {
            if ours.iter().any(|r| r.dst == *dst && matches(r, want)) {
                continue;
            }
            if let Some(f) = foreign.iter().find(|f| f.dst == *dst) {
                rep.errors.push(format!(
                    "route to {dst} exists and is not nodus's (dev {} proto {}): left alone",
                    f.dev, f.protocol
                ));
                continue;
            }
            let (d, g) = (dst.to_string(), want.gateway.to_string());
            let mut args = vec!["route", "replace", &d, "via", &g];
            if let Some(dev) = &want.dev {
                args.extend(["dev", dev.as_str(), "onlink"]);
            }
            args.extend(["proto", &proto]);
            self.apply(&mut rep, "ip", &args);
        }
        rep
    }

    fn apply(&mut self, rep: &mut Report, program: &str, args: &[&str]) {
        let cmd = format!("{program} {}", args.join(" "));
        match self.run(program, args, None) {
            Ok(_) => rep.changes.push(cmd),
            Err(e) => rep.errors.push(e.to_string()),
        }
    }
}

/// Whether the kernel's route is the one wanted (a host-gw route may leave by any device).
fn matches(have: &KernelRoute, want: &Route) -> bool {
    have.gateway == Some(want.gateway) && want.dev.as_ref().is_none_or(|d| *d == have.dev)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::plan::{Backend, Lease, plan};
    use std::sync::{Arc, Mutex};

    /// Answers listings from canned JSON and records every other command.
    #[derive(Clone, Default)]
    pub(crate) struct FakeRunner {
        pub canned: Arc<Mutex<BTreeMap<String, String>>>,
        pub log: Arc<Mutex<Vec<String>>>,
    }

    impl Runner for FakeRunner {
        fn run(
            &mut self,
            program: &str,
            args: &[&str],
            stdin: Option<&str>,
        ) -> Result<String, KernelError> {
            let cmd = format!("{program} {}", args.join(" "));
            if let Some(out) = self.canned.lock().unwrap().get(&cmd) {
                return Ok(out.clone());
            }
            if cmd.starts_with("ip -json link show") {
                return Err(KernelError::Failed {
                    cmd,
                    stderr: "Device does not exist.".into(),
                });
            }
            let mut line = cmd;
            if let Some(s) = stdin {
                line.push('\n');
                line.push_str(s);
            }
            self.log.lock().unwrap().push(line);
            Ok(String::new())
        }
    }

    fn lease(node: &str, cidr: &str, ip: &str, mac: &str) -> Lease {
        Lease {
            node: node.into(),
            created: node.into(),
            pod_cidr: cidr.parse().unwrap(),
            public_ip: ip.parse().unwrap(),
            vtep_mac: Mac::parse(mac),
        }
    }

    const ROUTES: &str = "ip -4 -json route show table main";

    #[test]
    fn sync_host_gw_adds_moves_and_removes_only_its_own_routes() {
        let fake = FakeRunner::default();
        fake.canned.lock().unwrap().insert(
            ROUTES.into(),
            r#"[{"dst":"default","gateway":"10.0.0.1","dev":"eth0","flags":[]},
                {"dst":"10.0.0.0/24","dev":"eth0","protocol":"kernel","scope":"link","flags":[]},
                {"dst":"10.42.1.0/24","dev":"cni0","protocol":"kernel","scope":"link","flags":[]},
                {"dst":"10.42.2.0/24","gateway":"10.0.0.12","dev":"eth0","protocol":"151","flags":[]},
                {"dst":"10.42.3.0/24","gateway":"10.0.0.13","dev":"eth0","protocol":"151","flags":[]},
                {"dst":"10.42.9.0/24","gateway":"10.0.0.19","dev":"eth0","protocol":"151","flags":[]},
                {"dst":"10.42.5.0/24","gateway":"10.0.0.50","dev":"eth0","protocol":"static","flags":[]}]"#
                .into(),
        );
        let mut k = Kernel::new(Box::new(fake.clone()));
        let leases = [
            lease("a", "10.42.1.0/24", "10.0.0.11", ""),
            // Unchanged.
            lease("b", "10.42.2.0/24", "10.0.0.12", ""),
            // Moved to a new address.
            lease("c", "10.42.3.0/24", "10.0.0.33", ""),
            // New.
            lease("d", "10.42.4.0/24", "10.0.0.14", ""),
            // Someone else's route has this prefix.
            lease("e", "10.42.5.0/24", "10.0.0.15", ""),
        ];
        let rep = k.sync(&plan("a", Backend::HostGw, &leases));
        assert_eq!(
            *fake.log.lock().unwrap(),
            [
                // 10.42.9.0/24's node is gone (deleted while the agent was down, say).
                "ip route del 10.42.9.0/24 proto 151 via 10.0.0.19",
                "ip route replace 10.42.3.0/24 via 10.0.0.33 proto 151",
                "ip route replace 10.42.4.0/24 via 10.0.0.14 proto 151",
            ]
        );
        assert_eq!(
            rep.errors,
            ["route to 10.42.5.0/24 exists and is not nodus's (dev eth0 proto static): left alone"]
        );
        assert_eq!(rep.changes.len(), 3);
    }

    #[test]
    fn sync_vxlan_programs_fdb_and_neighbour_before_the_route() {
        let fake = FakeRunner::default();
        {
            let mut c = fake.canned.lock().unwrap();
            c.insert(
                ROUTES.into(),
                r#"[{"dst":"10.42.3.0/24","gateway":"10.42.3.0","dev":"nodus.1","protocol":"151","flags":["onlink"]}]"#.into(),
            );
            c.insert("ip -json link show dev nodus.1".into(), "[{}]".into());
            c.insert(
                "ip -4 -json neigh show dev nodus.1 nud permanent".into(),
                r#"[{"dst":"10.42.3.0","lladdr":"02:00:00:00:00:0c","state":["PERMANENT"]}]"#
                    .into(),
            );
            c.insert(
                "bridge -json fdb show dev nodus.1".into(),
                r#"[{"mac":"02:00:00:00:00:0c","dst":"10.0.0.13","flags":["self"],"state":"permanent"},
                    {"mac":"00:00:00:00:00:00","dst":"10.0.0.99","flags":["self"],"state":"permanent"}]"#
                    .into(),
            );
        }
        let mut k = Kernel::new(Box::new(fake.clone()));
        let leases = [
            lease("a", "10.42.1.0/24", "10.0.0.11", "02:00:00:00:00:0a"),
            lease("b", "10.42.2.0/24", "10.1.0.12", "02:00:00:00:00:0b"),
        ];
        let rep = k.sync(&plan("a", Backend::Vxlan, &leases));
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        assert_eq!(
            *fake.log.lock().unwrap(),
            [
                "ip route del 10.42.3.0/24 proto 151 via 10.42.3.0",
                "ip neigh del 10.42.3.0 dev nodus.1",
                "bridge fdb del 02:00:00:00:00:0c dev nodus.1 dst 10.0.0.13 self",
                "bridge fdb append 02:00:00:00:00:0b dev nodus.1 dst 10.1.0.12 self permanent",
                "ip neigh replace 10.42.2.0 lladdr 02:00:00:00:00:0b dev nodus.1 nud permanent",
                "ip route replace 10.42.2.0/24 via 10.42.2.0 dev nodus.1 onlink proto 151",
            ]
        );
    }
}
