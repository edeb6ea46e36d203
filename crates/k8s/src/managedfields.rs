//! Managed fields and server-side apply, as kube-apiserver's field manager does them on
//! top of structured-merge-diff: every write records which manager owns which fields
//! (`metadata.managedFields`), an apply merges a partial configuration into the live object,
//! drops the fields its manager applied before and applies no longer (unless another manager
//! owns them) and refuses to change fields another manager owns unless forced.
//!
//! Not done: unions (`x-kubernetes-unions`), atomic maps beyond the label selector, item
//! keys other than the strategic-merge keys (plus upstream's port+protocol), and the
//! version conversion of field sets between API versions.

use serde_json::{Map, Value, json};

mod fieldset;
mod typed;

pub use fieldset::{FieldSet, PathElement, path_string};

use crate::patch::schema::Ty;
use typed::{changed, fields_of, merge_map, prune_map};

/// What produced a managed fields entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One `metadata.managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct ManagedFieldsEntry {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub time: Option<String>,
    pub fields: FieldSet,
    /// Empty for the main resource.
    pub subresource: String,
}

impl ManagedFieldsEntry {
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert("operation".into(), json!(self.operation.as_str()));
        m.insert("apiVersion".into(), json!(self.api_version));
        if let Some(t) = &self.time {
            m.insert("time".into(), json!(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), self.fields.to_fields_v1());
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), json!(self.subresource));
        }
        Value::Object(m)
    }

    fn from_json(v: &Value) -> Result<Self, String> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let operation = match s("operation").as_str() {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            other => return Err(format!("unknown operation {other:?}")),
        };
        let fields = match v.get("fieldsV1") {
            Some(f) => FieldSet::from_fields_v1(f)?,
            None => FieldSet::default(),
        };
        Ok(ManagedFieldsEntry {
            manager: s("manager"),
            operation,
            api_version: s("apiVersion"),
            time: v.get("time").and_then(Value::as_str).map(str::to_string),
            fields,
            subresource: s("subresource"),
        })
    }

    /// Upstream's printManager: `"kubectl" using apps/v1`, with the subresource if any.
    pub fn describe(&self) -> String {
        let mut out = crate::status::go_quote(&self.manager);
        if !self.subresource.is_empty() {
            out.push_str(&format!(
                " with subresource {}",
                crate::status::go_quote(&self.subresource)
            ));
        }
        format!("{out} using {}", self.api_version)
    }
}

/// Who writes, and where.
#[derive(Clone, Copy, Debug)]
pub struct Writer<'a> {
    pub manager: &'a str,
    /// The request's `group/version`.
    pub api_version: &'a str,
    /// `""` for the main resource, `"status"` for the status subresource.
    pub subresource: &'a str,
    /// The write's time (RFC 3339, seconds).
    pub time: &'a str,
}

impl Writer<'_> {
    /// Whether `e` is this writer's entry for `op` (Update entries are per API version).
    fn owns(&self, e: &ManagedFieldsEntry, op: Operation) -> bool {
        e.manager == self.manager
            && e.operation == op
            && e.subresource == self.subresource
            && (op == Operation::Apply || e.api_version == self.api_version)
    }

    fn entry(&self, op: Operation, fields: FieldSet) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: self.manager.to_string(),
            operation: op,
            api_version: self.api_version.to_string(),
            time: Some(self.time.to_string()),
            fields,
            subresource: self.subresource.to_string(),
        }
    }
}

/// The schema root of a kind: built-in kinds by their strategic-merge metadata, others
/// (custom resources) with only ObjectMeta known.
pub fn root_type(gvk: &crate::Gvk) -> Ty {
    crate::patch::root_type(gvk)
}

/// Decodes an object's `metadata.managedFields`. Entries that do not decode make the
/// whole list reset, as upstream does with managed fields it cannot read.
pub fn entries(obj: &Value) -> Vec<ManagedFieldsEntry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .map(ManagedFieldsEntry::from_json)
                .collect::<Result<Vec<_>, _>>()
                .ok()
        })
        .unwrap_or_default()
}

fn set_entries(obj: &mut Value, entries: Vec<ManagedFieldsEntry>) {
    let Some(o) = obj.as_object_mut() else {
        return;
    };
    let meta = o.entry("metadata").or_insert_with(|| json!({}));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(ManagedFieldsEntry::to_json)
        .collect();
    if list.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

fn without_managed_fields(obj: &Value) -> Map<String, Value> {
    let mut o = obj.as_object().cloned().unwrap_or_default();
    if let Some(Value::Object(m)) = o.get_mut("metadata") {
        m.remove("managedFields");
    }
    o
}

/// The fields no manager owns (upstream's stripMeta): identity and server-set metadata.
fn strip_meta(set: &FieldSet) -> FieldSet {
    let mut out = set.clone();
    for k in ["apiVersion", "kind"] {
        out.remove(&PathElement::Field(k.into()));
    }
    let meta = PathElement::Field("metadata".into());
    let mut m = out.child(&meta).cloned().unwrap_or_default();
    for k in [
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "clusterName",
        "generation",
        "managedFields",
        "resourceVersion",
    ] {
        m.remove(&PathElement::Field(k.into()));
    }
    out.remove(&meta);
    if !m.is_empty() {
        out.child_mut(meta).union(&m);
    }
    out
}

/// Records a non-apply write (create, update, patch) of `new` over `old` by `w`: the
/// fields it added or changed move to the writer's Update entry, removed fields leave
/// every entry. Managed fields the client sent that differ from the stored ones replace
/// them first (upstream's way to reset ownership).
pub fn track_update(old: Option<&Value>, new: &mut Value, root: Ty, w: &Writer<'_>) {
    let stored = old.map(entries).unwrap_or_default();
    let sent = new.pointer("/metadata/managedFields").cloned();
    let stored_json = old.and_then(|o| o.pointer("/metadata/managedFields").cloned());
    let mut list = match sent {
        Some(s) if Some(&s) != stored_json.as_ref() => entries(new),
        _ => stored,
    };
    let new_fields = without_managed_fields(new);
    let (added, removed) = match old {
        Some(old) => {
            let old_fields = without_managed_fields(old);
            (
                changed(Some(&old_fields), &new_fields, root),
                fields_of(&old_fields, root).difference(&fields_of(&new_fields, root)),
            )
        }
        None => (fields_of(&new_fields, root), FieldSet::default()),
    };
    let added = strip_meta(&added);
    let removed = strip_meta(&removed);
    for e in list.iter_mut() {
        if !w.owns(e, Operation::Update) {
            e.fields = e.fields.difference(&added).difference(&removed);
        }
    }
    match list.iter_mut().find(|e| w.owns(e, Operation::Update)) {
        // A write that changes nothing keeps the entry's time, as upstream.
        Some(mine) if !added.is_empty() || !removed.is_empty() => {
            mine.fields.union(&added);
            mine.fields = mine.fields.difference(&removed);
            mine.time = Some(w.time.to_string());
        }
        Some(_) => {}
        None if !added.is_empty() => list.push(w.entry(Operation::Update, added)),
        None => {}
    }
    set_entries(new, list);
}

/// One field another manager owns with a different value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The owner as upstream prints it (`"kubectl" using apps/v1`).
    pub manager: String,
    /// The field as upstream prints it (`.spec.replicas`).
    pub field: String,
}

/// An apply refused for conflicts (409).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflicts(pub Vec<Conflict>);

impl Conflicts {
    /// Upstream's message: one conflict on one line, several grouped by manager.
    pub fn message(&self) -> String {
        if let [c] = self.0.as_slice() {
            return format!(
                "Apply failed with 1 conflict: conflict with {}: {}",
                c.manager, c.field
            );
        }
        let mut managers: Vec<&str> = self.0.iter().map(|c| c.manager.as_str()).collect();
        managers.sort();
        managers.dedup();
        let mut lines = Vec::new();
        for m in managers {
            lines.push(format!("conflicts with {m}:"));
            for c in self.0.iter().filter(|c| c.manager == m) {
                lines.push(format!("- {}", c.field));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            self.0.len(),
            lines.join("\n")
        )
    }

    /// `details.causes`: one `FieldManagerConflict` per field.
    pub fn causes(&self) -> Vec<Value> {
        self.0
            .iter()
            .map(|c| {
                json!({"reason": "FieldManagerConflict",
                       "message": format!("conflict with {}", c.manager),
                       "field": c.field})
            })
            .collect()
    }
}

/// Applies `applied` (a partial configuration) for `w` to `live` (absent: the object is
/// being created) and returns the new object with its managed fields. `force` takes the
/// conflicting fields from their owners instead of failing.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    root: Ty,
    w: &Writer<'_>,
    force: bool,
) -> Result<Value, Conflicts> {
    let mut list = live.map(entries).unwrap_or_default();
    let base = live.map(without_managed_fields).unwrap_or_default();
    if live.is_some() && list.is_empty() {
        // An object written before fields were tracked: what it has belongs to a
        // stand-in manager, so the first apply neither conflicts with nor removes it.
        list.push(ManagedFieldsEntry {
            manager: "before-first-apply".into(),
            operation: Operation::Update,
            api_version: w.api_version.to_string(),
            time: Some(w.time.to_string()),
            fields: strip_meta(&fields_of(&base, root)),
            subresource: w.subresource.to_string(),
        });
    }
    let applied = without_managed_fields(applied);
    let mine = strip_meta(&fields_of(&applied, root));
    let mut merged = base.clone();
    merge_map(&mut merged, &applied, root);
    let moved = strip_meta(&changed(Some(&base), &merged, root));

    let mut conflicts = Vec::new();
    for e in list.iter().filter(|e| !w.owns(e, Operation::Apply)) {
        for p in e.fields.intersection(&moved).paths() {
            conflicts.push(Conflict {
                manager: e.describe(),
                field: path_string(&p),
            });
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(Conflicts(conflicts));
    }
    let mut others = FieldSet::default();
    for e in list.iter_mut().filter(|e| !w.owns(e, Operation::Apply)) {
        e.fields = e.fields.difference(&moved);
        others.union(&e.fields);
    }
    let previous = list
        .iter()
        .find(|e| w.owns(e, Operation::Apply))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let gone = previous.difference(&mine).difference(&others);
    prune_map(&mut merged, &gone, Some(&others), root);

    match list.iter_mut().find(|e| w.owns(e, Operation::Apply)) {
        Some(e) if e.fields == mine && moved.is_empty() && gone.is_empty() => {}
        Some(e) => {
            e.fields = mine;
            e.api_version = w.api_version.to_string();
            e.time = Some(w.time.to_string());
        }
        None => list.push(w.entry(Operation::Apply, mine)),
    }
    let mut out = Value::Object(merged);
    set_entries(&mut out, list);
    Ok(out)
}

#[cfg(test)]
mod tests;
