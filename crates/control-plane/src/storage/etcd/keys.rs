//! Upstream's etcd key layout: the store's `/<group>/<resource>/[<ns>/]<name>` keys become
//! `<prefix>/<resource>/[<ns>/]<name>` for the core group (kube-apiserver's
//! `/registry/pods/default/web`) and `<prefix>/<group>/<resource>/…` for the others, as
//! upstream lays out custom resources, so two groups' resources of one name never share keys.

/// The store group of the core API.
const CORE: &str = "core";

/// Maps store keys to etcd keys under one `--etcd-prefix` and back.
#[derive(Clone, Debug)]
pub(crate) struct KeyLayout {
    /// Without a trailing slash: `/registry`.
    prefix: String,
}

/// A group segment as opposed to a core resource: named groups have a dot, except the
/// legacy dotless ones (no core resource is named like them).
fn is_group(segment: &str) -> bool {
    segment.contains('.')
        || matches!(
            segment,
            "apps" | "batch" | "autoscaling" | "policy" | "extensions"
        )
}

impl KeyLayout {
    pub(crate) fn new(prefix: &str) -> KeyLayout {
        let p = prefix.trim_end_matches('/');
        let prefix = if p.starts_with('/') || p.is_empty() {
            p.to_string()
        } else {
            format!("/{p}")
        };
        KeyLayout { prefix }
    }

    /// The etcd key of the store key `key`.
    pub(crate) fn etcd_key(&self, key: &str) -> String {
        let rest = key.strip_prefix('/').unwrap_or(key);
        match rest.split_once('/') {
            Some((CORE, tail)) => format!("{}/{tail}", self.prefix),
            Some(_) => format!("{}/{rest}", self.prefix),
            // A bare first segment: part of a group name, so everything under the prefix.
            None => format!("{}/", self.prefix),
        }
    }

    /// The etcd key range `[start, end)` holding every store key under `prefix`; it may
    /// hold more (a partial group segment), so callers also check each key mapped back.
    pub(crate) fn range(&self, prefix: &str) -> (Vec<u8>, Vec<u8>) {
        let start = self.etcd_key(prefix).into_bytes();
        let end = prefix_end(&start);
        (start, end)
    }

    /// The store key of an etcd key, None for keys under the prefix this layout never
    /// writes.
    pub(crate) fn store_key(&self, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix('/')?;
        let (first, _) = rest.split_once('/')?;
        if is_group(first) {
            Some(format!("/{rest}"))
        } else {
            Some(format!("/{CORE}/{rest}"))
        }
    }
}

/// The smallest key after every key starting with `prefix` (etcd's prefix range end).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): every key from the prefix on.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_upstream_layout_and_map_back() {
        let l = KeyLayout::new("/registry");
        for (store, etcd) in [
            ("/core/pods/default/web", "/registry/pods/default/web"),
            ("/core/nodes/n1", "/registry/nodes/n1"),
            ("/apps/deployments/ns/d", "/registry/apps/deployments/ns/d"),
            (
                "/rbac.authorization.k8s.io/clusterroles/admin",
                "/registry/rbac.authorization.k8s.io/clusterroles/admin",
            ),
        ] {
            assert_eq!(l.etcd_key(store), etcd);
            assert_eq!(l.store_key(etcd.as_bytes()).as_deref(), Some(store));
        }
        assert_eq!(l.etcd_key("/"), "/registry/");
        assert_eq!(l.etcd_key("/core/pods/"), "/registry/pods/");
        assert_eq!(l.store_key(b"/other/pods/a"), None);
        assert_eq!(
            KeyLayout::new("custom/").etcd_key("/core/pods/a/b"),
            "/custom/pods/a/b"
        );
        assert_eq!(prefix_end(b"/registry/"), b"/registry0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
    }
}
