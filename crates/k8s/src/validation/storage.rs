//! PersistentVolume, PersistentVolumeClaim and StorageClass validation, as upstream's
//! `ValidatePersistentVolume*` (core/v1) and `ValidateStorageClass*` (storage.k8s.io/v1).
//!
//! Upstream appends a `cmp.Diff` of the Go structs to its immutability messages; nodus
//! prints the message without that diff.

use serde_json::{Value, json};

use super::common::{Errs, each_msg, enum_field, name_is_dns_subdomain, not_supported, s};
use super::names::is_qualified_name;
use super::{FieldError, Path};
use crate::quantity::parse_quantity;

const ACCESS_MODES: [&str; 4] = [
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const VOLUME_MODES: [&str; 2] = ["Block", "Filesystem"];

/// The persistent volume sources nodus knows by name (a PV must name exactly one).
const PV_SOURCES: [&str; 20] = [
    "hostPath",
    "local",
    "nfs",
    "csi",
    "iscsi",
    "fc",
    "rbd",
    "cephfs",
    "cinder",
    "flexVolume",
    "flocker",
    "azureFile",
    "azureDisk",
    "vsphereVolume",
    "quobyte",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "glusterfs",
];

fn access_modes(errs: &mut Errs, spec: &Value, path: &Path, required_detail: &str) {
    let modes: Vec<&str> = spec["accessModes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let p = path.child("accessModes");
    if modes.is_empty() {
        errs.push(FieldError::required(&p, required_detail));
    }
    for m in &modes {
        if !ACCESS_MODES.contains(m) {
            not_supported(errs, p.clone(), m, &ACCESS_MODES);
        }
    }
    if modes.contains(&"ReadWriteOncePod") && modes.len() > 1 {
        errs.push(FieldError::forbidden(
            &p,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
}

fn volume_mode(errs: &mut Errs, spec: &Value, path: &Path) {
    if let Some(m) = spec.get("volumeMode").and_then(Value::as_str) {
        enum_field(errs, path.child("volumeMode"), m, &VOLUME_MODES);
    }
}

/// The storage quantity at `v`, when it parses and is positive; errors otherwise.
fn positive_storage(errs: &mut Errs, v: &Value, path: &Path) {
    let text = match v {
        Value::String(t) => t.clone(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    };
    match parse_quantity(&text) {
        Ok(q) if q.nano_value() > 0 => {}
        Ok(_) => errs.push(FieldError::invalid(
            path,
            json!(text),
            "must be greater than zero",
        )),
        Err(_) => errs.push(FieldError::invalid(
            path,
            json!(text),
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        )),
    }
}

pub(super) fn validate_persistent_volume(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let spec = &obj["spec"];
    let sp = Path::new("spec");
    access_modes(errs, spec, &sp, "");
    let cap = spec["capacity"].as_object();
    let cp = sp.child("capacity");
    if cap.is_none_or(|c| c.is_empty()) {
        errs.push(FieldError::required(&cp, ""));
    }
    match cap {
        Some(c) if c.contains_key("storage") && c.len() == 1 => {
            positive_storage(errs, &c["storage"], &cp.key("storage"))
        }
        _ => errs.push(FieldError::not_supported(
            &cp,
            spec.get("capacity").cloned().unwrap_or(json!({})),
            &["storage"],
        )),
    }
    let policy = s(spec, "persistentVolumeReclaimPolicy");
    if !policy.is_empty() {
        enum_field(
            errs,
            sp.child("persistentVolumeReclaimPolicy"),
            policy,
            &["Delete", "Recycle", "Retain"],
        );
    }
    volume_mode(errs, spec, &sp);
    let class = s(spec, "storageClassName");
    if !class.is_empty() {
        each_msg(
            errs,
            &sp.child("storageClassName"),
            class,
            name_is_dns_subdomain(class, false),
        );
    }
    let named: Vec<&str> = PV_SOURCES
        .iter()
        .copied()
        .filter(|k| !matches!(spec.get(*k), None | Some(Value::Null)))
        .collect();
    match named.as_slice() {
        [] => errs.push(FieldError::required(&sp, "must specify a volume type")),
        [_, more @ ..] => {
            for extra in more {
                errs.push(FieldError::forbidden(
                    sp.child(extra),
                    "may not specify more than 1 volume type",
                ));
            }
        }
    }
    for src in ["hostPath", "local"] {
        if spec.get(src).is_some_and(Value::is_object) && s(&spec[src], "path").is_empty() {
            errs.push(FieldError::required(sp.child(src).child("path"), ""));
        }
    }
    if spec.get("local").is_some_and(Value::is_object)
        && matches!(spec.get("nodeAffinity"), None | Some(Value::Null))
    {
        errs.push(FieldError::required(
            sp.child("nodeAffinity"),
            "Local volume requires node affinity",
        ));
    }
    let Some(old) = old else { return };
    let source = |o: &Value| -> Vec<Value> {
        PV_SOURCES
            .iter()
            .map(|k| o["spec"].get(*k).cloned().unwrap_or(Value::Null))
            .collect()
    };
    if source(obj) != source(old) {
        errs.push(FieldError::forbidden(
            "spec.persistentvolumesource",
            "spec.persistentvolumesource is immutable after creation",
        ));
    }
    if old["spec"].get("volumeMode") != spec.get("volumeMode") {
        errs.push(FieldError::invalid(
            "spec.volumeMode",
            spec.get("volumeMode").cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
    if !matches!(old["spec"].get("nodeAffinity"), None | Some(Value::Null))
        && old["spec"].get("nodeAffinity") != spec.get("nodeAffinity")
    {
        errs.push(FieldError::invalid(
            "spec.nodeAffinity",
            spec.get("nodeAffinity").cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

pub(super) fn validate_persistent_volume_claim(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let spec = &obj["spec"];
    let sp = Path::new("spec");
    access_modes(errs, spec, &sp, "at least 1 access mode is required");
    let rp = sp.child("resources").key("storage");
    match spec.pointer("/resources/requests/storage") {
        None | Some(Value::Null) => errs.push(FieldError::required(&rp, "")),
        Some(v) => positive_storage(errs, v, &rp),
    }
    volume_mode(errs, spec, &sp);
    let class = s(spec, "storageClassName");
    if !class.is_empty() {
        each_msg(
            errs,
            &sp.child("storageClassName"),
            class,
            name_is_dns_subdomain(class, false),
        );
    }
    let Some(old) = old else { return };
    validate_claim_update(errs, obj, old);
}

/// Upstream's `ValidatePersistentVolumeClaimUpdate`: the spec is frozen except for binding
/// (`volumeName` set once), a class given to a claim that had none, and, on a bound claim,
/// `resources.requests` (growing only; whether the class allows expansion is admission's
/// call) and `volumeAttributesClassName`.
fn validate_claim_update(errs: &mut Errs, obj: &Value, old: &Value) {
    let (new_spec, old_spec) = (&obj["spec"], &old["spec"]);
    let mut a = new_spec.clone();
    let mut b = old_spec.clone();
    let bound = old.pointer("/status/phase").and_then(Value::as_str) == Some("Bound");
    for (field, allowed) in [
        ("volumeName", s(old_spec, "volumeName").is_empty()),
        (
            "storageClassName",
            matches!(old_spec.get("storageClassName"), None | Some(Value::Null)),
        ),
        ("volumeAttributesClassName", bound),
        ("resources", bound),
    ] {
        if allowed {
            for o in [&mut a, &mut b] {
                if let Some(m) = o.as_object_mut() {
                    if field == "resources" {
                        if let Some(Value::Object(r)) = m.get_mut("resources") {
                            r.remove("requests");
                        }
                    } else {
                        m.remove(field);
                    }
                }
            }
        }
    }
    if a != b {
        errs.push(FieldError::forbidden(
            "spec",
            "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        ));
        return;
    }
    let q = |o: &Value| {
        o.pointer("/resources/requests/storage")
            .and_then(Value::as_str)
            .and_then(|t| parse_quantity(t).ok())
            .map(|q| q.nano_value())
    };
    if let (Some(n), Some(o)) = (q(new_spec), q(old_spec))
        && n < o
    {
        errs.push(FieldError::forbidden(
            "spec.resources.requests.storage",
            "field can not be less than previous value",
        ));
    }
}

pub(super) fn validate_storage_class(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let prov = s(obj, "provisioner");
    if prov.is_empty() {
        errs.push(FieldError::required("provisioner", ""));
    } else {
        each_msg(
            errs,
            &Path::new("provisioner"),
            prov,
            is_qualified_name(&prov.to_lowercase()),
        );
    }
    let policy = s(obj, "reclaimPolicy");
    if !policy.is_empty() {
        enum_field(
            errs,
            Path::new("reclaimPolicy"),
            policy,
            &["Delete", "Retain"],
        );
    }
    let mode = s(obj, "volumeBindingMode");
    if !mode.is_empty() {
        enum_field(
            errs,
            Path::new("volumeBindingMode"),
            mode,
            &["Immediate", "WaitForFirstConsumer"],
        );
    }
    let Some(old) = old else { return };
    for (field, what) in [
        ("parameters", "parameters"),
        ("provisioner", "provisioner"),
        ("reclaimPolicy", "reclaimPolicy"),
    ] {
        if obj.get(field) != old.get(field) {
            errs.push(FieldError::forbidden(
                field,
                format!("updates to {what} are forbidden."),
            ));
        }
    }
    if obj.get("volumeBindingMode") != old.get("volumeBindingMode") {
        errs.push(FieldError::invalid(
            "volumeBindingMode",
            obj.get("volumeBindingMode").cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults::default_object;
    use crate::gvk::Gvk;
    use crate::validation::validate_object;

    fn check(group: &str, kind: &str, mut obj: Value, old: Option<Value>) -> Vec<String> {
        let gvk = Gvk::new(group, "v1", kind);
        default_object(&gvk, &mut obj);
        let old = old.map(|mut o| {
            default_object(&gvk, &mut o);
            o
        });
        validate_object(&gvk, &obj, old.as_ref())
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    fn pvc(spec: Value) -> Value {
        json!({"metadata": {"name": "c", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn claims_need_access_modes_and_a_storage_request() {
        assert_eq!(
            check("", "PersistentVolumeClaim", pvc(json!({})), None),
            vec![
                "spec.accessModes: Required value: at least 1 access mode is required",
                "spec.resources[storage]: Required value",
            ]
        );
        let ok = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}});
        assert!(check("", "PersistentVolumeClaim", pvc(ok), None).is_empty());
        let bad = json!({"accessModes": ["ReadWriteOncePod", "Sometimes"], "resources": {"requests": {"storage": "0"}}});
        assert_eq!(
            check("", "PersistentVolumeClaim", pvc(bad), None),
            vec![
                "spec.accessModes: Unsupported value: \"Sometimes\": supported values: \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\"",
                "spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes",
                "spec.resources[storage]: Invalid value: \"0\": must be greater than zero",
            ]
        );
    }

    #[test]
    fn claim_spec_is_immutable_except_binding_and_resize_of_bound_claims() {
        let spec = |size: &str, mode: &str| json!({"accessModes": [mode], "resources": {"requests": {"storage": size}}, "storageClassName": "local-path"});
        let mut bound = pvc(spec("1Gi", "ReadWriteOnce"));
        bound["status"] = json!({"phase": "Bound"});
        let forbidden = "spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims";
        assert_eq!(
            check(
                "",
                "PersistentVolumeClaim",
                pvc(spec("1Gi", "ReadWriteMany")),
                Some(bound.clone())
            ),
            vec![forbidden]
        );
        assert!(
            check(
                "",
                "PersistentVolumeClaim",
                pvc(spec("2Gi", "ReadWriteOnce")),
                Some(bound.clone())
            )
            .is_empty()
        );
        assert_eq!(
            check(
                "",
                "PersistentVolumeClaim",
                pvc(spec("512Mi", "ReadWriteOnce")),
                Some(bound)
            ),
            vec![
                "spec.resources.requests.storage: Forbidden: field can not be less than previous value"
            ]
        );
        let pending = pvc(spec("1Gi", "ReadWriteOnce"));
        assert_eq!(
            check(
                "",
                "PersistentVolumeClaim",
                pvc(spec("2Gi", "ReadWriteOnce")),
                Some(pending.clone())
            ),
            vec![forbidden]
        );
        let mut binding = pvc(spec("1Gi", "ReadWriteOnce"));
        binding["spec"]["volumeName"] = json!("pv1");
        assert!(check("", "PersistentVolumeClaim", binding, Some(pending)).is_empty());
    }

    #[test]
    fn volumes_need_modes_capacity_and_one_source() {
        let pv = |spec: Value| json!({"metadata": {"name": "v"}, "spec": spec});
        assert_eq!(
            check("", "PersistentVolume", pv(json!({})), None),
            vec![
                "spec.accessModes: Required value",
                "spec.capacity: Required value",
                "spec.capacity: Unsupported value: map[string]string{}: supported values: \"storage\"",
                "spec: Required value: must specify a volume type",
            ]
        );
        let local = json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "local": {"path": "/x"}, "persistentVolumeReclaimPolicy": "Recycle"});
        assert_eq!(
            check("", "PersistentVolume", pv(local), None),
            vec!["spec.nodeAffinity: Required value: Local volume requires node affinity"]
        );
        let host = json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}, "hostPath": {"path": "/x"}});
        let old = pv(host.clone());
        let mut moved = host;
        moved["hostPath"]["path"] = json!("/y");
        assert_eq!(
            check("", "PersistentVolume", pv(moved), Some(old)),
            vec![
                "spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation"
            ]
        );
    }

    #[test]
    fn storage_classes() {
        let sc = |extra: Value| {
            let mut o =
                json!({"metadata": {"name": "fast"}, "provisioner": "rancher.io/local-path"});
            for (k, v) in extra.as_object().into_iter().flatten() {
                o[k] = v.clone();
            }
            o
        };
        assert!(check("storage.k8s.io", "StorageClass", sc(json!({})), None).is_empty());
        assert_eq!(
            check(
                "storage.k8s.io",
                "StorageClass",
                json!({"metadata": {"name": "x"}, "volumeBindingMode": "Later"}),
                None
            ),
            vec![
                "provisioner: Required value",
                "volumeBindingMode: Unsupported value: \"Later\": supported values: \"Immediate\", \"WaitForFirstConsumer\"",
            ]
        );
        assert_eq!(
            check(
                "storage.k8s.io",
                "StorageClass",
                sc(json!({"reclaimPolicy": "Retain", "parameters": {"a": "b"}})),
                Some(sc(json!({})))
            ),
            vec![
                "parameters: Forbidden: updates to parameters are forbidden.",
                "reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden.",
            ]
        );
    }
}
