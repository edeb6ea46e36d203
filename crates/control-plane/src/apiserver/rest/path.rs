//! Request paths: which resource, namespace, name and subresource a URL names.

use nodus_k8s::catalog::{self, ResourceInfo};

/// A parsed resource URL.
#[derive(Clone, Debug)]
pub struct Target {
    pub info: &'static ResourceInfo,
    /// The namespace of the URL (`None` for cluster-scoped or all-namespaces requests).
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
    /// The legacy `/watch/` path form.
    pub watch_path: bool,
    /// Path segments after the subresource (`nodes/x/proxy/<rest>`).
    pub rest: Vec<String>,
}

/// Where a path points.
#[derive(Debug)]
pub enum Parsed {
    Resource(Target),
    /// An API path naming no known resource.
    NotFound,
}

/// The storage key prefix of a group: `core` for the empty group.
pub fn group_key(group: &str) -> &str {
    if group.is_empty() { "core" } else { group }
}

impl Target {
    /// The storage key of the object `name` in this target's namespace.
    pub fn key_for(&self, name: &str) -> String {
        key(self.info, self.namespace.as_deref(), name)
    }

    /// The storage prefix listing this target (one namespace or all).
    pub fn prefix(&self) -> String {
        prefix(self.info, self.namespace.as_deref())
    }

    pub fn gvk(&self) -> nodus_k8s::Gvk {
        self.info.gvk()
    }
}

/// The storage group of a resource: events.k8s.io Events share the core Events' keys.
fn storage_group(info: &ResourceInfo) -> &str {
    if info.group == "events.k8s.io" && info.plural == "events" {
        "core"
    } else {
        group_key(info.group)
    }
}

pub fn key(info: &ResourceInfo, ns: Option<&str>, name: &str) -> String {
    match (info.namespaced, ns) {
        (true, Some(ns)) => format!("/{}/{}/{}/{}", storage_group(info), info.plural, ns, name),
        _ => format!("/{}/{}/{}", storage_group(info), info.plural, name),
    }
}

pub fn prefix(info: &ResourceInfo, ns: Option<&str>) -> String {
    match (info.namespaced, ns) {
        (true, Some(ns)) => format!("/{}/{}/{}/", storage_group(info), info.plural, ns),
        _ => format!("/{}/{}/", storage_group(info), info.plural),
    }
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...`.
pub fn parse(path: &str) -> Parsed {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Parsed::NotFound,
    };
    let (watch_path, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let find = |plural: &str| catalog::by_plural(group, version, plural);
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, r @ ..] if find(plural).is_some_and(|i| i.namespaced) => {
            let _ = r;
            (Some(ns.to_string()), &rest[2..])
        }
        r => (None, r),
    };
    let Some((plural, rest)) = rest.split_first() else {
        return Parsed::NotFound;
    };
    let Some(info) = find(plural) else {
        return Parsed::NotFound;
    };
    let name = rest.first().map(|s| s.to_string());
    let sub = rest.get(1).map(|s| s.to_string());
    if let Some(s) = &sub
        && !info.subresources.contains(&s.as_str())
    {
        return Parsed::NotFound;
    }
    Parsed::Resource(Target {
        info,
        namespace,
        name,
        sub,
        watch_path,
        rest: rest.iter().skip(2).map(|s| s.to_string()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(p: &str) -> Target {
        match parse(p) {
            Parsed::Resource(t) => t,
            Parsed::NotFound => panic!("{p} not found"),
        }
    }

    #[test]
    fn paths_name_resources_namespaces_and_subresources() {
        let a = t("/api/v1/namespaces/default/pods/x/status");
        assert_eq!(
            (
                a.info.plural,
                a.namespace.as_deref(),
                a.name.as_deref(),
                a.sub.as_deref()
            ),
            ("pods", Some("default"), Some("x"), Some("status"))
        );
        let b = t("/api/v1/namespaces/kube-system");
        assert_eq!(
            (b.info.plural, b.name.as_deref()),
            ("namespaces", Some("kube-system"))
        );
        let c = t("/api/v1/namespaces/foo/finalize");
        assert_eq!(
            (c.name.as_deref(), c.sub.as_deref()),
            (Some("foo"), Some("finalize"))
        );
        let d = t("/apis/apps/v1/watch/namespaces/default/deployments");
        assert!(d.watch_path);
        assert_eq!(d.prefix(), "/apps/deployments/default/");
        let e = t("/api/v1/pods");
        assert_eq!(e.prefix(), "/core/pods/");
        assert_eq!(t("/api/v1/nodes/n1").key_for("n1"), "/core/nodes/n1");
        assert!(matches!(parse("/api/v1/nopes"), Parsed::NotFound));
    }
}
