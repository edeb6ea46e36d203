//! CustomResourceDefinition validation (upstream's `ValidateCustomResourceDefinition` for
//! apiextensions.k8s.io/v1): the name is `<plural>.<group>`, the names, the scope, exactly
//! one storage version and at least one served one, structural schemas, the subresources and
//! the printer columns.

use serde_json::{Value, json};

use super::{FieldError, Path, is_dns1035_label, is_dns1123_subdomain};
use crate::structural;

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn dns1035(errs: &mut Vec<FieldError>, path: &Path, value: &str) {
    for m in is_dns1035_label(value) {
        errs.push(FieldError::invalid(path.as_str(), json!(value), m));
    }
}

pub(super) fn validate_crd(errs: &mut Vec<FieldError>, obj: &Value) {
    let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
    let sp = Path::new("spec");
    let group = s(&spec, "/group");
    let plural = s(&spec, "/names/plural");
    let name = s(obj, "/metadata/name");
    if name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if group.is_empty() {
        errs.push(FieldError::required(sp.child("group").as_str(), ""));
    } else {
        for m in is_dns1123_subdomain(group) {
            errs.push(FieldError::invalid(
                sp.child("group").as_str(),
                json!(group),
                m,
            ));
        }
        if !group.contains('.') {
            errs.push(FieldError::invalid(
                sp.child("group").as_str(),
                json!(group),
                "should be a domain with at least one dot",
            ));
        }
    }
    match s(&spec, "/scope") {
        "" => errs.push(FieldError::required(sp.child("scope").as_str(), "")),
        "Cluster" | "Namespaced" => {}
        other => errs.push(FieldError::not_supported(
            sp.child("scope").as_str(),
            json!(other),
            &["Cluster", "Namespaced"],
        )),
    }
    validate_names(errs, &spec, &sp.child("names"));
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let vp = sp.child("versions");
    if versions.is_empty() {
        errs.push(FieldError::invalid_omitted(
            vp.as_str(),
            "must have exactly one version marked as storage version",
        ));
    }
    let storage = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if !versions.is_empty() && storage != 1 {
        errs.push(FieldError::invalid_omitted(
            vp.as_str(),
            "must have exactly one version marked as storage version",
        ));
    }
    if !versions.is_empty()
        && !versions
            .iter()
            .any(|v| v.get("served").and_then(Value::as_bool) == Some(true))
    {
        errs.push(FieldError::invalid_omitted(
            vp.as_str(),
            "must have at least one version marked as served",
        ));
    }
    let mut seen: Vec<&str> = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let p = vp.index(i);
        let vname = s(v, "/name");
        if vname.is_empty() {
            errs.push(FieldError::required(p.child("name").as_str(), ""));
        } else {
            dns1035(errs, &p.child("name"), vname);
            if seen.contains(&vname) {
                errs.push(FieldError::duplicate(
                    p.child("name").as_str(),
                    json!(vname),
                ));
            }
            seen.push(vname);
        }
        validate_version(errs, v, &p);
    }
    match s(&spec, "/conversion/strategy") {
        "" | "None" => {}
        "Webhook" => errs.push(FieldError::forbidden(
            sp.child("conversion").child("strategy").as_str(),
            "conversion webhooks are not supported by this server",
        )),
        other => errs.push(FieldError::not_supported(
            sp.child("conversion").child("strategy").as_str(),
            json!(other),
            &["None", "Webhook"],
        )),
    }
}

fn validate_names(errs: &mut Vec<FieldError>, spec: &Value, p: &Path) {
    let plural = s(spec, "/names/plural");
    if plural.is_empty() {
        errs.push(FieldError::required(p.child("plural").as_str(), ""));
    } else {
        dns1035(errs, &p.child("plural"), plural);
    }
    let singular = s(spec, "/names/singular");
    if !singular.is_empty() {
        dns1035(errs, &p.child("singular"), singular);
    }
    let kind = s(spec, "/names/kind");
    if kind.is_empty() {
        errs.push(FieldError::required(p.child("kind").as_str(), ""));
    } else if !is_dns1035_label(&kind.to_lowercase()).is_empty() {
        errs.push(FieldError::invalid(
            p.child("kind").as_str(),
            json!(kind),
            format!(
                "may have mixed case, but should otherwise match: {}",
                kind.to_lowercase()
            ),
        ));
    }
    let list_kind = s(spec, "/names/listKind");
    if list_kind.is_empty() {
        errs.push(FieldError::required(p.child("listKind").as_str(), ""));
    } else if !is_dns1035_label(&list_kind.to_lowercase()).is_empty() {
        errs.push(FieldError::invalid(
            p.child("listKind").as_str(),
            json!(list_kind),
            format!(
                "may have mixed case, but should otherwise match: {}",
                list_kind.to_lowercase()
            ),
        ));
    }
    if !kind.is_empty() && kind == list_kind {
        errs.push(FieldError::invalid(
            p.child("listKind").as_str(),
            json!(list_kind),
            "kind and listKind may not be the same or parsing become ambiguous",
        ));
    }
    if let Some(short) = spec.pointer("/names/shortNames").and_then(Value::as_array) {
        for (i, sn) in short.iter().enumerate() {
            dns1035(
                errs,
                &p.child("shortNames").index(i),
                sn.as_str().unwrap_or(""),
            );
        }
    }
}

fn validate_version(errs: &mut Vec<FieldError>, v: &Value, p: &Path) {
    let schema_path = p.child("schema").child("openAPIV3Schema");
    match v.pointer("/schema/openAPIV3Schema") {
        None => errs.push(FieldError::required(
            schema_path.as_str(),
            "schemas are required",
        )),
        Some(schema) => {
            let mut structural = structural::structural_errors(schema, &schema_path);
            if structural.is_empty() {
                structural = structural::default_errors(schema, &schema_path);
            }
            errs.extend(structural);
        }
    }
    if let Some(scale) = v.pointer("/subresources/scale") {
        let sp = p.child("subresources").child("scale");
        let spec_path = s(scale, "/specReplicasPath");
        if spec_path.is_empty() {
            errs.push(FieldError::required(
                sp.child("specReplicasPath").as_str(),
                "",
            ));
        } else if !spec_path.starts_with(".spec.") {
            errs.push(FieldError::invalid(
                sp.child("specReplicasPath").as_str(),
                json!(spec_path),
                "should be a json path under .spec",
            ));
        }
        let status_path = s(scale, "/statusReplicasPath");
        if status_path.is_empty() {
            errs.push(FieldError::required(
                sp.child("statusReplicasPath").as_str(),
                "",
            ));
        } else if !status_path.starts_with(".status.") {
            errs.push(FieldError::invalid(
                sp.child("statusReplicasPath").as_str(),
                json!(status_path),
                "should be a json path under .status",
            ));
        }
        let sel = s(scale, "/labelSelectorPath");
        if !sel.is_empty() && !sel.starts_with(".spec.") && !sel.starts_with(".status.") {
            errs.push(FieldError::invalid(
                sp.child("labelSelectorPath").as_str(),
                json!(sel),
                "should be a json path under either .spec or .status",
            ));
        }
    }
    if let Some(cols) = v.get("additionalPrinterColumns").and_then(Value::as_array) {
        for (i, c) in cols.iter().enumerate() {
            let cp = p.child("additionalPrinterColumns").index(i);
            if s(c, "/name").is_empty() {
                errs.push(FieldError::required(cp.child("name").as_str(), ""));
            }
            match s(c, "/type") {
                "" => errs.push(FieldError::required(cp.child("type").as_str(), "")),
                "integer" | "number" | "string" | "boolean" | "date" => {}
                other => errs.push(FieldError::not_supported(
                    cp.child("type").as_str(),
                    json!(other),
                    &["boolean", "date", "integer", "number", "string"],
                )),
            }
            if s(c, "/jsonPath").is_empty() {
                errs.push(FieldError::required(cp.child("jsonPath").as_str(), ""));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object"}}}]}})
    }

    fn errors(obj: &Value) -> Vec<String> {
        let mut errs = Vec::new();
        validate_crd(&mut errs, obj);
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn crd_errors_carry_upstream_paths_and_texts() {
        assert!(errors(&crd()).is_empty());
        let cases: &[(&str, Value, &str)] = &[
            (
                "/metadata/name",
                json!("widgets.other.com"),
                "metadata.name: Invalid value: \"widgets.other.com\": must be spec.names.plural+\".\"+spec.group",
            ),
            (
                "/spec/scope",
                json!("Global"),
                "spec.scope: Unsupported value: \"Global\": supported values: \"Cluster\", \"Namespaced\"",
            ),
            (
                "/spec/names/kind",
                json!(""),
                "spec.names.kind: Required value",
            ),
            (
                "/spec/names/listKind",
                json!("Widget"),
                "spec.names.listKind: Invalid value: \"Widget\": kind and listKind may not be the same or parsing become ambiguous",
            ),
            (
                "/spec/versions/0/storage",
                json!(false),
                "spec.versions: Invalid value: must have exactly one version marked as storage version",
            ),
            (
                "/spec/versions/0/served",
                json!(false),
                "spec.versions: Invalid value: must have at least one version marked as served",
            ),
            (
                "/spec/versions/0/schema",
                json!({}),
                "spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required",
            ),
            (
                "/spec/versions/0/schema/openAPIV3Schema",
                json!({"type": "object", "properties": {"spec": {}}}),
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
            ),
        ];
        for (ptr, value, want) in cases {
            let mut o = crd();
            *o.pointer_mut(ptr).unwrap() = value.clone();
            assert_eq!(errors(&o), vec![want.to_string()], "{ptr}");
        }
        let mut o = crd();
        o["spec"]["group"] = json!("example");
        o["metadata"]["name"] = json!("widgets.example");
        assert_eq!(
            errors(&o),
            vec![
                "spec.group: Invalid value: \"example\": should be a domain with at least one dot"
            ]
        );
    }
}
