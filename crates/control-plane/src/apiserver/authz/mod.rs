//! Authorization: may this user do this? The chain as upstream's `--authorization-mode`
//! builds it: `system:masters` first (upstream's privileged-group authorizer), then each mode
//! in flag order; the first allow or deny decides, and when every authorizer has no opinion
//! the request is refused with their reasons.

mod controller_policy;
pub mod escalation;
mod node;
pub mod policy;
pub mod rbac;

use std::sync::Arc;

use nodus_k8s::status::go_quote;
use serde_json::Value;

use crate::apiserver::authn::User;
use crate::apiserver::rest::path::Target;
use crate::apiserver::state::ApiState;
use crate::storage::Store;

/// What is asked about.
#[derive(Clone, Copy, Debug)]
pub enum Request<'a> {
    /// A resource the server serves (the Node authorizer reads its objects).
    Served(&'a Target),
    /// A resource by its names only (a review about a resource the catalogue lacks, or a
    /// review endpoint).
    Named(ResourceAttrs<'a>),
    /// A path outside the resource tree (`/healthz`, `/apis`, `/openapi/v2`...).
    NonResource(&'a str),
}

/// A resource request's attributes, as RBAC rules match them.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResourceAttrs<'a> {
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// The request as the authorizer sees it.
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub request: Request<'a>,
    /// The request body for create/update/patch (after patching for patch), if any.
    pub body: Option<&'a Value>,
    pub field_selector: Option<&'a str>,
}

impl<'a> Attributes<'a> {
    /// The resource attributes, `None` for a non-resource path.
    pub fn resource(&self) -> Option<ResourceAttrs<'a>> {
        match self.request {
            Request::Served(t) => Some(ResourceAttrs {
                group: t.info.group,
                resource: t.info.plural,
                subresource: t.sub.as_deref().unwrap_or(""),
                namespace: t.namespace.as_deref().unwrap_or(""),
                // A create names its object in the body, which upstream's RBAC does not
                // see: resourceNames rules never match a create.
                name: t.name.as_deref().unwrap_or(""),
            }),
            Request::Named(r) => Some(r),
            Request::NonResource(_) => None,
        }
    }
}

/// One authorizer's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused outright, with the reason.
    Deny(String),
    /// Leaves the request to the next authorizer; the reason ends up in the 403 if none allows.
    NoOpinion(String),
}

/// One `--authorization-mode` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    AlwaysAllow,
    AlwaysDeny,
    Node,
    Rbac,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "AlwaysAllow" => Mode::AlwaysAllow,
            "AlwaysDeny" => Mode::AlwaysDeny,
            "Node" => Mode::Node,
            "RBAC" => Mode::Rbac,
            _ => return None,
        })
    }
}

/// Upstream's default `--authorization-mode`.
pub const DEFAULT_MODES: &str = "Node,RBAC";

/// Parses `--authorization-mode` (comma-separated, each mode at most once), with
/// kube-apiserver's messages for what it refuses.
pub fn parse_modes(flag: &str) -> Result<Vec<Mode>, String> {
    let mut out = Vec::new();
    for m in flag.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let Some(mode) = Mode::parse(m) else {
            return Err(format!(
                "authorization-mode {m:?} is not a valid mode (AlwaysAllow, AlwaysDeny, Node, RBAC)"
            ));
        };
        if out.contains(&mode) {
            return Err(format!(
                "authorization-mode {m:?} has mode specified more than once"
            ));
        }
        out.push(mode);
    }
    if out.is_empty() {
        return Err("at least one authorization-mode must be passed".into());
    }
    Ok(out)
}

/// One link of the chain.
enum Authorizer {
    AlwaysAllow,
    AlwaysDeny,
    Node,
    Rbac(Arc<rbac::RbacAuthorizer>),
}

/// The authorizer chain of this API server.
pub struct Chain {
    links: Vec<Authorizer>,
    rbac: Arc<rbac::RbacAuthorizer>,
}

impl Chain {
    pub fn new(modes: &[Mode], store: Arc<dyn Store>) -> Chain {
        let rbac = Arc::new(rbac::RbacAuthorizer::new(store));
        let links = modes
            .iter()
            .map(|m| match m {
                Mode::AlwaysAllow => Authorizer::AlwaysAllow,
                Mode::AlwaysDeny => Authorizer::AlwaysDeny,
                Mode::Node => Authorizer::Node,
                Mode::Rbac => Authorizer::Rbac(rbac.clone()),
            })
            .collect();
        Chain { links, rbac }
    }

    /// The RBAC rule index (also used for rules reviews when RBAC is not in the chain).
    pub fn rbac(&self) -> &rbac::RbacAuthorizer {
        &self.rbac
    }

    /// The chain's decision; `Err(reason)` is a 403 with the authorizers' reasons.
    pub fn authorize(
        &self,
        user: &User,
        attrs: &Attributes<'_>,
        store: &dyn Store,
    ) -> Result<(), String> {
        if user.in_group("system:masters") {
            return Ok(());
        }
        let mut reasons: Vec<String> = Vec::new();
        for link in &self.links {
            let d = match link {
                Authorizer::AlwaysAllow => Decision::Allow,
                Authorizer::AlwaysDeny => Decision::Deny(String::new()),
                Authorizer::Node => node::authorize(user, attrs, store),
                Authorizer::Rbac(r) => r.authorize(user, attrs),
            };
            match d {
                Decision::Allow => return Ok(()),
                Decision::Deny(r) => {
                    reasons.push(r);
                    break;
                }
                Decision::NoOpinion(r) => reasons.push(r),
            }
        }
        reasons.retain(|r| !r.is_empty());
        Err(reasons.join(", "))
    }
}

/// The request attributes of a path the REST handlers do not serve as a resource: API
/// review endpoints and unknown resources are resource requests (as upstream's request info
/// parser sees any `/api/v1/<x>` or `/apis/<g>/<v>/<x>`), everything else is a non-resource
/// path with the lower-cased method as its verb.
pub fn path_request<'a>(method: &str, path: &'a str) -> (String, Request<'a>) {
    let segs: Vec<&'a str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest: &[&'a str] = match segs.as_slice() {
        ["api", _v, rest @ ..] if !rest.is_empty() => rest,
        ["apis", _g, _v, rest @ ..] if !rest.is_empty() => rest,
        _ => return (method.to_ascii_lowercase(), Request::NonResource(path)),
    };
    let group = if segs[0] == "api" { "" } else { segs[1] };
    let (namespace, rest) = match rest {
        ["namespaces", ns, r @ ..] if !r.is_empty() => (*ns, r),
        r => ("", r),
    };
    let attrs = ResourceAttrs {
        group,
        resource: rest[0],
        name: rest.get(1).copied().unwrap_or(""),
        subresource: rest.get(2).copied().unwrap_or(""),
        namespace,
    };
    let verb = match method {
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" if attrs.name.is_empty() => "deletecollection",
        "DELETE" => "delete",
        _ if attrs.name.is_empty() => "list",
        _ => "get",
    };
    (verb.to_string(), Request::Named(attrs))
}

/// Authorizes a request the REST handlers will not see as a served resource (discovery,
/// OpenAPI, health, version, the review APIs); `Some(status)` is the 403 to answer with.
pub fn authorize_path(st: &ApiState, user: &User, method: &str, path: &str) -> Option<Value> {
    use crate::apiserver::rest::path::{Parsed, parse};
    // The REST handlers authorize resources, except the reviews, which their own router
    // answers; the Metrics API authorizes its own.
    if let Parsed::Resource(t) = parse(path)
        && !(method == "POST" && is_review(t.info.group))
    {
        return None;
    }
    if crate::apiserver::metrics_api::serves(path) {
        return None;
    }
    let (verb, request) = path_request(method, path);
    let attrs = Attributes {
        verb: &verb,
        request,
        body: None,
        field_selector: None,
    };
    let reason = st.authz.authorize(user, &attrs, st.store.as_ref()).err()?;
    Some(forbidden(user, &attrs, &reason))
}

fn is_review(group: &str) -> bool {
    matches!(group, "authentication.k8s.io" | "authorization.k8s.io")
}

/// Upstream's 403 for a refused request: `<resource> "<name>" is forbidden: User "<u>"
/// cannot <verb> resource "<res>[/<sub>]" in API group "<g>" in the namespace "<ns>"` (or
/// `at the cluster scope`), and `forbidden: User "<u>" cannot <verb> path "<p>"` for
/// non-resource paths; the authorizers' reasons follow a colon.
pub fn forbidden(user: &User, attrs: &Attributes<'_>, reason: &str) -> Value {
    match (attrs.resource(), attrs.request) {
        (Some(r), _) => {
            let resource = if r.subresource.is_empty() {
                r.resource.to_string()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            nodus_k8s::status::forbidden(
                &user.name,
                attrs.verb,
                &resource,
                r.group,
                r.name,
                r.namespace,
                reason,
            )
        }
        (None, Request::NonResource(path)) => {
            let mut cause = format!(
                "User {} cannot {} path {}",
                go_quote(&user.name),
                attrs.verb,
                go_quote(path)
            );
            if !reason.is_empty() {
                cause.push_str(": ");
                cause.push_str(reason);
            }
            nodus_k8s::status::forbidden_with("", "", "", &cause)
        }
        (None, _) => nodus_k8s::status::forbidden_with("", "", "", reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_kube_apiserver() {
        assert_eq!(
            parse_modes(DEFAULT_MODES).unwrap(),
            vec![Mode::Node, Mode::Rbac]
        );
        assert_eq!(parse_modes("AlwaysAllow").unwrap(), vec![Mode::AlwaysAllow]);
        assert!(parse_modes("Node,ABAC").unwrap_err().contains("\"ABAC\""));
        assert!(parse_modes("RBAC,RBAC").is_err());
        assert!(parse_modes("").is_err());
    }

    #[test]
    fn paths_become_requests() {
        let (v, r) = path_request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        );
        assert_eq!(v, "create");
        assert!(
            matches!(r, Request::Named(a) if a.group == "authorization.k8s.io" && a.resource == "selfsubjectaccessreviews")
        );
        let (v, r) = path_request("GET", "/apis/apps/v1");
        assert_eq!(v, "get");
        assert!(matches!(r, Request::NonResource("/apis/apps/v1")));
        let (v, _) = path_request("HEAD", "/healthz");
        assert_eq!(v, "head");
    }
}
