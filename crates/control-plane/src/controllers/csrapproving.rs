//! The CSR approving controller (upstream's `pkg/controller/certificates/approver`, the
//! `csrapproving` controller): a kubelet client CSR is approved when its requester may
//! `create` `certificatesigningrequests/nodeclient` (a bootstrap token) or, for a renewal
//! by the node itself, `selfnodeclient`, asked of the authorizer as a SubjectAccessReview.
//! Beyond upstream (as k3s does), a kubelet serving CSR is approved when the node itself
//! asks for its own name with SANs among its Node's addresses. A node asking for another
//! node's name is denied.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{Value, json};

use super::cache::Cache;
use super::certificates::{
    KUBE_APISERVER_CLIENT_KUBELET, KUBELET_SERVING, ParsedRequest, has_condition, parse_request,
    usages, validate_kubelet_client, validate_kubelet_serving,
};
use crate::apiserver::authn::User;
use crate::apiserver::authz::{Attributes, Request, ResourceAttrs};
use crate::apiserver::state::ApiState;
use crate::controllers::objects;

/// What the approver decides for one CSR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Approve(Approval),
    Deny(DenyReason),
    /// Not one of ours, or not (yet) approvable: left for an administrator.
    Leave,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Approval {
    SelfNodeClient,
    NodeClient,
    NodeServing,
}

impl Approval {
    fn message(self) -> &'static str {
        match self {
            Approval::SelfNodeClient => {
                "Auto approving self kubelet client certificate after SubjectAccessReview."
            }
            Approval::NodeClient => {
                "Auto approving kubelet client certificate after SubjectAccessReview."
            }
            Approval::NodeServing => {
                "Auto approving kubelet serving certificate for the node's own name and addresses."
            }
        }
    }
    /// The subresource upstream's SubjectAccessReview asks about.
    fn permission(self) -> Option<&'static str> {
        match self {
            Approval::SelfNodeClient => Some("selfnodeclient"),
            Approval::NodeClient => Some("nodeclient"),
            Approval::NodeServing => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DenyReason {
    /// A node asked for a certificate naming another node.
    OtherNode { requester: String, subject: String },
}

impl DenyReason {
    fn reason(&self) -> &'static str {
        match self {
            DenyReason::OtherNode { .. } => "NodeNameMismatch",
        }
    }
    fn message(&self) -> String {
        match self {
            DenyReason::OtherNode { requester, subject } => {
                format!("node {requester:?} may not request a certificate for {subject:?}")
            }
        }
    }
}

/// The requester recorded on the CSR at create.
fn requester(csr: &Value) -> User {
    User {
        name: csr
            .pointer("/spec/username")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        groups: csr
            .pointer("/spec/groups")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(str::to_string))
            .collect(),
        ..Default::default()
    }
}

/// The Node's addresses as a serving certificate may name them: its name, hostnames and IPs.
fn node_names(node: &Value) -> (BTreeSet<String>, BTreeSet<IpAddr>) {
    let mut dns = BTreeSet::new();
    let mut ips = BTreeSet::new();
    if let Some(n) = node.pointer("/metadata/name").and_then(Value::as_str) {
        dns.insert(n.to_string());
    }
    for a in node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let addr = a["address"].as_str().unwrap_or("");
        match a["type"].as_str().unwrap_or("") {
            "Hostname" | "InternalDNS" | "ExternalDNS" => {
                dns.insert(addr.to_string());
            }
            "InternalIP" | "ExternalIP" => {
                if let Ok(ip) = addr.parse() {
                    ips.insert(ip);
                }
            }
            _ => {}
        }
    }
    (dns, ips)
}

/// The recognizers, in upstream's order, then nodus's serving rule. `node` is the Node a
/// serving CSR names, if it exists; `allowed` answers the SubjectAccessReview.
pub(crate) fn decide(
    csr: &Value,
    req: &ParsedRequest,
    node: Option<&Value>,
    allowed: &dyn Fn(&User, &str) -> bool,
) -> Decision {
    let signer = csr
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let user = requester(csr);
    let usages = usages(csr);
    let own_node = user.node_name().map(|n| format!("system:node:{n}"));
    let other_node = |own: &String| DenyReason::OtherNode {
        requester: own.clone(),
        subject: req.common_name.clone(),
    };
    if signer == KUBE_APISERVER_CLIENT_KUBELET && validate_kubelet_client(req, &usages).is_ok() {
        let mut tried = Vec::new();
        if user.name == req.common_name {
            tried.push(Approval::SelfNodeClient);
        }
        tried.push(Approval::NodeClient);
        for a in tried {
            if a.permission().is_some_and(|p| allowed(&user, p)) {
                return Decision::Approve(a);
            }
        }
        if let Some(own) = own_node.filter(|o| *o != req.common_name) {
            return Decision::Deny(other_node(&own));
        }
        return Decision::Leave;
    }
    if signer == KUBELET_SERVING && validate_kubelet_serving(req, &usages).is_ok() {
        let Some(own) = own_node else {
            return Decision::Leave;
        };
        if own != req.common_name {
            return Decision::Deny(other_node(&own));
        }
        let Some(node) = node else {
            return Decision::Leave;
        };
        let (dns, ips) = node_names(node);
        let covered = req.dns_names.iter().all(|d| dns.contains(d))
            && req.ip_addresses.iter().all(|i| ips.contains(i));
        if covered {
            return Decision::Approve(Approval::NodeServing);
        }
    }
    Decision::Leave
}

fn sar_allowed(st: &ApiState, user: &User, subresource: &str) -> bool {
    let attrs = Attributes {
        verb: "create",
        request: Request::Named(ResourceAttrs {
            group: "certificates.k8s.io",
            resource: "certificatesigningrequests",
            subresource,
            ..Default::default()
        }),
        body: None,
        field_selector: None,
    };
    st.authz.authorize(user, &attrs, st.store.as_ref()).is_ok()
}

fn condition(t: &str, reason: &str, message: &str) -> Value {
    let now = crate::apiserver::rest::now_rfc3339();
    json!({"type": t, "status": "True", "reason": reason, "message": message,
        "lastUpdateTime": now, "lastTransitionTime": now})
}

fn handle(st: &ApiState, key: &str, csr: &Value) {
    if csr
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty())
        || has_condition(csr, "Approved")
        || has_condition(csr, "Denied")
    {
        return;
    }
    let req = match parse_request(csr) {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(csr = key, error = %e, "unable to parse csr");
            return;
        }
    };
    let node = req
        .common_name
        .strip_prefix("system:node:")
        .and_then(|n| st.store.get(&format!("/core/nodes/{n}")).ok().flatten());
    let decision = decide(
        csr,
        &req,
        node.as_ref().map(|n| n.object.as_ref()),
        &|u, p| sar_allowed(st, u, p),
    );
    let cond = match &decision {
        Decision::Approve(a) => condition("Approved", "AutoApproved", a.message()),
        Decision::Deny(d) => condition("Denied", d.reason(), &d.message()),
        Decision::Leave => return,
    };
    let r = objects::modify(st, key, &mut |o| {
        if has_condition(o, "Approved") || has_condition(o, "Denied") {
            return false;
        }
        if !o.get("status").is_some_and(Value::is_object) {
            o["status"] = json!({});
        }
        let cs = o["status"]
            .as_object_mut()
            .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
        match cs.and_then(Value::as_array_mut) {
            Some(a) => a.push(cond.clone()),
            None => o["status"]["conditions"] = json!([cond.clone()]),
        }
        true
    });
    match r {
        Ok(_) => tracing::info!(csr = key, decision = ?decision, "csr approver"),
        Err(e) => tracing::warn!(csr = key, error = %e, "csr approver: update failed"),
    }
}

pub async fn run(st: Arc<ApiState>) {
    let mut csrs = Cache::new(
        st.store.clone(),
        "/certificates.k8s.io/certificatesigningrequests/",
    );
    // Serving CSRs wait for their Node's addresses.
    let mut nodes = Cache::new(st.store.clone(), "/core/nodes/");
    loop {
        let items: Vec<(String, Arc<Value>)> = csrs
            .objects
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in items {
            handle(&st, &k, &v);
        }
        tokio::select! {
            _ = csrs.next() => {}
            _ = nodes.next() => {}
        }
        while csrs.try_next().is_some() {}
        while nodes.try_next().is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(signer: &str, user: &str, groups: &[&str], usages: &[&str]) -> Value {
        json!({"spec": {"signerName": signer, "username": user, "groups": groups, "usages": usages}})
    }

    fn req(cn: &str, dns: &[&str], ips: &[&str]) -> ParsedRequest {
        ParsedRequest {
            common_name: cn.into(),
            organizations: vec!["system:nodes".into()],
            dns_names: dns.iter().map(|s| s.to_string()).collect(),
            ip_addresses: ips.iter().map(|s| s.parse().unwrap()).collect(),
            ..Default::default()
        }
    }

    const CLIENT: &[&str] = &["digital signature", "key encipherment", "client auth"];
    const SERVING: &[&str] = &["digital signature", "key encipherment", "server auth"];

    #[test]
    fn recognizers_table() {
        let node_a = json!({"metadata": {"name": "a"}, "status": {"addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "a"}]}});
        let bootstrapper = ["system:bootstrappers", "system:authenticated"];
        let node_groups = ["system:nodes", "system:authenticated"];
        let everyone = |_: &User, _: &str| true;
        let only_nodeclient = |_: &User, p: &str| p == "nodeclient";
        let nobody = |_: &User, _: &str| false;
        type Allow<'a> = &'a dyn Fn(&User, &str) -> bool;
        type Case<'a> = (
            &'a str,
            Value,
            ParsedRequest,
            Option<&'a Value>,
            Allow<'a>,
            Decision,
        );
        let cases: Vec<Case> = vec![
            (
                "bootstrapper's client csr",
                csr(
                    KUBE_APISERVER_CLIENT_KUBELET,
                    "system:bootstrap:abcdef",
                    &bootstrapper,
                    CLIENT,
                ),
                req("system:node:a", &[], &[]),
                None,
                &only_nodeclient,
                Decision::Approve(Approval::NodeClient),
            ),
            (
                "renewal by the node",
                csr(
                    KUBE_APISERVER_CLIENT_KUBELET,
                    "system:node:a",
                    &node_groups,
                    CLIENT,
                ),
                req("system:node:a", &[], &[]),
                None,
                &everyone,
                Decision::Approve(Approval::SelfNodeClient),
            ),
            (
                "sar refused",
                csr(
                    KUBE_APISERVER_CLIENT_KUBELET,
                    "system:bootstrap:abcdef",
                    &bootstrapper,
                    CLIENT,
                ),
                req("system:node:a", &[], &[]),
                None,
                &nobody,
                Decision::Leave,
            ),
            (
                "node renewing another's client cert",
                csr(
                    KUBE_APISERVER_CLIENT_KUBELET,
                    "system:node:b",
                    &node_groups,
                    CLIENT,
                ),
                req("system:node:a", &[], &[]),
                None,
                &nobody,
                Decision::Deny(DenyReason::OtherNode {
                    requester: "system:node:b".into(),
                    subject: "system:node:a".into(),
                }),
            ),
            (
                "client csr with wrong usages",
                csr(
                    KUBE_APISERVER_CLIENT_KUBELET,
                    "system:bootstrap:abcdef",
                    &bootstrapper,
                    SERVING,
                ),
                req("system:node:a", &[], &[]),
                None,
                &everyone,
                Decision::Leave,
            ),
            (
                "own serving csr",
                csr(KUBELET_SERVING, "system:node:a", &node_groups, SERVING),
                req("system:node:a", &["a"], &["10.0.0.1"]),
                Some(&node_a),
                &nobody,
                Decision::Approve(Approval::NodeServing),
            ),
            (
                "serving csr with a foreign IP",
                csr(KUBELET_SERVING, "system:node:a", &node_groups, SERVING),
                req("system:node:a", &["a"], &["10.9.9.9"]),
                Some(&node_a),
                &everyone,
                Decision::Leave,
            ),
            (
                "serving csr before the node exists",
                csr(KUBELET_SERVING, "system:node:a", &node_groups, SERVING),
                req("system:node:a", &["a"], &[]),
                None,
                &everyone,
                Decision::Leave,
            ),
            (
                "serving csr for another node",
                csr(KUBELET_SERVING, "system:node:b", &node_groups, SERVING),
                req("system:node:a", &["a"], &["10.0.0.1"]),
                Some(&node_a),
                &everyone,
                Decision::Deny(DenyReason::OtherNode {
                    requester: "system:node:b".into(),
                    subject: "system:node:a".into(),
                }),
            ),
            (
                "serving csr by a bootstrapper",
                csr(
                    KUBELET_SERVING,
                    "system:bootstrap:abcdef",
                    &bootstrapper,
                    SERVING,
                ),
                req("system:node:a", &["a"], &[]),
                Some(&node_a),
                &everyone,
                Decision::Leave,
            ),
            (
                "user client csr",
                csr(
                    "kubernetes.io/kube-apiserver-client",
                    "alice",
                    &["system:authenticated"],
                    CLIENT,
                ),
                req("system:node:a", &[], &[]),
                None,
                &everyone,
                Decision::Leave,
            ),
        ];
        for (name, c, r, node, allow, want) in cases {
            assert_eq!(decide(&c, &r, node, allow), want, "{name}");
        }
    }
}
