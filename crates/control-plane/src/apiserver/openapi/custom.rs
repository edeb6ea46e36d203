//! OpenAPI v3 documents of CRD-defined group-versions, rendered from the CRDs' structural
//! schemas whenever the served custom resources change, so `kubectl explain <kind>` works
//! for custom resources as for built-in ones.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use nodus_k8s::catalog;
use serde_json::{Map, Value, json};

use super::{INFO_VERSION, Rendered, gv_path};

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// Upstream's definition name of a custom kind: the group reversed, then version and kind.
fn definition_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// The rendered documents of every custom group-version, keyed by index path.
pub(super) fn documents(meta_schemas: &Map<String, Value>) -> Arc<BTreeMap<String, Rendered>> {
    type Cache = Option<(u64, Arc<BTreeMap<String, Rendered>>)>;
    static CACHE: RwLock<Cache> = RwLock::new(None);
    let generation = catalog::generation();
    if let Some((g, d)) = &*CACHE.read().unwrap_or_else(|e| e.into_inner())
        && *g == generation
    {
        return d.clone();
    }
    let docs = Arc::new(render(meta_schemas));
    *CACHE.write().unwrap_or_else(|e| e.into_inner()) = Some((generation, docs.clone()));
    docs
}

fn render(meta_schemas: &Map<String, Value>) -> BTreeMap<String, Rendered> {
    let mut by_gv: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    let mut paths_by_gv: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for info in catalog::custom() {
        let Some(v) = crate::apiserver::crd::lookup(info) else {
            continue;
        };
        let mut schema = v.schema.clone();
        if let Some(o) = schema.as_object_mut() {
            let props = o.entry("properties").or_insert_with(|| json!({}));
            if let Some(p) = props.as_object_mut() {
                p.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"}));
                p.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"}));
                p.insert("metadata".into(), json!({"allOf": [{"$ref": format!("#/components/schemas/{OBJECT_META}")}], "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"}));
            }
            o.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": info.group, "version": info.version, "kind": info.kind}]),
            );
        }
        let schemas = by_gv
            .entry(gv_path(info.group, info.version))
            .or_insert_with(|| meta_schemas.clone());
        let name = definition_name(info.group, info.version, info.kind);
        schemas.insert(name.clone(), schema);
        // kubectl explain finds a resource's schema through its paths.
        let paths = paths_by_gv
            .entry(gv_path(info.group, info.version))
            .or_default();
        super::paths::add_resource(paths, info, &name, None, &[]);
    }
    by_gv
        .into_iter()
        .map(|(path, schemas)| {
            let paths = paths_by_gv.remove(&path).unwrap_or_default();
            let doc = json!({
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes CRD Swagger", "version": INFO_VERSION},
                "paths": paths,
                "components": {"schemas": schemas},
            });
            (path, Rendered::new(&doc))
        })
        .collect()
}

/// The schemas a custom kind's document needs besides its own: ObjectMeta, the schemas its
/// operations name (Status, DeleteOptions, Patch, WatchEvent) and what they use.
pub(super) fn meta_closure(schemas: &BTreeMap<String, Value>) -> Map<String, Value> {
    let roots = std::iter::once(OBJECT_META.to_string()).chain(
        super::paths::common_schemas()
            .into_iter()
            .map(str::to_string),
    );
    super::schemas::closure(schemas, roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definition_names_reverse_the_group() {
        assert_eq!(
            definition_name("stable.example.com", "v1", "CronTab"),
            "com.example.stable.v1.CronTab"
        );
    }
}
