//! Deleting stale UDP conntrack entries with the `conntrack` tool (conntrack-tools), in the
//! proxy's own network namespace.

use crate::model::ServicePort;
use std::net::Ipv4Addr;
use std::process::Command;

fn run(args: &[String]) {
    match Command::new("conntrack").args(args).output() {
        // conntrack exits non-zero when nothing matched: not an error here.
        Ok(out) => tracing::debug!(
            args = %args.join(" "),
            result = %String::from_utf8_lossy(&out.stderr).trim(),
            "conntrack cleanup"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "cannot run conntrack; stale UDP flows stay until they time out")
        }
    }
}

fn s(x: impl ToString) -> String {
    x.to_string()
}

/// Flows of `svc` (any of its destinations) that were DNATed to `endpoint`.
pub fn clear_endpoint_flows(svc: &ServicePort, endpoint: Ipv4Addr) {
    for ip in std::iter::once(&svc.cluster_ip)
        .chain(&svc.external_ips)
        .chain(&svc.load_balancer_ips)
    {
        run(&[
            s("-D"),
            s("-p"),
            s("udp"),
            s("--orig-dst"),
            s(ip),
            s("--dport"),
            s(svc.port),
            s("--reply-src"),
            s(endpoint),
        ]);
    }
    if let Some(np) = svc.node_port {
        run(&[
            s("-D"),
            s("-p"),
            s("udp"),
            s("--dport"),
            s(np),
            s("--reply-src"),
            s(endpoint),
        ]);
    }
}

/// Every flow to `svc`'s destinations (they were rejected while it had no endpoints).
pub fn clear_service_flows(svc: &ServicePort) {
    for ip in std::iter::once(&svc.cluster_ip)
        .chain(&svc.external_ips)
        .chain(&svc.load_balancer_ips)
    {
        run(&[
            s("-D"),
            s("-p"),
            s("udp"),
            s("--orig-dst"),
            s(ip),
            s("--dport"),
            s(svc.port),
        ]);
    }
    if let Some(np) = svc.node_port {
        run(&[s("-D"), s("-p"), s("udp"), s("--dport"), s(np)]);
    }
}
