//! Field sets: which fields of an object one manager owns, as a tree of path elements, in
//! upstream's `FieldsV1` encoding (structured-merge-diff's `fieldpath.Set`).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    /// A field of a map or struct: `f:<name>`.
    Field(String),
    /// An item of a keyed (`map`) list, by its key fields as canonical JSON: `k:{"name":"x"}`.
    Key(String),
    /// A member of a `set` list, as JSON: `v:"value"`.
    Value(String),
}

impl PathElement {
    /// The `FieldsV1` key of this element.
    pub fn encode(&self) -> String {
        match self {
            PathElement::Field(n) => format!("f:{n}"),
            PathElement::Key(k) => format!("k:{k}"),
            PathElement::Value(v) => format!("v:{v}"),
        }
    }

    /// Parses a `FieldsV1` key (`.` is handled by the caller).
    pub fn decode(s: &str) -> Result<Self, String> {
        let (prefix, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("invalid path element {s:?}: no prefix"))?;
        match prefix {
            "f" => Ok(PathElement::Field(rest.to_string())),
            "k" | "v" => {
                // Re-serialised so that equal keys compare equal whatever the client's spacing.
                let v: Value = serde_json::from_str(rest)
                    .map_err(|e| format!("invalid path element {s:?}: {e}"))?;
                if prefix == "k" {
                    if !v.is_object() {
                        return Err(format!("invalid path element {s:?}: key is not an object"));
                    }
                    Ok(PathElement::Key(v.to_string()))
                } else {
                    Ok(PathElement::Value(v.to_string()))
                }
            }
            _ => Err(format!(
                "invalid path element {s:?}: unknown prefix {prefix:?}"
            )),
        }
    }

    /// The element as upstream prints paths in conflicts: `.name`, `[name="x"]`, `[=v]`.
    pub fn display(&self) -> String {
        match self {
            PathElement::Field(n) => format!(".{n}"),
            PathElement::Key(k) => {
                let fields = match serde_json::from_str::<Value>(k) {
                    Ok(Value::Object(m)) => m
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                    _ => k.clone(),
                };
                format!("[{fields}]")
            }
            PathElement::Value(v) => format!("[={v}]"),
        }
    }
}

/// A path as upstream prints it, e.g. `.spec.template.spec.containers[name="app"].image`.
pub fn path_string(path: &[PathElement]) -> String {
    path.iter().map(PathElement::display).collect()
}

/// A set of field paths, as a tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    children: BTreeMap<PathElement, Node>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Node {
    /// The path to this element is itself in the set (a leaf, a list item, `.`).
    member: bool,
    set: FieldSet,
}

impl FieldSet {
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Adds `el` as a member (a leaf or an item).
    pub fn insert(&mut self, el: PathElement) {
        self.children.entry(el).or_default().member = true;
    }

    /// The subtree below `el`, created if absent. Empty subtrees are dropped by
    /// [`FieldSet::prune_empty`] (called by the set operations).
    pub fn child_mut(&mut self, el: PathElement) -> &mut FieldSet {
        &mut self.children.entry(el).or_default().set
    }

    /// The subtree below `el` (empty if none).
    pub fn child(&self, el: &PathElement) -> Option<&FieldSet> {
        self.children.get(el).map(|n| &n.set)
    }

    /// Whether `el` itself is a member.
    pub fn has_member(&self, el: &PathElement) -> bool {
        self.children.get(el).is_some_and(|n| n.member)
    }

    /// Each element at this level: (element, is member, subtree).
    pub fn entries(&self) -> impl Iterator<Item = (&PathElement, bool, &FieldSet)> {
        self.children.iter().map(|(k, n)| (k, n.member, &n.set))
    }

    /// Removes `el` and everything below it.
    pub fn remove(&mut self, el: &PathElement) {
        self.children.remove(el);
    }

    fn prune_empty(&mut self) {
        self.children.retain(|_, n| {
            n.set.prune_empty();
            n.member || !n.set.is_empty()
        });
    }

    pub fn union(&mut self, other: &FieldSet) {
        for (k, n) in &other.children {
            let mine = self.children.entry(k.clone()).or_default();
            mine.member |= n.member;
            mine.set.union(&n.set);
        }
    }

    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::default();
        for (k, n) in &self.children {
            let (member, set) = match other.children.get(k) {
                None => (n.member, n.set.clone()),
                Some(o) => (n.member && !o.member, n.set.difference(&o.set)),
            };
            if member || !set.is_empty() {
                out.children.insert(k.clone(), Node { member, set });
            }
        }
        out
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::default();
        for (k, n) in &self.children {
            if let Some(o) = other.children.get(k) {
                let member = n.member && o.member;
                let set = n.set.intersection(&o.set);
                if member || !set.is_empty() {
                    out.children.insert(k.clone(), Node { member, set });
                }
            }
        }
        out
    }

    /// Every member path, depth first in element order.
    pub fn paths(&self) -> Vec<Vec<PathElement>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Vec<PathElement>>) {
        for (k, n) in &self.children {
            prefix.push(k.clone());
            if n.member {
                out.push(prefix.clone());
            }
            n.set.collect(prefix, out);
            prefix.pop();
        }
    }

    /// The `FieldsV1` JSON: `{"f:spec":{"f:replicas":{}}}`, `.` marking a member with children.
    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        for (k, n) in &self.children {
            let mut inner = match n.set.to_fields_v1() {
                Value::Object(o) => o,
                _ => Map::new(),
            };
            if n.member && !inner.is_empty() {
                inner.insert(".".into(), Value::Object(Map::new()));
            }
            m.insert(k.encode(), Value::Object(inner));
        }
        Value::Object(m)
    }

    /// Parses `FieldsV1` JSON.
    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, String> {
        let Value::Object(m) = v else {
            return Err("fieldsV1 is not an object".into());
        };
        let mut out = FieldSet::default();
        for (k, inner) in m {
            if k == "." {
                continue;
            }
            let el = PathElement::decode(k)?;
            let set = FieldSet::from_fields_v1(inner)?;
            let member = set.is_empty() || inner.as_object().is_some_and(|o| o.contains_key("."));
            out.children.insert(el, Node { member, set });
        }
        out.prune_empty();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(n: &str) -> PathElement {
        PathElement::Field(n.into())
    }

    #[test]
    fn fields_v1_round_trips_and_orders_like_upstream() {
        let cases = [
            json!({"f:spec": {"f:replicas": {}}}),
            json!({"f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}}}}),
            json!({"f:metadata": {"f:finalizers": {"v:\"a\"": {}, "v:\"b\"": {}}}}),
            json!({"f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}}}),
            json!({}),
        ];
        for c in cases {
            let s = FieldSet::from_fields_v1(&c).unwrap();
            assert_eq!(s.to_fields_v1(), c);
        }
    }

    #[test]
    fn decode_rejects_bad_elements() {
        for (bad, want) in [
            (json!({"x:y": {}}), "unknown prefix"),
            (json!({"nocolon": {}}), "no prefix"),
            (json!({"k:[1]": {}}), "key is not an object"),
            (json!({"v:{": {}}), "invalid path element"),
            (json!([]), "not an object"),
        ] {
            let err = FieldSet::from_fields_v1(&bad).unwrap_err();
            assert!(err.contains(want), "{bad}: {err}");
        }
    }

    #[test]
    fn set_operations() {
        let a =
            FieldSet::from_fields_v1(&json!({"f:a": {}, "f:b": {"f:c": {}, "f:d": {}}})).unwrap();
        let b = FieldSet::from_fields_v1(&json!({"f:b": {"f:c": {}}, "f:e": {}})).unwrap();
        let table = [
            (a.difference(&b), json!({"f:a": {}, "f:b": {"f:d": {}}})),
            (a.intersection(&b), json!({"f:b": {"f:c": {}}})),
            (
                {
                    let mut u = a.clone();
                    u.union(&b);
                    u
                },
                json!({"f:a": {}, "f:b": {"f:c": {}, "f:d": {}}, "f:e": {}}),
            ),
            (b.difference(&b), json!({})),
        ];
        for (got, want) in table {
            assert_eq!(got.to_fields_v1(), want);
        }
    }

    #[test]
    fn paths_print_as_upstream() {
        let s = FieldSet::from_fields_v1(&json!({
            "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"app\"}": {"f:image": {}}}}},
                "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {}}},
            "f:metadata": {"f:finalizers": {"v:\"x\"": {}}}
        }))
        .unwrap();
        let got: Vec<String> = s.paths().iter().map(|p| path_string(p)).collect();
        assert_eq!(
            got,
            vec![
                ".metadata.finalizers[=\"x\"]",
                ".spec.ports[containerPort=80,protocol=\"TCP\"]",
                ".spec.replicas",
                ".spec.template.spec.containers[name=\"app\"].image",
            ]
        );
        assert_eq!(path_string(&[f("a"), f("b")]), ".a.b");
    }
}
