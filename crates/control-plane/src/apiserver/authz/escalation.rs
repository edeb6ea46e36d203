//! RBAC escalation prevention, as upstream's RBAC storage enforces it: a Role or ClusterRole
//! may only grant rules its writer already holds (unless the writer may `escalate` it), and
//! a binding may only grant a role whose rules its writer holds (unless the writer may
//! `bind` it). `system:masters` and API servers without RBAC skip the check.

use serde_json::Value;

use super::rbac::{Index, Rule};
use super::{Attributes, Mode, Request, ResourceAttrs};
use crate::apiserver::authn::User;
use crate::apiserver::rest::path::Target;
use crate::apiserver::state::ApiState;

const GROUP: &str = "rbac.authorization.k8s.io";

/// `Err(status)` (403) when writing `obj` would grant the user more than it holds.
pub fn check(st: &ApiState, user: &User, t: &Target, obj: &Value) -> Result<(), Value> {
    if t.info.group != GROUP
        || user.in_group("system:masters")
        || !st.config.authorization_modes.contains(&Mode::Rbac)
    {
        return Ok(());
    }
    let ns = t.namespace.as_deref().unwrap_or("");
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let index = st.authz.rbac().index();
    let may = |verb: &str, resource: &str, role: &str| {
        let a = Attributes {
            verb,
            request: Request::Named(ResourceAttrs {
                group: GROUP,
                resource,
                subresource: "",
                namespace: ns,
                name: role,
            }),
            body: None,
            field_selector: None,
        };
        st.authz.authorize(user, &a, st.store.as_ref()).is_ok()
    };
    let granted: Vec<Rule> = match t.info.kind {
        "Role" | "ClusterRole" => {
            if may("escalate", t.info.plural, name) {
                return Ok(());
            }
            rules_in(obj)
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let kind = obj.pointer("/roleRef/kind").and_then(Value::as_str);
            let role = obj
                .pointer("/roleRef/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let (plural, key) = match kind {
                Some("Role") => ("roles", format!("/{GROUP}/roles/{ns}/{role}")),
                Some("ClusterRole") => ("clusterroles", format!("/{GROUP}/clusterroles/{role}")),
                // Validation refuses other kinds.
                _ => return Ok(()),
            };
            if may("bind", plural, role) {
                return Ok(());
            }
            match st.store.get(&key) {
                Ok(Some(s)) => rules_in(&s.object),
                _ => Vec::new(),
            }
        }
        _ => return Ok(()),
    };
    let missing = not_covered(&index, user, ns, &granted);
    if missing.is_empty() {
        return Ok(());
    }
    let groups: Vec<String> = user.groups.iter().map(|g| go_q(g)).collect();
    let cause = format!(
        "user {} (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
        go_q(&user.name),
        groups.join(" "),
        missing.join("\n")
    );
    Err(nodus_k8s::status::forbidden_with(
        GROUP,
        t.info.plural,
        name,
        &cause,
    ))
}

fn rules_in(obj: &Value) -> Vec<Rule> {
    obj.get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(Rule::from_json)
        .collect()
}

fn go_q(s: &str) -> String {
    nodus_k8s::status::go_quote(s)
}

/// The granted rules' atomic parts (one verb, group, resource, name or URL each) that no
/// rule the user holds in `ns` covers, compacted and sorted as upstream prints them.
fn not_covered(index: &Index, user: &User, ns: &str, granted: &[Rule]) -> Vec<String> {
    let held = index.rules_for(user, ns);
    let covered =
        |verb: &str, r: &ResourceAttrs<'_>| held.iter().any(|h| h.allows_resource(verb, r));
    let mut missing: Vec<Rule> = Vec::new();
    for g in granted {
        for verb in &g.verbs {
            for url in &g.non_resource_urls {
                if !held.iter().any(|h| h.allows_path(verb, url)) {
                    push_compact(
                        &mut missing,
                        Rule {
                            verbs: vec![verb.clone()],
                            non_resource_urls: vec![url.clone()],
                            ..Default::default()
                        },
                    );
                }
            }
            for group in &g.api_groups {
                for res in &g.resources {
                    let (resource, sub) = res.split_once('/').unwrap_or((res, ""));
                    let names: Vec<&str> = if g.resource_names.is_empty() {
                        vec![""]
                    } else {
                        g.resource_names.iter().map(String::as_str).collect()
                    };
                    for name in names {
                        // A wildcard is held only by an owner rule with the same wildcard.
                        let attrs = ResourceAttrs {
                            group,
                            resource,
                            subresource: sub,
                            namespace: ns,
                            name,
                        };
                        let ok = if group == "*" || resource == "*" || verb == "*" || sub == "*" {
                            held.iter()
                                .any(|h| wildcard_covers(h, verb, group, res, name))
                        } else if name.is_empty() {
                            held.iter().any(|h| {
                                h.resource_names.is_empty() && h.allows_resource(verb, &attrs)
                            })
                        } else {
                            covered(verb, &attrs)
                        };
                        if !ok {
                            push_compact(
                                &mut missing,
                                Rule {
                                    verbs: vec![verb.clone()],
                                    api_groups: vec![group.clone()],
                                    resources: vec![res.clone()],
                                    resource_names: if name.is_empty() {
                                        Vec::new()
                                    } else {
                                        vec![name.to_string()]
                                    },
                                    non_resource_urls: Vec::new(),
                                },
                            );
                        }
                    }
                }
            }
        }
    }
    let mut out: Vec<String> = missing.iter().map(compact_string).collect();
    out.sort();
    out
}

fn wildcard_covers(h: &Rule, verb: &str, group: &str, res: &str, name: &str) -> bool {
    let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
    has(&h.verbs, verb)
        && has(&h.api_groups, group)
        && has(&h.resources, res)
        && (h.resource_names.is_empty() || (!name.is_empty() && has(&h.resource_names, name)))
}

/// Upstream's CompactRules: rules that differ only in their verbs become one.
fn push_compact(missing: &mut Vec<Rule>, r: Rule) {
    if let Some(m) = missing.iter_mut().find(|m| {
        m.api_groups == r.api_groups
            && m.resources == r.resources
            && m.resource_names == r.resource_names
            && m.non_resource_urls == r.non_resource_urls
    }) {
        for v in r.verbs {
            if !m.verbs.contains(&v) {
                m.verbs.push(v);
            }
        }
        return;
    }
    missing.push(r);
}

/// Upstream's CompactString: `{APIGroups:["apps"], Resources:["deployments"], Verbs:["get"]}`.
fn compact_string(r: &Rule) -> String {
    let q = |l: &[String]| {
        let parts: Vec<String> = l.iter().map(|s| go_q(s)).collect();
        format!("[{}]", parts.join(" "))
    };
    let mut parts = Vec::new();
    if !r.api_groups.is_empty() {
        parts.push(format!("APIGroups:{}", q(&r.api_groups)));
    }
    if !r.resources.is_empty() {
        parts.push(format!("Resources:{}", q(&r.resources)));
    }
    if !r.non_resource_urls.is_empty() {
        parts.push(format!("NonResourceURLs:{}", q(&r.non_resource_urls)));
    }
    if !r.resource_names.is_empty() {
        parts.push(format!("ResourceNames:{}", q(&r.resource_names)));
    }
    if !r.verbs.is_empty() {
        parts.push(format!("Verbs:{}", q(&r.verbs)));
    }
    format!("{{{}}}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_strings_read_as_upstream() {
        let mut missing = Vec::new();
        for verb in ["get", "list"] {
            push_compact(
                &mut missing,
                Rule {
                    verbs: vec![verb.into()],
                    api_groups: vec!["".into()],
                    resources: vec!["secrets".into()],
                    ..Default::default()
                },
            );
        }
        assert_eq!(missing.len(), 1);
        assert_eq!(
            compact_string(&missing[0]),
            r#"{APIGroups:[""], Resources:["secrets"], Verbs:["get" "list"]}"#
        );
    }
}
