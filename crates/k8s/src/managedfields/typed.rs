//! The object walks server-side apply needs, typed by the schema upstream publishes as
//! OpenAPI extensions (`x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
//! `x-kubernetes-map-type`): which lists are keyed maps, which are sets, which are atomic.
//! The list keys come from the strategic-merge metadata ([`crate::patch::schema`]); lists
//! and structs it does not name are atomic and granular respectively, upstream's defaults.

use serde_json::{Map, Value};

use super::fieldset::{FieldSet, PathElement};
use crate::patch::schema::{Ty, lookup};

/// How a list merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListType {
    /// Replaced whole, owned as one leaf.
    Atomic,
    /// Items identified by these key fields (`x-kubernetes-list-type: map`).
    Map(&'static str, Option<&'static str>),
    /// Scalars identified by value (`x-kubernetes-list-type: set`).
    Set,
}

/// What the schema says of one field.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field {
    /// The type of the field's value, or of a list's items.
    pub ty: Ty,
    pub list: ListType,
    /// A struct or map replaced whole (`x-kubernetes-map-type: atomic`).
    pub atomic: bool,
}

pub(crate) fn field(ty: Ty, name: &str) -> Field {
    let m = lookup(ty, name);
    let list = match (ty, name, m.key) {
        // Upstream keys ports by port and protocol, where strategic merge uses the port.
        (Ty::Container, "ports", _) => ListType::Map("containerPort", Some("protocol")),
        (Ty::ServiceSpec, "ports", _) => ListType::Map("port", Some("protocol")),
        (_, _, Some(k)) => ListType::Map(k, None),
        (_, _, None) if m.merge => ListType::Set,
        _ => ListType::Atomic,
    };
    // LabelSelector is `+structType=atomic`.
    let atomic = matches!((ty, name), (Ty::WorkloadSpec, "selector"));
    Field {
        ty: m.ty,
        list,
        atomic,
    }
}

/// The `k:` element of a keyed list's item; `None` when the item lacks its key (the
/// list is then treated as atomic). `protocol` defaults to TCP as upstream's schema says.
pub(crate) fn item_key(item: &Value, list: ListType) -> Option<PathElement> {
    let ListType::Map(first, second) = list else {
        return None;
    };
    let o = item.as_object()?;
    let mut key = Map::new();
    key.insert(first.into(), o.get(first).filter(|v| !v.is_null())?.clone());
    if let Some(second) = second {
        match o.get(second).filter(|v| !v.is_null()) {
            Some(v) => {
                key.insert(second.into(), v.clone());
            }
            None if second == "protocol" => {
                key.insert(second.into(), Value::String("TCP".into()));
            }
            None => {}
        }
    }
    Some(PathElement::Key(Value::Object(key).to_string()))
}

fn all_keyed(items: &[Value], list: ListType) -> bool {
    items.iter().all(|i| item_key(i, list).is_some())
}

/// Every field an object sets: its leaves (scalars, atomic lists and structs, empty maps)
/// and the items of its keyed and set lists.
pub(crate) fn fields_of(obj: &Map<String, Value>, ty: Ty) -> FieldSet {
    let mut out = FieldSet::default();
    for (k, v) in obj {
        if v.is_null() {
            continue;
        }
        let el = PathElement::Field(k.clone());
        match value_fields(v, field(ty, k)) {
            Some(sub) if !sub.is_empty() => out.child_mut(el).union(&sub),
            _ => out.insert(el),
        }
    }
    out
}

/// The fields below a value, or `None` when the value is itself a leaf.
fn value_fields(v: &Value, f: Field) -> Option<FieldSet> {
    match v {
        Value::Object(m) if !f.atomic && !m.is_empty() => Some(fields_of(m, f.ty)),
        Value::Array(items) if !items.is_empty() => match f.list {
            ListType::Map(..) if all_keyed(items, f.list) => {
                let mut s = FieldSet::default();
                for item in items {
                    let key = item_key(item, f.list)?;
                    s.insert(key.clone());
                    if let Value::Object(m) = item {
                        s.child_mut(key).union(&fields_of(m, f.ty));
                    }
                }
                Some(s)
            }
            ListType::Set => {
                let mut s = FieldSet::default();
                for item in items {
                    s.insert(PathElement::Value(item.to_string()));
                }
                Some(s)
            }
            _ => None,
        },
        _ => None,
    }
}

/// The fields `new` adds or changes relative to `old`.
pub(crate) fn changed(
    old: Option<&Map<String, Value>>,
    new: &Map<String, Value>,
    ty: Ty,
) -> FieldSet {
    let mut out = FieldSet::default();
    for (k, nv) in new {
        if nv.is_null() {
            continue;
        }
        let ov = old.and_then(|o| o.get(k)).filter(|v| !v.is_null());
        if ov == Some(nv) {
            continue;
        }
        let f = field(ty, k);
        let el = PathElement::Field(k.clone());
        let sub = match (ov, nv) {
            (Some(Value::Object(om)), Value::Object(nm)) if !f.atomic => {
                Some(changed(Some(om), nm, f.ty))
            }
            (None, _) => value_fields(nv, f),
            (Some(Value::Array(oitems)), Value::Array(nitems))
                if f.list != ListType::Atomic
                    && all_keyed(nitems, f.list)
                    && all_keyed(oitems, f.list) =>
            {
                Some(list_changed(oitems, nitems, f))
            }
            _ => None,
        };
        match sub {
            Some(s) if !s.is_empty() => out.child_mut(el).union(&s),
            // Only removals below: nothing added or changed here.
            Some(_) if ov.is_some() => {}
            _ => out.insert(el),
        }
    }
    out
}

fn list_changed(old: &[Value], new: &[Value], f: Field) -> FieldSet {
    let mut s = FieldSet::default();
    for item in new {
        match f.list {
            ListType::Set => {
                if !old.contains(item) {
                    s.insert(PathElement::Value(item.to_string()));
                }
            }
            _ => {
                let Some(key) = item_key(item, f.list) else {
                    continue;
                };
                let prev = old
                    .iter()
                    .find(|o| item_key(o, f.list).as_ref() == Some(&key));
                match (prev, item) {
                    (Some(p), _) if p == item => {}
                    (Some(Value::Object(pm)), Value::Object(im)) => {
                        let sub = changed(Some(pm), im, f.ty);
                        if !sub.is_empty() {
                            s.child_mut(key).union(&sub);
                        }
                    }
                    _ => {
                        s.insert(key.clone());
                        if let Value::Object(m) = item {
                            s.child_mut(key).union(&fields_of(m, f.ty));
                        }
                    }
                }
            }
        }
    }
    s
}

/// Merges an applied configuration into `live`: maps and keyed lists granularly,
/// set lists by union, everything else replaced.
pub(crate) fn merge_map(live: &mut Map<String, Value>, applied: &Map<String, Value>, ty: Ty) {
    for (k, av) in applied {
        if av.is_null() {
            continue;
        }
        let f = field(ty, k);
        match live.get_mut(k) {
            Some(lv) => merge_value(lv, av, f),
            None => {
                live.insert(k.clone(), strip_nulls(av));
            }
        }
    }
}

fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

fn merge_value(lv: &mut Value, av: &Value, f: Field) {
    if let (Value::Object(lm), Value::Object(am)) = (&mut *lv, av)
        && !f.atomic
    {
        merge_map(lm, am, f.ty);
        return;
    }
    if let (Value::Array(litems), Value::Array(aitems)) = (&mut *lv, av) {
        match f.list {
            ListType::Set => {
                for a in aitems {
                    if !litems.contains(a) {
                        litems.push(a.clone());
                    }
                }
                return;
            }
            ListType::Map(..) if all_keyed(aitems, f.list) && all_keyed(litems, f.list) => {
                let item_field = Field {
                    ty: f.ty,
                    list: ListType::Atomic,
                    atomic: false,
                };
                for a in aitems {
                    let key = item_key(a, f.list);
                    match litems.iter_mut().find(|l| item_key(l, f.list) == key) {
                        Some(l) => merge_value(l, a, item_field),
                        None => litems.push(strip_nulls(a)),
                    }
                }
                return;
            }
            _ => {}
        }
    }
    *lv = strip_nulls(av);
}

/// Removes the fields of `remove` from `obj`, except where `keep` (what other managers
/// own) still has something at or below a field.
pub(crate) fn prune_map(
    obj: &mut Map<String, Value>,
    remove: &FieldSet,
    keep: Option<&FieldSet>,
    ty: Ty,
) {
    for (el, member, sub) in remove.entries() {
        let PathElement::Field(k) = el else {
            continue;
        };
        let keep_sub = keep.and_then(|s| s.child(el)).filter(|s| !s.is_empty());
        if member && keep_sub.is_none() {
            obj.remove(k);
            continue;
        }
        let f = field(ty, k);
        let emptied = match obj.get_mut(k) {
            Some(Value::Object(m)) => {
                prune_map(m, sub, keep_sub, f.ty);
                m.is_empty()
            }
            Some(Value::Array(items)) => {
                prune_list(items, sub, keep_sub, f);
                items.is_empty()
            }
            _ => false,
        };
        // A map or list left empty by the removal, that nobody else owns anything in,
        // goes too rather than lingering as `{}` or `[]`.
        if emptied && keep_sub.is_none() {
            obj.remove(k);
        }
    }
}

fn prune_list(items: &mut Vec<Value>, remove: &FieldSet, keep: Option<&FieldSet>, f: Field) {
    for (el, member, sub) in remove.entries() {
        match el {
            PathElement::Key(_) => {
                let Some(pos) = items
                    .iter()
                    .position(|i| item_key(i, f.list).as_ref() == Some(el))
                else {
                    continue;
                };
                let keep_sub = keep.and_then(|s| s.child(el)).filter(|s| !s.is_empty());
                if member && keep_sub.is_none() {
                    items.remove(pos);
                } else if let Value::Object(m) = &mut items[pos] {
                    prune_map(m, sub, keep_sub, f.ty);
                }
            }
            PathElement::Value(v) if member => {
                if let Ok(member) = serde_json::from_str::<Value>(v) {
                    items.retain(|i| *i != member);
                }
            }
            _ => {}
        }
    }
}
