//! The RBAC authorizer: Roles and ClusterRoles grant rules, RoleBindings and
//! ClusterRoleBindings grant roles to users, groups and service accounts. Decisions read an
//! index by subject, rebuilt from the store when a watch on the RBAC objects reports a
//! change (checked without blocking on every decision, so a binding is in force as soon as
//! its write has returned).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::mpsc::Receiver;
use tokio::sync::mpsc::error::TryRecvError;

use super::{Attributes, Decision, ResourceAttrs};
use crate::apiserver::authn::User;
use crate::storage::{Event, Store};

/// Where the RBAC objects live in the store.
const PREFIX: &str = "/rbac.authorization.k8s.io/";

/// One PolicyRule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect()
}

impl Rule {
    pub fn from_json(v: &Value) -> Rule {
        Rule {
            verbs: strings(v, "verbs"),
            api_groups: strings(v, "apiGroups"),
            resources: strings(v, "resources"),
            resource_names: strings(v, "resourceNames"),
            non_resource_urls: strings(v, "nonResourceURLs"),
        }
    }

    fn verb_matches(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == "*" || v == verb)
    }

    /// Upstream's `ResourceMatches`: `*`, the resource, `resource/sub`, or `*/sub`.
    fn resource_matches(&self, r: &ResourceAttrs<'_>) -> bool {
        self.resources.iter().any(|rule| {
            if rule == "*" {
                return true;
            }
            if r.subresource.is_empty() {
                return rule == r.resource;
            }
            match rule.split_once('/') {
                Some(("*", sub)) => sub == r.subresource,
                Some((res, sub)) => res == r.resource && sub == r.subresource,
                None => false,
            }
        })
    }

    /// Whether the rule allows a resource request.
    pub fn allows_resource(&self, verb: &str, r: &ResourceAttrs<'_>) -> bool {
        self.verb_matches(verb)
            && self.api_groups.iter().any(|g| g == "*" || g == r.group)
            && self.resource_matches(r)
            && (self.resource_names.is_empty() || self.resource_names.iter().any(|n| n == r.name))
    }

    /// Whether the rule allows a non-resource request (`/x/*` covers everything under `/x/`).
    pub fn allows_path(&self, verb: &str, path: &str) -> bool {
        self.verb_matches(verb)
            && self.non_resource_urls.iter().any(|u| {
                u == "*" || u == path || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
            })
    }

    pub fn allows(&self, verb: &str, attrs: &Attributes<'_>) -> bool {
        match attrs.resource() {
            Some(r) => self.allows_resource(verb, &r),
            None => match attrs.request {
                super::Request::NonResource(p) => self.allows_path(verb, p),
                _ => false,
            },
        }
    }
}

/// Which role a binding grants.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum RoleRef {
    ClusterRole(String),
    /// A Role of the binding's namespace.
    Role(String),
}

/// Bindings by subject: users (service accounts as their user names) and groups.
#[derive(Default, Debug)]
struct SubjectIndex {
    users: HashMap<String, Vec<RoleRef>>,
    groups: HashMap<String, Vec<RoleRef>>,
}

impl SubjectIndex {
    fn add(&mut self, binding: &Value, binding_ns: &str) {
        let role = match (
            binding.pointer("/roleRef/kind").and_then(Value::as_str),
            binding.pointer("/roleRef/name").and_then(Value::as_str),
        ) {
            (Some("ClusterRole"), Some(n)) => RoleRef::ClusterRole(n.to_string()),
            (Some("Role"), Some(n)) if !binding_ns.is_empty() => RoleRef::Role(n.to_string()),
            _ => return,
        };
        for s in binding
            .get("subjects")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = s.get("name").and_then(Value::as_str).unwrap_or("");
            match s.get("kind").and_then(Value::as_str) {
                Some("User") => self.users.entry(name.to_string()),
                Some("Group") => self.groups.entry(name.to_string()),
                Some("ServiceAccount") => {
                    let ns = match s.get("namespace").and_then(Value::as_str) {
                        Some(ns) if !ns.is_empty() => ns,
                        _ => binding_ns,
                    };
                    self.users
                        .entry(format!("system:serviceaccount:{ns}:{name}"))
                }
                _ => continue,
            }
            .or_default()
            .push(role.clone());
        }
    }

    /// Every role bound to the user or one of its groups.
    fn roles_of<'a>(&'a self, user: &'a User) -> impl Iterator<Item = &'a RoleRef> + 'a {
        let by_user = self.users.get(&user.name).into_iter().flatten();
        let by_group = user
            .groups
            .iter()
            .filter_map(|g| self.groups.get(g))
            .flatten();
        by_user.chain(by_group)
    }
}

/// The RBAC objects, indexed for decisions.
#[derive(Default, Debug)]
pub struct Index {
    cluster_roles: HashMap<String, Vec<Rule>>,
    /// Roles by (namespace, name).
    roles: HashMap<(String, String), Vec<Rule>>,
    cluster_bindings: SubjectIndex,
    /// RoleBindings per namespace.
    bindings: HashMap<String, SubjectIndex>,
}

fn rules_of(obj: &Value) -> Vec<Rule> {
    obj.get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(Rule::from_json)
        .collect()
}

fn meta<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

impl Index {
    pub fn build(store: &dyn Store) -> Index {
        let mut ix = Index::default();
        let list = |plural: &str| {
            store
                .list(&format!("{PREFIX}{plural}/"))
                .map(|(items, _)| items)
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, plural, "RBAC authorizer cannot list");
                    Vec::new()
                })
        };
        for r in list("clusterroles") {
            ix.cluster_roles
                .insert(meta(&r.object, "name").to_string(), rules_of(&r.object));
        }
        for r in list("roles") {
            let key = (
                meta(&r.object, "namespace").to_string(),
                meta(&r.object, "name").to_string(),
            );
            ix.roles.insert(key, rules_of(&r.object));
        }
        for b in list("clusterrolebindings") {
            ix.cluster_bindings.add(&b.object, "");
        }
        for b in list("rolebindings") {
            let ns = meta(&b.object, "namespace").to_string();
            ix.bindings
                .entry(ns.clone())
                .or_default()
                .add(&b.object, &ns);
        }
        ix
    }

    fn rules(&self, role: &RoleRef, ns: &str) -> &[Rule] {
        let found = match role {
            RoleRef::ClusterRole(n) => self.cluster_roles.get(n),
            RoleRef::Role(n) => self.roles.get(&(ns.to_string(), n.clone())),
        };
        found.map(Vec::as_slice).unwrap_or(&[])
    }

    /// Every rule the user holds in `namespace` ("" for the cluster scope only):
    /// ClusterRoleBindings everywhere, the namespace's RoleBindings there.
    pub fn rules_for<'a>(&'a self, user: &'a User, namespace: &'a str) -> Vec<&'a Rule> {
        let mut out: Vec<&Rule> = self
            .cluster_bindings
            .roles_of(user)
            .flat_map(|r| self.rules(r, ""))
            .collect();
        if !namespace.is_empty()
            && let Some(b) = self.bindings.get(namespace)
        {
            out.extend(b.roles_of(user).flat_map(|r| self.rules(r, namespace)));
        }
        out
    }

    /// Whether any rule bound to the user allows the request.
    pub fn allows(&self, user: &User, attrs: &Attributes<'_>) -> bool {
        let verb = attrs.verb;
        let ns = attrs.resource().map(|r| r.namespace).unwrap_or("");
        let allowed = |role: &RoleRef, role_ns: &str| {
            self.rules(role, role_ns)
                .iter()
                .any(|rule| rule.allows(verb, attrs))
        };
        if self.cluster_bindings.roles_of(user).any(|r| allowed(r, "")) {
            return true;
        }
        !ns.is_empty()
            && self
                .bindings
                .get(ns)
                .is_some_and(|b| b.roles_of(user).any(|r| allowed(r, ns)))
    }
}

struct Cache {
    index: Arc<Index>,
    changes: Option<Receiver<Arc<Event>>>,
}

/// The authorizer: the index and the watch that says when to rebuild it.
pub struct RbacAuthorizer {
    store: Arc<dyn Store>,
    cache: Mutex<Cache>,
}

impl RbacAuthorizer {
    pub fn new(store: Arc<dyn Store>) -> RbacAuthorizer {
        RbacAuthorizer {
            store,
            cache: Mutex::new(Cache {
                index: Arc::new(Index::default()),
                changes: None,
            }),
        }
    }

    /// The current index, rebuilt first when an RBAC object changed since the last build.
    pub fn index(&self) -> Arc<Index> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let stale = match &mut cache.changes {
            None => true,
            Some(rx) => {
                let mut changed = false;
                loop {
                    match rx.try_recv() {
                        Ok(_) => changed = true,
                        Err(TryRecvError::Empty) => break changed,
                        // Dropped for falling behind: start over from the store.
                        Err(TryRecvError::Disconnected) => {
                            cache.changes = None;
                            break true;
                        }
                    }
                }
            }
        };
        if stale {
            // Subscribe before listing so no change between the two is missed.
            if cache.changes.is_none() {
                let rev = self.store.revision();
                cache.changes = self.store.watch(PREFIX, rev).ok();
            }
            cache.index = Arc::new(Index::build(self.store.as_ref()));
        }
        cache.index.clone()
    }

    pub fn authorize(&self, user: &User, attrs: &Attributes<'_>) -> Decision {
        if self.index().allows(user, attrs) {
            Decision::Allow
        } else {
            Decision::NoOpinion(String::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Request;
    use super::*;
    use serde_json::json;

    fn rule(v: Value) -> Rule {
        Rule::from_json(&v)
    }

    fn res<'a>(
        group: &'a str,
        resource: &'a str,
        sub: &'a str,
        name: &'a str,
    ) -> ResourceAttrs<'a> {
        ResourceAttrs {
            group,
            resource,
            subresource: sub,
            namespace: "ns",
            name,
        }
    }

    #[test]
    fn resource_rules_match_as_upstream() {
        let pods =
            rule(json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}));
        let star_sub = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*/scale"]}));
        let logs = rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}));
        let named = rule(
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": ["cluster-info"]}),
        );
        let all = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        let table: &[(&Rule, &str, ResourceAttrs<'_>, bool)] = &[
            (&pods, "get", res("", "pods", "", "x"), true),
            (&pods, "list", res("", "pods", "", ""), true),
            (&pods, "delete", res("", "pods", "", "x"), false),
            (&pods, "get", res("apps", "pods", "", "x"), false),
            (&pods, "get", res("", "pods", "log", "x"), false),
            (&logs, "get", res("", "pods", "log", "x"), true),
            (&logs, "get", res("", "pods", "", "x"), false),
            (
                &star_sub,
                "update",
                res("apps", "deployments", "scale", "d"),
                true,
            ),
            (
                &star_sub,
                "update",
                res("apps", "deployments", "", "d"),
                false,
            ),
            (
                &named,
                "get",
                res("", "configmaps", "", "cluster-info"),
                true,
            ),
            (&named, "get", res("", "configmaps", "", "other"), false),
            (&named, "get", res("", "configmaps", "", ""), false),
            (
                &all,
                "escalate",
                res("rbac.authorization.k8s.io", "roles", "", "r"),
                true,
            ),
            (&all, "get", res("", "pods", "exec", "x"), true),
        ];
        for (i, (r, verb, attrs, want)) in table.iter().enumerate() {
            assert_eq!(r.allows_resource(verb, attrs), *want, "row {i}");
        }
    }

    #[test]
    fn non_resource_rules_match_as_upstream() {
        let r =
            rule(json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/apis/*", "/version"]}));
        let table = [
            ("get", "/healthz", true),
            ("get", "/healthz/etcd", false),
            ("get", "/apis/apps/v1", true),
            ("get", "/apis", false),
            ("post", "/version", false),
        ];
        for (verb, path, want) in table {
            assert_eq!(r.allows_path(verb, path), want, "{verb} {path}");
        }
        assert!(rule(json!({"verbs": ["*"], "nonResourceURLs": ["*"]})).allows_path("put", "/x"));
        let pods = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        assert!(!pods.allows_path("get", "/healthz"));
    }

    #[test]
    fn bindings_grant_roles_to_users_groups_and_service_accounts() {
        let mut ix = Index::default();
        ix.cluster_roles.insert(
            "view".into(),
            vec![rule(
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}),
            )],
        );
        ix.roles.insert(
            ("dev".into(), "cm".into()),
            vec![rule(
                json!({"verbs": ["list"], "apiGroups": [""], "resources": ["configmaps"]}),
            )],
        );
        ix.cluster_bindings.add(
            &json!({"roleRef": {"kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "Group", "name": "viewers"}]}),
            "",
        );
        let mut dev = SubjectIndex::default();
        dev.add(
            &json!({"roleRef": {"kind": "Role", "name": "cm"},
                "subjects": [{"kind": "ServiceAccount", "name": "bot"}, {"kind": "User", "name": "ann"}]}),
            "dev",
        );
        ix.bindings.insert("dev".into(), dev);
        let user = |name: &str, groups: &[&str]| User {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        };
        let t = |verb: &'static str, resource: &'static str, ns: &'static str| Attributes {
            verb,
            request: Request::Named(ResourceAttrs {
                group: "",
                resource,
                subresource: "",
                namespace: ns,
                name: "",
            }),
            body: None,
            field_selector: None,
        };
        assert!(ix.allows(&user("bob", &["viewers"]), &t("get", "pods", "any")));
        assert!(!ix.allows(&user("bob", &[]), &t("get", "pods", "any")));
        let bot = user("system:serviceaccount:dev:bot", &["system:serviceaccounts"]);
        assert!(ix.allows(&bot, &t("list", "configmaps", "dev")));
        assert!(!ix.allows(&bot, &t("list", "configmaps", "prod")));
        assert!(!ix.allows(&bot, &t("list", "configmaps", "")));
        assert!(ix.allows(&user("ann", &[]), &t("list", "configmaps", "dev")));
    }
}
