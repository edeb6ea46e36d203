//! Per-kind object validation with upstream's checks, field paths and messages.
//!
//! Objects are validated after defaulting, as the API server does; the kubelet applies
//! [`crate::defaults::default_pod`] to static pods before [`validate_pod_spec_for_kubelet`].
//! Each check follows upstream's `pkg/apis/*/validation`; checks upstream has that are not
//! listed in the module docs of the kinds below are not performed.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::names::*;
use super::{FieldError, Path};
use crate::gvk::Gvk;
use crate::quantity::parse_quantity;

type Errs = Vec<FieldError>;

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn arr<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn present(v: &Value, key: &str) -> bool {
    v.get(key).is_some_and(|x| !x.is_null())
}

fn strmap(v: &Value, key: &str) -> BTreeMap<String, String> {
    v.get(key)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn each_msg(errs: &mut Errs, path: &Path, value: &str, msgs: Vec<String>) {
    for m in msgs {
        errs.push(FieldError::invalid(path, json!(value), m));
    }
}

/// Name validator of a kind (`ValidateNameFunc`), `prefix` for generateName.
type NameFn = fn(&str, bool) -> Vec<String>;

/// Upstream masks a trailing dash of a generateName prefix before validating it.
fn mask_trailing_dash(name: &str, prefix: bool) -> String {
    if prefix && name.len() > 1 && name.ends_with('-') {
        format!("{}a", &name[..name.len() - 1])
    } else {
        name.to_string()
    }
}

fn name_is_dns_subdomain(name: &str, prefix: bool) -> Vec<String> {
    is_dns1123_subdomain(&mask_trailing_dash(name, prefix))
}

fn name_is_dns_label(name: &str, prefix: bool) -> Vec<String> {
    is_dns1123_label(&mask_trailing_dash(name, prefix))
}

fn name_is_dns1035_label(name: &str, prefix: bool) -> Vec<String> {
    is_dns1035_label(&mask_trailing_dash(name, prefix))
}

/// Upstream's name rule per kind.
fn name_fn(gvk: &Gvk) -> NameFn {
    match (gvk.group.as_str(), gvk.kind.as_str()) {
        ("", "Namespace") => name_is_dns_label,
        ("", "Service") => name_is_dns1035_label,
        _ => name_is_dns_subdomain,
    }
}

const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;
const MAX_SECRET_SIZE: usize = 1024 * 1024;
const STANDARD_FINALIZERS: [&str; 3] = ["kubernetes", "orphan", "foregroundDeletion"];

fn validate_labels(errs: &mut Errs, labels: &BTreeMap<String, String>, path: &Path) {
    for (k, v) in labels {
        each_msg(errs, path, k, is_qualified_name(k));
        each_msg(errs, path, v, is_valid_label_value(v));
    }
}

fn validate_meta(errs: &mut Errs, gvk: &Gvk, obj: &Value, namespaced: bool) {
    let meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let p = Path::new("metadata");
    let name_rule = name_fn(gvk);
    let generate = s(&meta, "generateName");
    if !generate.is_empty() {
        each_msg(
            errs,
            &p.child("generateName"),
            generate,
            name_rule(generate, true),
        );
    }
    let name = s(&meta, "name");
    if name.is_empty() {
        errs.push(FieldError::required(
            p.child("name"),
            "name or generateName is required",
        ));
    } else {
        each_msg(errs, &p.child("name"), name, name_rule(name, false));
    }
    let ns = s(&meta, "namespace");
    if namespaced {
        if ns.is_empty() {
            errs.push(FieldError::required(p.child("namespace"), ""));
        } else {
            each_msg(
                errs,
                &p.child("namespace"),
                ns,
                name_is_dns_label(ns, false),
            );
        }
    } else if !ns.is_empty() {
        errs.push(FieldError::forbidden(
            p.child("namespace"),
            "not allowed on this type",
        ));
    }
    if let Some(g) = meta.get("generation").and_then(Value::as_i64)
        && g < 0
    {
        errs.push(FieldError::invalid(
            p.child("generation"),
            json!(g),
            "must be greater than or equal to 0",
        ));
    }
    validate_labels(errs, &strmap(&meta, "labels"), &p.child("labels"));
    let annotations = strmap(&meta, "annotations");
    let ap = p.child("annotations");
    let mut total = 0;
    for (k, v) in &annotations {
        each_msg(errs, &ap, k, is_qualified_name(&k.to_lowercase()));
        total += k.len() + v.len();
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(&ap, TOTAL_ANNOTATION_SIZE_LIMIT));
    }
    let op = p.child("ownerReferences");
    let mut controllers = Vec::new();
    for r in arr(&meta, "ownerReferences") {
        let api_version = s(r, "apiVersion");
        let version = api_version.rsplit('/').next().unwrap_or("");
        if version.is_empty() {
            errs.push(FieldError::invalid(
                op.child("apiVersion"),
                json!(api_version),
                "version must not be empty",
            ));
        }
        if s(r, "kind").is_empty() {
            errs.push(FieldError::invalid(
                op.child("kind"),
                json!(""),
                "kind must not be empty",
            ));
        }
        if s(r, "name").is_empty() {
            errs.push(FieldError::invalid(
                op.child("name"),
                json!(""),
                "name must not be empty",
            ));
        }
        if s(r, "uid").is_empty() {
            errs.push(FieldError::invalid(
                op.child("uid"),
                json!(""),
                "uid must not be empty",
            ));
        }
        if r.get("controller").and_then(Value::as_bool) == Some(true) {
            controllers.push(format!("{}/{}", s(r, "kind"), s(r, "name")));
        }
    }
    if controllers.len() > 1 {
        errs.push(FieldError::invalid(
            &op,
            Value::Null,
            format!("Only one reference can have Controller set to true. Found \"true\" in references for {}", controllers.join(" and ")),
        ));
    }
    let fp = p.child("finalizers");
    let mut seen = BTreeSet::new();
    for f in arr(&meta, "finalizers").iter().filter_map(Value::as_str) {
        each_msg(errs, &fp, f, is_qualified_name(f));
        if !seen.insert(f) {
            errs.push(FieldError::duplicate(&fp, json!(f)));
        }
    }
}

fn validate_meta_update(errs: &mut Errs, new: &Value, old: &Value) {
    let p = Path::new("metadata");
    for key in ["name", "namespace", "uid"] {
        let (n, o) = (
            new.pointer(&format!("/metadata/{key}")),
            old.pointer(&format!("/metadata/{key}")),
        );
        let ns = n.and_then(Value::as_str).unwrap_or("");
        let os = o.and_then(Value::as_str).unwrap_or("");
        if ns != os {
            errs.push(FieldError::invalid(
                p.child(key),
                json!(ns),
                "field is immutable",
            ));
        }
    }
    let (n, o) = (
        new.pointer("/metadata/creationTimestamp"),
        old.pointer("/metadata/creationTimestamp"),
    );
    if n.and_then(Value::as_str).unwrap_or("") != o.and_then(Value::as_str).unwrap_or("") {
        errs.push(FieldError::invalid(
            p.child("creationTimestamp"),
            n.cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

fn is_namespaced(gvk: &Gvk) -> bool {
    crate::catalog::by_kind(&gvk.group, &gvk.kind).is_none_or(|r| r.namespaced)
}

/// Validates an object (create when `old` is `None`, update otherwise) as the API server
/// does after defaulting. Kinds outside the catalogue get metadata validation only.
pub fn validate_object(gvk: &Gvk, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    // Upstream rejects a value of the wrong type while decoding (400). Callers that validate
    // raw JSON without `strict::normalize` still must not store it.
    if let Some((field, msg)) = crate::strict::decode_error(gvk, obj) {
        errs.push(FieldError {
            kind: super::ErrorType::Invalid,
            field,
            value: None,
            detail: msg,
        });
        return errs;
    }
    validate_meta(&mut errs, gvk, obj, is_namespaced(gvk));
    if let Some(old) = old {
        validate_meta_update(&mut errs, obj, old);
    }
    match (gvk.group.as_str(), gvk.kind.as_str()) {
        ("", "Pod") => {
            let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
            validate_pod_spec(&mut errs, &spec, &Path::new("spec"), true);
            if let Some(old) = old {
                validate_pod_update(&mut errs, obj, old);
            }
        }
        ("", "Service") => validate_service(&mut errs, obj, old),
        ("", "Node") => validate_node(&mut errs, obj, old),
        ("", "Endpoints") => validate_endpoints(&mut errs, obj),
        ("", "Binding") => validate_binding(&mut errs, obj),
        ("policy", "PodDisruptionBudget") => validate_pdb(&mut errs, obj),
        ("", "Namespace") => validate_namespace(&mut errs, obj),
        ("", "ConfigMap") => validate_config_map(&mut errs, obj, old),
        ("", "Secret") => validate_secret(&mut errs, obj, old),
        ("", "Event") => validate_event(&mut errs, obj),
        ("coordination.k8s.io", "Lease") => validate_lease(&mut errs, obj),
        ("discovery.k8s.io", "EndpointSlice") => validate_endpoint_slice(&mut errs, obj, old),
        ("apps", "Deployment" | "ReplicaSet" | "DaemonSet") => {
            validate_workload(&mut errs, gvk, obj, old)
        }
        ("scheduling.k8s.io", "PriorityClass") => validate_priority_class(&mut errs, obj, old),
        ("node.k8s.io", "RuntimeClass") => validate_runtime_class(&mut errs, obj, old),
        _ => {}
    }
    errs
}

/// The API server's pod validation, for static pod manifests read by the kubelet (after
/// [`crate::defaults::default_pod`]).
pub fn validate_pod_spec_for_kubelet(pod: &Pod) -> Vec<FieldError> {
    match serde_json::to_value(pod) {
        Ok(v) => validate_object(&Gvk::new("", "v1", "Pod"), &v, None),
        Err(e) => vec![FieldError::internal("", e.to_string())],
    }
}

fn not_supported(errs: &mut Errs, path: Path, value: &str, supported: &[&str]) {
    errs.push(FieldError::not_supported(path, json!(value), supported));
}

/// `Required` when empty, `Unsupported value` when not one of `supported`.
fn enum_field(errs: &mut Errs, path: Path, value: &str, supported: &[&str]) {
    if value.is_empty() {
        errs.push(FieldError::required(path, ""));
    } else if !supported.contains(&value) {
        not_supported(errs, path, value, supported);
    }
}

fn dns_label(errs: &mut Errs, path: &Path, value: &str) {
    each_msg(errs, path, value, is_dns1123_label(value));
}

fn is_valid_port_num(p: i64) -> Vec<String> {
    if (1..=65535).contains(&p) {
        Vec::new()
    } else {
        vec!["must be between 1 and 65535, inclusive".to_string()]
    }
}

/// Upstream's `IsValidPortName`.
pub fn is_valid_port_name(port: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if port.len() > 15 {
        errs.push(max_len_error(15));
    }
    if port.is_empty()
        || !port
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        errs.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string(),
        );
    }
    if !port.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if port.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if port.starts_with('-') || port.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

fn port_num_or_name(errs: &mut Errs, path: Path, v: Option<&Value>) {
    match v {
        Some(Value::Number(n)) => {
            let p = n.as_i64().unwrap_or(0);
            for m in is_valid_port_num(p) {
                errs.push(FieldError::invalid(&path, json!(p), m));
            }
        }
        Some(Value::String(name)) => each_msg(errs, &path, name, is_valid_port_name(name)),
        _ => errs.push(FieldError::invalid(
            &path,
            json!(0),
            "must be between 1 and 65535, inclusive",
        )),
    }
}

fn nonnegative(errs: &mut Errs, path: Path, v: &Value, key: &str) {
    if let Some(n) = v.get(key).and_then(Value::as_i64)
        && n < 0
    {
        errs.push(FieldError::invalid(
            path,
            json!(n),
            "must be greater than or equal to 0",
        ));
    }
}

const PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];

fn validate_pod_spec(errs: &mut Errs, spec: &Value, p: &Path, is_pod: bool) {
    match spec
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
    {
        None => errs.push(FieldError::required(
            p.child("terminationGracePeriodSeconds"),
            "",
        )),
        Some(g) if g < 0 => errs.push(FieldError::invalid(
            p.child("terminationGracePeriodSeconds"),
            json!(g),
            "must be greater than or equal to 0",
        )),
        _ => {}
    }
    let volumes = validate_volumes(errs, spec, &p.child("volumes"));
    let grace = spec
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_i64);
    let containers = arr(spec, "containers");
    let cp = p.child("containers");
    if containers.is_empty() {
        errs.push(FieldError::required(&cp, ""));
    }
    let mut names = BTreeSet::new();
    for (i, c) in containers.iter().enumerate() {
        let ip = cp.index(i);
        validate_container_common(errs, c, &volumes, &ip);
        let name = s(c, "name");
        if !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(ip.child("name"), json!(name)));
        }
        if let Some(l) = c.get("lifecycle").filter(|l| !l.is_null()) {
            validate_lifecycle(errs, l, grace, &ip.child("lifecycle"));
        }
        validate_probes(errs, c, grace, &ip);
        if present(c, "restartPolicy") {
            errs.push(FieldError::forbidden(
                ip.child("restartPolicy"),
                "may not be set for non-init containers",
            ));
        }
    }
    host_port_conflicts(errs, containers, &cp);
    let ip_path = p.child("initContainers");
    for (i, c) in arr(spec, "initContainers").iter().enumerate() {
        let ip = ip_path.index(i);
        validate_container_common(errs, c, &volumes, &ip);
        let restart_always = s(c, "restartPolicy") == "Always";
        if present(c, "restartPolicy") && !restart_always {
            not_supported(
                errs,
                ip.child("restartPolicy"),
                s(c, "restartPolicy"),
                &["Always"],
            );
        }
        let name = s(c, "name");
        if names.contains(name) {
            errs.push(FieldError::duplicate(ip.child("name"), json!(name)));
        } else if !name.is_empty() {
            names.insert(name.to_string());
        }
        host_port_conflicts(errs, std::slice::from_ref(c), &ip_path);
        if restart_always {
            if let Some(l) = c.get("lifecycle").filter(|l| !l.is_null()) {
                validate_lifecycle(errs, l, grace, &ip.child("lifecycle"));
            }
            validate_probes(errs, c, grace, &ip);
        } else {
            for f in [
                "lifecycle",
                "livenessProbe",
                "readinessProbe",
                "startupProbe",
            ] {
                if present(c, f) {
                    errs.push(FieldError::forbidden(
                        ip.child(f),
                        "may not be set for init containers without restartPolicy=Always",
                    ));
                }
            }
        }
    }
    let ep = p.child("ephemeralContainers");
    let others: BTreeSet<&str> = containers
        .iter()
        .chain(arr(spec, "initContainers"))
        .map(|c| s(c, "name"))
        .collect();
    for (i, c) in arr(spec, "ephemeralContainers").iter().enumerate() {
        let ip = ep.index(i);
        validate_container_common(errs, c, &volumes, &ip);
        let name = s(c, "name");
        if !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(ip.child("name"), json!(name)));
        }
        let target = s(c, "targetContainerName");
        if !target.is_empty() && !others.contains(target) {
            errs.push(FieldError::not_found(
                ip.child("targetContainerName"),
                json!(target),
            ));
        }
        for f in [
            "lifecycle",
            "livenessProbe",
            "readinessProbe",
            "startupProbe",
            "ports",
            "resources",
        ] {
            let set = match c.get(f) {
                None | Some(Value::Null) => false,
                Some(Value::Array(a)) => !a.is_empty(),
                Some(Value::Object(m)) => !m.is_empty(),
                Some(_) => true,
            };
            if set {
                errs.push(FieldError::forbidden(
                    ip.child(f),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
    }
    if spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
        for (i, c) in containers.iter().enumerate() {
            for (j, port) in arr(c, "ports").iter().enumerate() {
                let hp = port.get("hostPort").and_then(Value::as_i64).unwrap_or(0);
                let cport = port
                    .get("containerPort")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                if (is_pod || hp != 0) && hp != cport {
                    errs.push(FieldError::invalid(
                        cp.index(i).child("ports").index(j).child("hostPort"),
                        json!(hp),
                        "must match `containerPort` when `hostNetwork` is true",
                    ));
                }
            }
        }
    }
    enum_field(
        errs,
        p.child("restartPolicy"),
        s(spec, "restartPolicy"),
        &["Always", "OnFailure", "Never"],
    );
    enum_field(
        errs,
        p.child("dnsPolicy"),
        s(spec, "dnsPolicy"),
        &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
    );
    validate_labels(
        errs,
        &strmap(spec, "nodeSelector"),
        &p.child("nodeSelector"),
    );
    validate_pod_security_context(errs, spec, &p.child("securityContext"));
    if s(spec, "dnsPolicy") == "None" {
        match spec.get("dnsConfig").filter(|d| !d.is_null()) {
            None => errs.push(FieldError::required(
                p.child("dnsConfig"),
                "must provide `dnsConfig` when `dnsPolicy` is None",
            )),
            Some(d) if arr(d, "nameservers").is_empty() => errs.push(FieldError::required(
                p.child("dnsConfig").child("nameservers"),
                "must provide at least one DNS nameserver when `dnsPolicy` is None",
            )),
            _ => {}
        }
    }
    for (i, g) in arr(spec, "readinessGates").iter().enumerate() {
        let t = s(g, "conditionType");
        each_msg(
            errs,
            &p.child("readinessGates").index(i).child("conditionType"),
            t,
            is_qualified_name(t),
        );
    }
    for (key, rule) in [
        ("serviceAccountName", name_is_dns_subdomain as NameFn),
        ("nodeName", name_is_dns_subdomain),
    ] {
        let v = s(spec, key);
        if !v.is_empty() {
            each_msg(errs, &p.child(key), v, rule(v, false));
        }
    }
    if let Some(ads) = spec.get("activeDeadlineSeconds").and_then(Value::as_i64)
        && !(1..=i64::from(i32::MAX)).contains(&ads)
    {
        errs.push(FieldError::invalid(
            p.child("activeDeadlineSeconds"),
            json!(ads),
            "must be between 1 and 2147483647, inclusive",
        ));
    }
    for key in ["hostname", "subdomain"] {
        let v = s(spec, key);
        if !v.is_empty() {
            dns_label(errs, &p.child(key), v);
        }
    }
    validate_tolerations(errs, arr(spec, "tolerations"), &p.child("tolerations"));
    let pc = s(spec, "priorityClassName");
    if !pc.is_empty() {
        each_msg(
            errs,
            &p.child("priorityClassName"),
            pc,
            name_is_dns_subdomain(pc, false),
        );
    }
    if let Some(rc) = spec.get("runtimeClassName").and_then(Value::as_str) {
        each_msg(
            errs,
            &p.child("runtimeClassName"),
            rc,
            name_is_dns_subdomain(rc, false),
        );
    }
    if let Some(pp) = spec.get("preemptionPolicy").and_then(Value::as_str) {
        enum_field(
            errs,
            p.child("preemptionPolicy"),
            pp,
            &["PreemptLowerPriority", "Never"],
        );
    }
    let gp = p.child("schedulingGates");
    let mut gates = BTreeSet::new();
    for (i, g) in arr(spec, "schedulingGates").iter().enumerate() {
        let n = s(g, "name");
        each_msg(errs, &gp.index(i), n, is_qualified_name(n));
        if !gates.insert(n) {
            errs.push(FieldError::duplicate(gp.index(i), json!(n)));
        }
    }
}

/// Validates `spec.volumes` and returns the names of the valid ones.
fn validate_volumes(errs: &mut Errs, spec: &Value, p: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, v) in arr(spec, "volumes").iter().enumerate() {
        let ip = p.index(i);
        let mut el = Vec::new();
        let mut count = 0;
        for src in VOLUME_SOURCE_ORDER {
            if !present(v, src) {
                continue;
            }
            if count > 0 {
                el.push(FieldError::forbidden(
                    ip.child(src),
                    "may not specify more than 1 volume type",
                ));
                continue;
            }
            count += 1;
            let sv = &v[*src];
            let sp = ip.child(src);
            match *src {
                "hostPath" => {
                    if s(sv, "path").is_empty() {
                        el.push(FieldError::required(sp.child("path"), ""));
                    }
                    let t = s(sv, "type");
                    let types = [
                        "",
                        "DirectoryOrCreate",
                        "Directory",
                        "FileOrCreate",
                        "File",
                        "Socket",
                        "CharDevice",
                        "BlockDevice",
                    ];
                    if !types.contains(&t) {
                        el.push(FieldError::not_supported(
                            sp.child("type"),
                            json!(t),
                            &types,
                        ));
                    }
                }
                "secret" | "configMap" | "persistentVolumeClaim" => {
                    let key = match *src {
                        "secret" => "secretName",
                        "configMap" => "name",
                        _ => "claimName",
                    };
                    if s(sv, key).is_empty() {
                        el.push(FieldError::required(sp.child(key), ""));
                    }
                    if *src != "persistentVolumeClaim" {
                        file_mode(&mut el, sv, "defaultMode", &sp);
                        key_to_path_items(&mut el, sv, &sp, true);
                    }
                }
                "nfs" => {
                    if s(sv, "server").is_empty() {
                        el.push(FieldError::required(sp.child("server"), ""));
                    }
                    let path = s(sv, "path");
                    if path.is_empty() {
                        el.push(FieldError::required(sp.child("path"), ""));
                    } else if !path.starts_with('/') {
                        el.push(FieldError::invalid(
                            sp.child("path"),
                            json!(path),
                            "must be an absolute path",
                        ));
                    }
                }
                "downwardAPI" | "projected" => {
                    file_mode(&mut el, sv, "defaultMode", &sp);
                    if *src == "downwardAPI" {
                        key_to_path_items(&mut el, sv, &sp, false);
                    }
                }
                "emptyDir" => {
                    if let Some(q) = sv
                        .get("sizeLimit")
                        .and_then(Value::as_str)
                        .and_then(|q| parse_quantity(q).ok())
                        && q.nano_value() < 0
                    {
                        el.push(FieldError::forbidden(
                            sp.child("sizeLimit"),
                            "SizeLimit field must be a valid resource quantity",
                        ));
                    }
                }
                _ => {}
            }
        }
        if count == 0 {
            el.push(FieldError::required(&ip, "must specify a volume type"));
        }
        let name = s(v, "name");
        if name.is_empty() {
            el.push(FieldError::required(ip.child("name"), ""));
        } else {
            for m in is_dns1123_label(name) {
                el.push(FieldError::invalid(ip.child("name"), json!(name), m));
            }
        }
        if names.contains(name) {
            el.push(FieldError::duplicate(ip.child("name"), json!(name)));
        }
        if el.is_empty() {
            names.insert(name.to_string());
        } else {
            errs.extend(el);
        }
    }
    names
}

const FILE_MODE_ERROR: &str = "must be a number between 0 and 0777 (octal), both inclusive";

fn file_mode(errs: &mut Errs, v: &Value, key: &str, p: &Path) {
    if let Some(m) = v.get(key).and_then(Value::as_i64)
        && !(0..=0o777).contains(&m)
    {
        errs.push(FieldError::invalid(p.child(key), json!(m), FILE_MODE_ERROR));
    }
}

/// Upstream's `validateKeyToPathList` (configMap/secret items; downwardAPI items have a
/// path but no key).
fn key_to_path_items(errs: &mut Errs, v: &Value, p: &Path, with_key: bool) {
    for (i, item) in arr(v, "items").iter().enumerate() {
        let ip = p.child("items").index(i);
        if with_key && s(item, "key").is_empty() {
            errs.push(FieldError::required(ip.child("key"), ""));
        }
        let path = s(item, "path");
        if path.is_empty() {
            errs.push(FieldError::required(ip.child("path"), ""));
        }
        local_descending_path(errs, path, &ip.child("path"));
        if path.starts_with("..") && !path.starts_with("../") {
            errs.push(FieldError::invalid(
                ip.child("path"),
                json!(path),
                "must not start with '..'",
            ));
        }
        file_mode(errs, item, "mode", &ip);
    }
}

/// The order upstream's `validateVolumeSource` checks volume types in.
const VOLUME_SOURCE_ORDER: &[&str] = &[
    "emptyDir",
    "hostPath",
    "gitRepo",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "flocker",
    "persistentVolumeClaim",
    "rbd",
    "cinder",
    "cephfs",
    "quobyte",
    "downwardAPI",
    "fc",
    "flexVolume",
    "configMap",
    "azureFile",
    "vsphereVolume",
    "photonPersistentDisk",
    "portworxVolume",
    "azureDisk",
    "storageos",
    "projected",
    "scaleIO",
    "csi",
    "ephemeral",
    "image",
];

fn validate_container_common(errs: &mut Errs, c: &Value, volumes: &BTreeSet<String>, p: &Path) {
    let name = s(c, "name");
    if name.is_empty() {
        errs.push(FieldError::required(p.child("name"), ""));
    } else {
        dns_label(errs, &p.child("name"), name);
    }
    if s(c, "image").is_empty() {
        errs.push(FieldError::required(p.child("image"), ""));
    }
    enum_field(
        errs,
        p.child("terminationMessagePolicy"),
        s(c, "terminationMessagePolicy"),
        &["File", "FallbackToLogsOnError"],
    );
    // Ports.
    let pp = p.child("ports");
    let mut port_names = BTreeSet::new();
    for (i, port) in arr(c, "ports").iter().enumerate() {
        let ip = pp.index(i);
        let pname = s(port, "name");
        if !pname.is_empty() {
            let msgs = is_valid_port_name(pname);
            if !msgs.is_empty() {
                each_msg(errs, &ip.child("name"), pname, msgs);
            } else if !port_names.insert(pname) {
                errs.push(FieldError::duplicate(ip.child("name"), json!(pname)));
            }
        }
        let cport = port
            .get("containerPort")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if cport == 0 {
            errs.push(FieldError::required(ip.child("containerPort"), ""));
        } else {
            for m in is_valid_port_num(cport) {
                errs.push(FieldError::invalid(
                    ip.child("containerPort"),
                    json!(cport),
                    m,
                ));
            }
        }
        let hport = port.get("hostPort").and_then(Value::as_i64).unwrap_or(0);
        if hport != 0 {
            for m in is_valid_port_num(hport) {
                errs.push(FieldError::invalid(ip.child("hostPort"), json!(hport), m));
            }
        }
        enum_field(errs, ip.child("protocol"), s(port, "protocol"), &PROTOCOLS);
    }
    // Env.
    let envp = p.child("env");
    for (i, e) in arr(c, "env").iter().enumerate() {
        let ip = envp.index(i);
        let n = s(e, "name");
        if n.is_empty() {
            errs.push(FieldError::required(ip.child("name"), ""));
        } else if n
            .chars()
            .any(|ch| !ch.is_ascii() || ch.is_ascii_control() || ch == '=')
        {
            errs.push(FieldError::invalid(
                ip.child("name"),
                json!(n),
                "a valid environment variable name must consist only of printable ASCII characters other than '='",
            ));
        }
        if let Some(from) = e.get("valueFrom").filter(|v| !v.is_null()) {
            let fp = ip.child("valueFrom");
            let sources = [
                "fieldRef",
                "resourceFieldRef",
                "configMapKeyRef",
                "secretKeyRef",
            ]
            .iter()
            .filter(|k| present(from, k))
            .count();
            if sources == 0 {
                errs.push(FieldError::invalid(
                    &fp,
                    json!(""),
                    "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
                ));
            } else if !s(e, "value").is_empty() {
                errs.push(FieldError::invalid(
                    &fp,
                    json!(""),
                    "may not be specified when `value` is not empty",
                ));
            } else if sources > 1 {
                errs.push(FieldError::invalid(
                    &fp,
                    json!(""),
                    "may not have more than one field specified at a time",
                ));
            }
            for key in ["configMapKeyRef", "secretKeyRef"] {
                if let Some(r) = from.get(key).filter(|r| !r.is_null()) {
                    let k = s(r, "key");
                    if k.is_empty() {
                        errs.push(FieldError::required(fp.child(key).child("key"), ""));
                    } else {
                        each_msg(errs, &fp.child(key).child("key"), k, is_config_map_key(k));
                    }
                }
            }
            if let Some(r) = from.get("fieldRef").filter(|r| !r.is_null()) {
                let fr = fp.child("fieldRef");
                let path = s(r, "fieldPath");
                const ALLOWED: [&str; 9] = [
                    "metadata.name",
                    "metadata.namespace",
                    "metadata.uid",
                    "spec.nodeName",
                    "spec.serviceAccountName",
                    "status.hostIP",
                    "status.hostIPs",
                    "status.podIP",
                    "status.podIPs",
                ];
                if s(r, "apiVersion").is_empty() {
                    errs.push(FieldError::required(fr.child("apiVersion"), ""));
                } else if path.is_empty() {
                    errs.push(FieldError::required(fr.child("fieldPath"), ""));
                } else if !(ALLOWED.contains(&path)
                    || path.starts_with("metadata.labels[")
                    || path.starts_with("metadata.annotations["))
                {
                    let mut sorted = ALLOWED;
                    sorted.sort_unstable();
                    not_supported(errs, fr.child("fieldPath"), path, &sorted);
                }
            }
        }
    }
    // Volume mounts.
    let mp = p.child("volumeMounts");
    let mut mount_paths = BTreeSet::new();
    for (i, m) in arr(c, "volumeMounts").iter().enumerate() {
        let ip = mp.index(i);
        let n = s(m, "name");
        if n.is_empty() {
            errs.push(FieldError::required(ip.child("name"), ""));
        }
        if !volumes.contains(n) {
            errs.push(FieldError::not_found(ip.child("name"), json!(n)));
        }
        let path = s(m, "mountPath");
        if path.is_empty() {
            errs.push(FieldError::required(ip.child("mountPath"), ""));
        }
        if !mount_paths.insert(path) {
            errs.push(FieldError::invalid(
                ip.child("mountPath"),
                json!(path),
                "must be unique",
            ));
        }
        let sub = s(m, "subPath");
        if !sub.is_empty() {
            local_descending_path(errs, sub, &mp.child("subPath"));
        }
    }
    let pull = s(c, "imagePullPolicy");
    enum_field(
        errs,
        p.child("imagePullPolicy"),
        pull,
        &["Always", "IfNotPresent", "Never"],
    );
    validate_resources(
        errs,
        c.get("resources").unwrap_or(&Value::Null),
        &p.child("resources"),
    );
    if let Some(sc) = c.get("securityContext").filter(|v| !v.is_null()) {
        validate_container_security_context(errs, sc, &p.child("securityContext"));
    }
}

const ID_RANGE: &str = "must be between 0 and 2147483647, inclusive";

/// Upstream's `IsValidUserID`/`IsValidGroupID` for an optional id field.
fn id_field(errs: &mut Errs, v: &Value, key: &str, p: &Path) {
    if let Some(id) = v.get(key).and_then(Value::as_i64)
        && !(0..=i64::from(i32::MAX)).contains(&id)
    {
        errs.push(FieldError::invalid(p.child(key), json!(id), ID_RANGE));
    }
}

fn validate_seccomp(errs: &mut Errs, sc: &Value, p: &Path) {
    let Some(sp) = sc.get("seccompProfile").filter(|v| !v.is_null()) else {
        return;
    };
    let pp = p.child("seccompProfile");
    let ty = s(sp, "type");
    match ty {
        "Localhost" | "RuntimeDefault" | "Unconfined" => {}
        "" => errs.push(FieldError::required(
            pp.child("type"),
            "type is required when seccompProfile is set",
        )),
        other => not_supported(
            errs,
            pp.child("type"),
            other,
            &["Localhost", "RuntimeDefault", "Unconfined"],
        ),
    }
    let local = sp.get("localhostProfile").and_then(Value::as_str);
    match (ty, local) {
        ("Localhost", None) => errs.push(FieldError::required(
            pp.child("localhostProfile"),
            "must be set when seccomp type is Localhost",
        )),
        ("Localhost", Some(l)) => local_descending_path(errs, l, &pp.child("localhostProfile")),
        (_, Some(_)) => errs.push(FieldError::invalid(
            pp.child("localhostProfile"),
            sp.clone(),
            "can only be set when seccomp type is Localhost",
        )),
        _ => {}
    }
}

fn validate_pod_security_context(errs: &mut Errs, spec: &Value, p: &Path) {
    let Some(sc) = spec.get("securityContext").filter(|v| !v.is_null()) else {
        return;
    };
    id_field(errs, sc, "fsGroup", p);
    id_field(errs, sc, "runAsUser", p);
    id_field(errs, sc, "runAsGroup", p);
    for (i, g) in arr(sc, "supplementalGroups").iter().enumerate() {
        if let Some(g) = g.as_i64()
            && !(0..=i64::from(i32::MAX)).contains(&g)
        {
            errs.push(FieldError::invalid(
                p.child("supplementalGroups").index(i),
                json!(g),
                ID_RANGE,
            ));
        }
    }
    // In the v1 API these live on the pod spec; upstream reports them under securityContext.
    let share = spec.get("shareProcessNamespace").and_then(Value::as_bool) == Some(true);
    if share && spec.get("hostPID").and_then(Value::as_bool) == Some(true) {
        errs.push(FieldError::invalid(
            p.child("shareProcessNamespace"),
            json!(true),
            "ShareProcessNamespace and HostPID cannot both be enabled",
        ));
    }
    if let Some(policy) = sc.get("fsGroupChangePolicy").and_then(Value::as_str)
        && policy != "Always"
        && policy != "OnRootMismatch"
    {
        not_supported(
            errs,
            p.child("fsGroupChangePolicy"),
            policy,
            &["Always", "OnRootMismatch"],
        );
    }
    validate_seccomp(errs, sc, p);
}

fn validate_container_security_context(errs: &mut Errs, sc: &Value, p: &Path) {
    id_field(errs, sc, "runAsUser", p);
    id_field(errs, sc, "runAsGroup", p);
    if let Some(pm) = sc.get("procMount").and_then(Value::as_str)
        && pm != "Default"
        && pm != "Unmasked"
    {
        not_supported(errs, p.child("procMount"), pm, &["Default", "Unmasked"]);
    }
    validate_seccomp(errs, sc, p);
    if sc.get("allowPrivilegeEscalation").and_then(Value::as_bool) == Some(false) {
        if sc.get("privileged").and_then(Value::as_bool) == Some(true) {
            errs.push(FieldError::invalid(
                p,
                sc.clone(),
                "cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
            ));
        }
        let adds_sys_admin = sc
            .pointer("/capabilities/add")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|c| c.as_str() == Some("CAP_SYS_ADMIN")));
        if adds_sys_admin {
            errs.push(FieldError::invalid(
                p,
                sc.clone(),
                "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN",
            ));
        }
    }
}

/// Upstream's `validateLocalDescendingPath` (subPath).
fn local_descending_path(errs: &mut Errs, path: &str, p: &Path) {
    if path.starts_with('/') {
        errs.push(FieldError::invalid(
            p,
            json!(path),
            "must be a relative path",
        ));
    }
    if path.split('/').any(|part| part == "..") {
        errs.push(FieldError::invalid(p, json!(path), "must not contain '..'"));
    }
}

const STANDARD_CONTAINER_RESOURCES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

fn validate_resources(errs: &mut Errs, r: &Value, p: &Path) {
    let lp = p.child("limits");
    let rp = p.child("requests");
    let limits = r
        .get("limits")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let requests = r
        .get("requests")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let check = |errs: &mut Errs,
                 name: &str,
                 q: &Value,
                 path: Path|
     -> Option<crate::quantity::ParsedQuantity> {
        if !name.contains('/')
            && !STANDARD_CONTAINER_RESOURCES.contains(&name)
            && !name.starts_with("hugepages-")
        {
            errs.push(FieldError::invalid(
                &path,
                json!({"$stringer": name}),
                "must be a standard resource for containers",
            ));
        } else if name.contains('/') {
            let msgs = is_qualified_name(name);
            each_msg(errs, &path, name, msgs);
        }
        let text = match q {
            Value::String(t) => Some(t.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        let parsed = match text.as_deref().map(parse_quantity) {
            Some(Ok(pq)) => Some(pq),
            Some(Err(e)) => {
                // Upstream fails decoding here (see strict::check_quantities); still never
                // let a malformed quantity through when a caller skips normalisation.
                errs.push(FieldError::invalid(&path, q.clone(), e.to_string()));
                None
            }
            None => None,
        };
        match parsed {
            Some(pq) if pq.nano_value() < 0 => {
                errs.push(FieldError::invalid(
                    &path,
                    json!(pq.canonical()),
                    "must be greater than or equal to 0",
                ));
                Some(pq)
            }
            Some(pq) => {
                let integer = !STANDARD_CONTAINER_RESOURCES.contains(&name)
                    && !name.starts_with("hugepages-");
                if integer && pq.milli_value() % 1000 != 0 {
                    errs.push(FieldError::invalid(
                        &path,
                        json!({"$stringer": pq.canonical()}),
                        "must be an integer",
                    ));
                }
                Some(pq)
            }
            None => None,
        }
    };
    for (name, q) in &limits {
        check(errs, name, q, lp.key(name));
    }
    for (name, q) in &requests {
        let req = check(errs, name, q, rp.key(name));
        let overcommit = STANDARD_CONTAINER_RESOURCES.contains(&name.as_str());
        match limits.get(name) {
            Some(lq) => {
                let lim = lq.as_str().and_then(|q| parse_quantity(q).ok());
                if let (Some(req), Some(lim)) = (req, lim) {
                    if req.nano_value() != lim.nano_value() && !overcommit {
                        errs.push(FieldError::invalid(
                            &rp,
                            json!(req.canonical()),
                            format!("must be equal to {name} limit of {}", lim.canonical()),
                        ));
                    } else if req.nano_value() > lim.nano_value() {
                        errs.push(FieldError::invalid(
                            &rp,
                            json!(req.canonical()),
                            format!(
                                "must be less than or equal to {name} limit of {}",
                                lim.canonical()
                            ),
                        ));
                    }
                }
            }
            None if !overcommit => {
                errs.push(FieldError::required(
                    &lp,
                    "Limit must be set for non overcommitable resources",
                ));
            }
            None => {}
        }
    }
}

fn host_port_conflicts(errs: &mut Errs, containers: &[Value], p: &Path) {
    let mut seen = BTreeSet::new();
    for (ci, c) in containers.iter().enumerate() {
        for (pi, port) in arr(c, "ports").iter().enumerate() {
            let hp = port.get("hostPort").and_then(Value::as_i64).unwrap_or(0);
            if hp == 0 {
                continue;
            }
            let key = format!("{}/{}/{hp}", s(port, "protocol"), s(port, "hostIP"));
            if !seen.insert(key.clone()) {
                errs.push(FieldError::duplicate(
                    p.index(ci).child("ports").index(pi).child("hostPort"),
                    json!(key),
                ));
            }
        }
    }
}

fn validate_handler(errs: &mut Errs, h: &Value, kinds: &[&str], grace: Option<i64>, p: &Path) {
    let mut n = 0;
    for kind in kinds {
        let Some(v) = h.get(*kind).filter(|v| !v.is_null()) else {
            continue;
        };
        let kp = p.child(kind);
        if n > 0 {
            errs.push(FieldError::forbidden(
                kp,
                "may not specify more than 1 handler type",
            ));
            continue;
        }
        n += 1;
        match *kind {
            "exec" if arr(v, "command").is_empty() => {
                errs.push(FieldError::required(kp.child("command"), ""));
            }
            "httpGet" => {
                if s(v, "path").is_empty() {
                    errs.push(FieldError::required(kp.child("path"), ""));
                }
                port_num_or_name(errs, kp.child("port"), v.get("port"));
                let scheme = s(v, "scheme");
                if scheme != "HTTP" && scheme != "HTTPS" {
                    not_supported(errs, kp.child("scheme"), scheme, &["HTTP", "HTTPS"]);
                }
            }
            "tcpSocket" => port_num_or_name(errs, kp.child("port"), v.get("port")),
            "grpc" => port_num_or_name(
                errs,
                kp.child("port"),
                Some(v.get("port").unwrap_or(&Value::Null)),
            ),
            "sleep" => {
                let secs = v.get("seconds").and_then(Value::as_i64).unwrap_or(0);
                if let Some(g) = grace
                    && (secs < 0 || secs > g)
                {
                    errs.push(FieldError::invalid(
                        kp,
                        json!(secs),
                        format!(
                            "must be non-negative and less than terminationGracePeriodSeconds ({g})"
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    if n == 0 {
        errs.push(FieldError::required(p, "must specify a handler type"));
    }
}

fn validate_lifecycle(errs: &mut Errs, l: &Value, grace: Option<i64>, p: &Path) {
    for hook in ["postStart", "preStop"] {
        if let Some(h) = l.get(hook).filter(|h| !h.is_null()) {
            validate_handler(
                errs,
                h,
                &["exec", "httpGet", "tcpSocket", "sleep"],
                grace,
                &p.child(hook),
            );
        }
    }
}

fn validate_probes(errs: &mut Errs, c: &Value, grace: Option<i64>, p: &Path) {
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let Some(pr) = c.get(probe).filter(|v| !v.is_null()) else {
            continue;
        };
        let pp = p.child(probe);
        validate_handler(
            errs,
            pr,
            &["exec", "httpGet", "tcpSocket", "grpc"],
            grace,
            &pp,
        );
        for f in [
            "initialDelaySeconds",
            "timeoutSeconds",
            "periodSeconds",
            "successThreshold",
            "failureThreshold",
        ] {
            nonnegative(errs, pp.child(f), pr, f);
        }
        if let Some(t) = pr
            .get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
        {
            if probe == "readinessProbe" {
                errs.push(FieldError::invalid(
                    pp.child("terminationGracePeriodSeconds"),
                    json!(t),
                    "must not be set for readinessProbes",
                ));
            } else if t <= 0 {
                errs.push(FieldError::invalid(
                    pp.child("terminationGracePeriodSeconds"),
                    json!(t),
                    "must be greater than 0",
                ));
            }
        }
        let st = pr
            .get("successThreshold")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        if probe != "readinessProbe" && st != 1 {
            errs.push(FieldError::invalid(
                pp.child("successThreshold"),
                json!(st),
                "must be 1",
            ));
        }
    }
}

fn validate_tolerations(errs: &mut Errs, tolerations: &[Value], p: &Path) {
    for (i, t) in tolerations.iter().enumerate() {
        let ip = p.index(i);
        let key = s(t, "key");
        let op = s(t, "operator");
        let effect = s(t, "effect");
        if !key.is_empty() {
            each_msg(errs, &ip.child("key"), key, is_qualified_name(key));
        }
        if key.is_empty() && op != "Exists" {
            errs.push(FieldError::invalid(
                ip.child("operator"),
                json!(op),
                "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
            ));
        }
        if present(t, "tolerationSeconds") && effect != "NoExecute" {
            errs.push(FieldError::invalid(
                ip.child("effect"),
                json!(effect),
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            ));
        }
        match op {
            "Equal" | "" => {
                let msgs = is_valid_label_value(s(t, "value"));
                if !msgs.is_empty() {
                    errs.push(FieldError::invalid(
                        ip.child("operator"),
                        json!(s(t, "value")),
                        msgs.join(";"),
                    ));
                }
            }
            "Exists" => {
                if !s(t, "value").is_empty() {
                    errs.push(FieldError::invalid(
                        ip.child("operator"),
                        t.clone(),
                        "value must be empty when `operator` is 'Exists'",
                    ));
                }
            }
            other => not_supported(errs, ip.child("operator"), other, &["Equal", "Exists"]),
        }
        if !effect.is_empty() && !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect)
        {
            not_supported(
                errs,
                ip.child("effect"),
                effect,
                &["NoSchedule", "PreferNoSchedule", "NoExecute"],
            );
        }
    }
}

const POD_UPDATABLE: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

fn validate_pod_update(errs: &mut Errs, new: &Value, old: &Value) {
    let sp = Path::new("spec");
    let empty = json!({});
    let new_spec = new.get("spec").unwrap_or(&empty);
    let old_spec = old.get("spec").unwrap_or(&empty);
    match (
        new_spec
            .get("activeDeadlineSeconds")
            .and_then(Value::as_i64),
        old_spec
            .get("activeDeadlineSeconds")
            .and_then(Value::as_i64),
    ) {
        (Some(n), Some(o)) if o < n => {
            errs.push(FieldError::invalid(
                sp.child("activeDeadlineSeconds"),
                json!(n),
                "must be less than or equal to previous value",
            ));
            return;
        }
        (None, Some(_)) => {
            errs.push(FieldError::invalid(
                sp.child("activeDeadlineSeconds"),
                Value::Null,
                "must not update from a positive integer to nil value",
            ));
        }
        _ => {}
    }
    let old_tols = arr(old_spec, "tolerations");
    let new_tols = arr(new_spec, "tolerations");
    for o in old_tols {
        let mut oc = o.clone();
        let found = new_tols.iter().any(|n| {
            if let Value::Object(m) = &mut oc {
                match n.get("tolerationSeconds") {
                    Some(v) => m.insert("tolerationSeconds".into(), v.clone()),
                    None => m.remove("tolerationSeconds"),
                };
            }
            &oc == n
        });
        if !found {
            errs.push(FieldError::forbidden(
                sp.child("tolerations"),
                "existing toleration can not be modified except its tolerationSeconds",
            ));
            return;
        }
    }
    // Replace the updatable fields with the old values; anything else that differs is forbidden.
    let mut munged = new_spec.clone();
    for list in ["containers", "initContainers"] {
        let old_list = arr(old_spec, list);
        if let Some(Value::Array(items)) = munged.get_mut(list) {
            if items.len() != old_list.len() {
                continue;
            }
            for (item, o) in items.iter_mut().zip(old_list) {
                if let (Value::Object(m), Some(img)) = (item, o.get("image")) {
                    m.insert("image".into(), img.clone());
                }
            }
        }
    }
    if let Value::Object(m) = &mut munged {
        for key in ["activeDeadlineSeconds", "tolerations"] {
            match old_spec.get(key) {
                Some(v) => m.insert(key.into(), v.clone()),
                None => m.remove(key),
            };
        }
        let old_grace = old_spec
            .get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64);
        let new_grace = new_spec
            .get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64);
        if old_grace.is_some_and(|g| g < 0) && new_grace == Some(1) {
            m.insert("terminationGracePeriodSeconds".into(), json!(old_grace));
        }
    }
    if &munged != old_spec {
        let mut changed = Vec::new();
        diff_paths(old_spec, &munged, "spec", &mut changed);
        errs.push(FieldError::forbidden(
            &sp,
            format!("{POD_UPDATABLE}\n  changed: {}", changed.join(", ")),
        ));
    }
}

/// Paths where two JSON values differ (a short stand-in for upstream's `cmp.Diff`).
fn diff_paths(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                diff_paths(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &format!("{path}.{k}"),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff_paths(p, q, &format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}

fn validate_service(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let sp = Path::new("spec");
    let ty = s(spec, "type");
    let headless = s(spec, "clusterIP") == "None";
    let ports = arr(spec, "ports");
    if ports.is_empty() && !headless && ty != "ExternalName" {
        errs.push(FieldError::required(sp.child("ports"), ""));
    }
    match ty {
        "ClusterIP" | "NodePort" | "LoadBalancer" => {}
        "ExternalName" => {
            let cips = arr(spec, "clusterIPs");
            if !s(spec, "clusterIP").is_empty() || !cips.is_empty() {
                errs.push(FieldError::forbidden(
                    sp.child("clusterIPs"),
                    "may not be set for ExternalName services",
                ));
            }
            let en = s(spec, "externalName");
            if en.is_empty() {
                errs.push(FieldError::required(sp.child("externalName"), ""));
            } else {
                let trimmed = en.strip_suffix('.').unwrap_or(en);
                each_msg(
                    errs,
                    &sp.child("externalName"),
                    en,
                    is_dns1123_subdomain(trimmed),
                );
            }
        }
        _ => enum_field(
            errs,
            sp.child("type"),
            ty,
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        ),
    }
    let pp = sp.child("ports");
    let mut names = BTreeSet::new();
    let mut keys = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let ip = pp.index(i);
        let name = s(port, "name");
        if ports.len() > 1 && name.is_empty() {
            errs.push(FieldError::required(ip.child("name"), ""));
        } else if !name.is_empty() {
            dns_label(errs, &ip.child("name"), name);
            if !names.insert(name) {
                errs.push(FieldError::duplicate(ip.child("name"), json!(name)));
            }
        }
        let num = port.get("port").and_then(Value::as_i64).unwrap_or(0);
        for m in is_valid_port_num(num) {
            errs.push(FieldError::invalid(ip.child("port"), json!(num), m));
        }
        enum_field(errs, ip.child("protocol"), s(port, "protocol"), &PROTOCOLS);
        if ty != "ExternalName" || present(port, "targetPort") {
            port_num_or_name(errs, ip.child("targetPort"), port.get("targetPort"));
        }
        let node_port = port.get("nodePort").and_then(Value::as_i64).unwrap_or(0);
        if ty == "ClusterIP" && node_port != 0 {
            errs.push(FieldError::forbidden(
                ip.child("nodePort"),
                "may not be used when `type` is 'ClusterIP'",
            ));
        }
        if !keys.insert((num, s(port, "protocol").to_string())) {
            errs.push(FieldError::duplicate(
                &ip,
                json!(format!("{num}/{}", s(port, "protocol"))),
            ));
        }
    }
    let sa = s(spec, "sessionAffinity");
    if !sa.is_empty() && sa != "None" && sa != "ClientIP" {
        not_supported(errs, sp.child("sessionAffinity"), sa, &["ClientIP", "None"]);
    }
    validate_labels(errs, &strmap(spec, "selector"), &sp.child("selector"));
    if let Some(old) = old {
        let old_spec = old.get("spec").unwrap_or(&empty);
        let old_ty = s(old_spec, "type");
        let old_headless = s(old_spec, "clusterIP") == "None";
        if ty != "ExternalName" && old_ty != "ExternalName" && !(headless && old_headless) {
            let new_ips: Vec<Value> = arr(spec, "clusterIPs").to_vec();
            let old_ips = arr(old_spec, "clusterIPs");
            let path = sp.child("clusterIPs").index(0);
            if new_ips.is_empty() && !old_ips.is_empty() {
                errs.push(FieldError::invalid(
                    path,
                    json!(new_ips),
                    "primary clusterIP can not be unset",
                ));
            } else if let (Some(n), Some(o)) = (new_ips.first(), old_ips.first())
                && n != o
            {
                errs.push(FieldError::invalid(
                    path,
                    json!(new_ips),
                    "may not change once set",
                ));
            }
        }
    }
}

fn validate_node(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let empty_spec = json!({});
    let spec_v = obj.get("spec").unwrap_or(&empty_spec);
    let cp = Path::new("spec").child("podCIDRs");
    let cidrs = arr(spec_v, "podCIDRs");
    for (i, c) in cidrs.iter().enumerate() {
        let c = c.as_str().unwrap_or("");
        if !is_valid_cidr(c) {
            errs.push(FieldError::invalid(
                cp.index(i),
                json!(c),
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            ));
        }
    }
    if cidrs.len() > 2 {
        errs.push(FieldError::invalid(
            &cp,
            json!(cidrs),
            "may specify no more than one CIDR for each IP family",
        ));
    }
    if let Some(old) = old {
        let old_spec = old.get("spec").unwrap_or(&empty_spec);
        let old_cidrs = arr(old_spec, "podCIDRs");
        if !old_cidrs.is_empty() && old_cidrs != cidrs {
            errs.push(FieldError::forbidden(&cp, "may not change once set"));
        }
        let old_provider = s(old_spec, "providerID");
        if !old_provider.is_empty() && old_provider != s(spec_v, "providerID") {
            errs.push(FieldError::forbidden(
                Path::new("spec").child("providerID"),
                "may not change once set",
            ));
        }
    }
    let tp = Path::new("spec").child("taints");
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let mut unique = BTreeSet::new();
    for (i, t) in arr(spec, "taints").iter().enumerate() {
        let ip = tp.index(i);
        let key = s(t, "key");
        each_msg(errs, &ip.child("key"), key, is_qualified_name(key));
        let msgs = is_valid_label_value(s(t, "value"));
        if !msgs.is_empty() {
            errs.push(FieldError::invalid(
                ip.child("value"),
                json!(s(t, "value")),
                msgs.join(";"),
            ));
        }
        let effect = s(t, "effect");
        enum_field(
            errs,
            ip.child("effect"),
            effect,
            &["NoSchedule", "PreferNoSchedule", "NoExecute"],
        );
        if !unique.insert((effect, key)) {
            let mut e = FieldError::duplicate(&ip, t.clone());
            e.detail = "taints must be unique by key and effect pair".to_string();
            errs.push(e);
        }
    }
}

fn validate_namespace(errs: &mut Errs, obj: &Value) {
    let fp = Path::new("spec").child("finalizers");
    let empty = json!({});
    for (i, f) in arr(obj.get("spec").unwrap_or(&empty), "finalizers")
        .iter()
        .enumerate()
    {
        let f = f.as_str().unwrap_or("");
        let ip = fp.index(i);
        each_msg(errs, &ip, f, is_qualified_name(f));
        if !f.contains('/') && !STANDARD_FINALIZERS.contains(&f) {
            errs.push(FieldError::invalid(
                ip,
                json!(f),
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
    }
}

fn data_keys(errs: &mut Errs, obj: &Value, field: &str) -> usize {
    let mut size = 0;
    if let Some(m) = obj.get(field).and_then(Value::as_object) {
        for (k, v) in m {
            each_msg(errs, &Path::new(field).key(k), k, is_config_map_key(k));
            size += v.as_str().map_or(0, str::len);
        }
    }
    size
}

fn immutable_data(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let Some(old) = old else { return };
    if old.get("immutable").and_then(Value::as_bool) != Some(true) {
        return;
    }
    if obj.get("immutable").and_then(Value::as_bool) != Some(true) {
        errs.push(FieldError::forbidden(
            "immutable",
            "field is immutable when `immutable` is set",
        ));
    }
    for f in ["data", "binaryData"] {
        if obj.get(f) != old.get(f) {
            errs.push(FieldError::forbidden(
                f,
                "field is immutable when `immutable` is set",
            ));
        }
    }
}

fn validate_config_map(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let mut size = data_keys(errs, obj, "data");
    if let (Some(d), Some(b)) = (
        obj.get("data").and_then(Value::as_object),
        obj.get("binaryData").and_then(Value::as_object),
    ) {
        for k in d.keys().filter(|k| b.contains_key(*k)) {
            errs.push(FieldError::invalid(
                Path::new("data").key(k),
                json!(k),
                "duplicate of key present in binaryData",
            ));
        }
    }
    size += data_keys(errs, obj, "binaryData");
    if size > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long("", MAX_SECRET_SIZE));
    }
    immutable_data(errs, obj, old);
}

fn validate_secret(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let size = data_keys(errs, obj, "data");
    if size > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long("data", MAX_SECRET_SIZE));
    }
    let data = obj
        .get("data")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let dp = Path::new("data");
    let sa_name = obj
        .pointer("/metadata/annotations/kubernetes.io~1service-account.name")
        .and_then(Value::as_str)
        .unwrap_or("");
    match s(obj, "type") {
        "kubernetes.io/tls" => {
            for k in ["tls.crt", "tls.key"] {
                if !data.contains_key(k) {
                    errs.push(FieldError::required(dp.key(k), ""));
                }
            }
        }
        "kubernetes.io/dockerconfigjson" | "kubernetes.io/dockercfg" | "kubernetes.io/ssh-auth" => {
            let key = match s(obj, "type") {
                "kubernetes.io/dockerconfigjson" => ".dockerconfigjson",
                "kubernetes.io/dockercfg" => ".dockercfg",
                _ => "ssh-privatekey",
            };
            if !data.contains_key(key) {
                errs.push(FieldError::required(dp.key(key), ""));
            }
        }
        "kubernetes.io/basic-auth"
            if !data.contains_key("username") && !data.contains_key("password") =>
        {
            errs.push(FieldError::required(dp.key("username"), ""));
            errs.push(FieldError::required(dp.key("password"), ""));
        }
        "kubernetes.io/service-account-token" if sa_name.is_empty() => {
            errs.push(FieldError::required(
                Path::new("metadata")
                    .child("annotations")
                    .key("kubernetes.io/service-account.name"),
                "",
            ));
        }
        _ => {}
    }
    if let Some(old) = old
        && s(obj, "type") != s(old, "type")
    {
        errs.push(FieldError::invalid(
            "type",
            json!(s(obj, "type")),
            "field is immutable",
        ));
    }
    immutable_data(errs, obj, old);
}

fn validate_event(errs: &mut Errs, obj: &Value) {
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let ins = obj
        .pointer("/involvedObject/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mismatch = if ins.is_empty() {
        !ns.is_empty() && ns != "default"
    } else {
        ns != ins
    };
    if mismatch {
        errs.push(FieldError::invalid(
            Path::new("involvedObject").child("namespace"),
            json!(ins),
            "does not match event.namespace",
        ));
    }
}

fn validate_lease(errs: &mut Errs, obj: &Value) {
    let sp = Path::new("spec");
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    if let Some(d) = spec.get("leaseDurationSeconds").and_then(Value::as_i64)
        && d <= 0
    {
        errs.push(FieldError::invalid(
            sp.child("leaseDurationSeconds"),
            json!(d),
            "must be greater than 0",
        ));
    }
    nonnegative(errs, sp.child("leaseTransitions"), spec, "leaseTransitions");
}

fn validate_endpoint_slice(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let at = s(obj, "addressType");
    enum_field(
        errs,
        Path::new("addressType"),
        at,
        &["FQDN", "IPv4", "IPv6"],
    );
    let ep = Path::new("endpoints");
    for (i, e) in arr(obj, "endpoints").iter().enumerate() {
        let ap = ep.index(i).child("addresses");
        let addrs = arr(e, "addresses");
        if addrs.is_empty() || addrs.len() > 100 {
            errs.push(FieldError::invalid(
                &ap,
                json!(addrs.len()),
                "must contain at least 1 and at most 100 addresses",
            ));
        }
        for (j, a) in addrs.iter().enumerate() {
            let a = a.as_str().unwrap_or("");
            let ok = match at {
                "IPv4" => a.parse::<std::net::Ipv4Addr>().is_ok(),
                "IPv6" => a.parse::<std::net::Ipv6Addr>().is_ok(),
                _ => is_dns1123_subdomain(a).is_empty(),
            };
            if !ok {
                let what = match at {
                    "IPv4" => "must be a valid IPv4 address",
                    "IPv6" => "must be a valid IPv6 address",
                    _ => "must be a valid FQDN",
                };
                errs.push(FieldError::invalid(ap.index(j), json!(a), what));
            }
        }
    }
    if let Some(old) = old
        && s(old, "addressType") != at
    {
        errs.push(FieldError::invalid(
            "addressType",
            json!(at),
            "field is immutable",
        ));
    }
}

fn validate_workload(errs: &mut Errs, gvk: &Gvk, obj: &Value, old: Option<&Value>) {
    let sp = Path::new("spec");
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    if gvk.kind != "DaemonSet" {
        nonnegative(errs, sp.child("replicas"), spec, "replicas");
    }
    let template_labels = spec
        .pointer("/template/metadata/labels")
        .cloned()
        .unwrap_or_else(|| json!({}));
    match spec.get("selector").filter(|v| !v.is_null()) {
        None => errs.push(FieldError::required(sp.child("selector"), "")),
        Some(sel) => {
            let parsed: Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector, _> =
                serde_json::from_value(sel.clone());
            match parsed
                .map_err(|e| e.to_string())
                .and_then(|s| crate::selector::from_metav1(&s).map_err(|e| e.to_string()))
            {
                Err(e) => errs.push(FieldError::invalid(sp.child("selector"), sel.clone(), e)),
                Ok(selector) if selector.is_empty() => {
                    let what = match gvk.kind.as_str() {
                        "Deployment" => "empty selector is invalid for deployment",
                        "DaemonSet" => "empty selector is invalid for daemonset",
                        _ => "empty selector is invalid for deployment",
                    };
                    errs.push(FieldError::invalid(sp.child("selector"), sel.clone(), what));
                }
                Ok(selector) => {
                    let labels = strmap(&json!({"l": template_labels}), "l");
                    if !selector.matches(&labels) {
                        errs.push(FieldError::invalid(
                            sp.child("template").child("metadata").child("labels"),
                            template_labels.clone(),
                            "`selector` does not match template `labels`",
                        ));
                    }
                }
            }
        }
    }
    let tp = sp.child("template");
    let tmeta = spec
        .pointer("/template/metadata")
        .cloned()
        .unwrap_or_else(|| json!({}));
    validate_labels(
        errs,
        &strmap(&tmeta, "labels"),
        &tp.child("metadata").child("labels"),
    );
    let tspec = spec
        .pointer("/template/spec")
        .cloned()
        .unwrap_or_else(|| json!({}));
    validate_pod_spec(errs, &tspec, &tp.child("spec"), false);
    let rp = s(&tspec, "restartPolicy");
    if rp != "Always" && !rp.is_empty() {
        not_supported(
            errs,
            tp.child("spec").child("restartPolicy"),
            rp,
            &["Always"],
        );
    }
    if !arr(&tspec, "ephemeralContainers").is_empty() {
        errs.push(FieldError::forbidden(
            tp.child("spec").child("ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
    if gvk.kind == "Deployment" {
        let st = spec.get("strategy").cloned().unwrap_or_else(|| json!({}));
        let ty = s(&st, "type");
        enum_field(
            errs,
            sp.child("strategy").child("type"),
            ty,
            &["Recreate", "RollingUpdate"],
        );
        if ty == "Recreate" && present(&st, "rollingUpdate") {
            errs.push(FieldError::forbidden(
                sp.child("strategy").child("rollingUpdate"),
                "may not be specified when strategy `type` is 'Recreate'",
            ));
        }
        if ty == "RollingUpdate"
            && let Some(ru) = st.get("rollingUpdate").filter(|v| !v.is_null())
        {
            let rp = sp.child("strategy").child("rollingUpdate");
            let unavailable = int_or_percent(
                errs,
                ru.get("maxUnavailable"),
                rp.child("maxUnavailable"),
                true,
            );
            let surge = int_or_percent(errs, ru.get("maxSurge"), rp.child("maxSurge"), false);
            if unavailable == Some(0) && surge == Some(0) {
                let shown = match ru.get("maxUnavailable") {
                    Some(Value::String(t)) => json!({"$stringer": t}),
                    Some(other) => other.clone(),
                    None => Value::Null,
                };
                errs.push(FieldError::invalid(
                    rp.child("maxUnavailable"),
                    shown,
                    "may not be 0 when `maxSurge` is 0",
                ));
            }
        }
        nonnegative(
            errs,
            sp.child("revisionHistoryLimit"),
            spec,
            "revisionHistoryLimit",
        );
        if let (Some(pd), min_ready) = (
            spec.get("progressDeadlineSeconds").and_then(Value::as_i64),
            spec.get("minReadySeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0),
        ) && pd <= min_ready
        {
            errs.push(FieldError::invalid(
                sp.child("progressDeadlineSeconds"),
                json!(pd),
                "must be greater than minReadySeconds",
            ));
        }
    }
    if gvk.kind == "DaemonSet" {
        let ty = spec
            .pointer("/updateStrategy/type")
            .and_then(Value::as_str)
            .unwrap_or("");
        enum_field(
            errs,
            sp.child("updateStrategy").child("type"),
            ty,
            &["OnDelete", "RollingUpdate"],
        );
    }
    if let Some(old) = old
        && spec.get("selector") != old.pointer("/spec/selector")
    {
        errs.push(FieldError::invalid(
            sp.child("selector"),
            spec.get("selector").cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

const SYSTEM_PRIORITY_CLASSES: [(&str, i64); 2] = [
    ("system-node-critical", 2_000_001_000),
    ("system-cluster-critical", 2_000_000_000),
];

fn validate_priority_class(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let value = obj.get("value").and_then(Value::as_i64).unwrap_or(0);
    if name.starts_with("system-") {
        let problem = match SYSTEM_PRIORITY_CLASSES.iter().find(|(n, _)| *n == name) {
            None => Some(format!("{name} is not a known system priority class")),
            Some((_, v)) if *v != value => {
                Some(format!("value of {name} PriorityClass must be {v}"))
            }
            Some(_) if obj.get("globalDefault").and_then(Value::as_bool) == Some(true) => Some(
                format!("globalDefault of {name} PriorityClass must be false"),
            ),
            Some(_) => None,
        };
        if let Some(p) = problem {
            errs.push(FieldError::forbidden(
                Path::new("metadata").child("name"),
                format!("priority class names with 'system-' prefix are reserved for system use only. error: {p}"),
            ));
        }
    } else if value > 1_000_000_000 {
        errs.push(FieldError::forbidden(
            "value",
            "maximum allowed value of a user defined priority is 1000000000",
        ));
    }
    if let Some(pp) = obj.get("preemptionPolicy").and_then(Value::as_str) {
        enum_field(
            errs,
            Path::new("preemptionPolicy"),
            pp,
            &["PreemptLowerPriority", "Never"],
        );
    }
    if let Some(old) = old {
        if old.get("value") != obj.get("value") {
            errs.push(FieldError::forbidden(
                "value",
                "may not be changed in an update.",
            ));
        }
        if old.get("preemptionPolicy") != obj.get("preemptionPolicy") {
            errs.push(FieldError::invalid(
                "preemptionPolicy",
                obj.get("preemptionPolicy").cloned().unwrap_or(Value::Null),
                "field is immutable",
            ));
        }
    }
}

fn validate_runtime_class(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let h = s(obj, "handler");
    each_msg(errs, &Path::new("handler"), h, name_is_dns_label(h, false));
    if let Some(old) = old
        && s(old, "handler") != h
    {
        errs.push(FieldError::invalid(
            "handler",
            json!(h),
            "field is immutable",
        ));
    }
}

/// A CIDR as upstream's `IsValidCIDR` accepts it (address/prefix within the family's length).
fn is_valid_cidr(c: &str) -> bool {
    let Some((ip, bits)) = c.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => bits <= 32,
        Ok(std::net::IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

fn validate_endpoints(errs: &mut Errs, obj: &Value) {
    let sp = Path::new("subsets");
    for (i, ss) in arr(obj, "subsets").iter().enumerate() {
        let ip = sp.index(i);
        let addrs = arr(ss, "addresses");
        let not_ready = arr(ss, "notReadyAddresses");
        for (key, list) in [("addresses", addrs), ("notReadyAddresses", not_ready)] {
            for (j, a) in list.iter().enumerate() {
                let addr = s(a, "ip");
                if addr.parse::<std::net::IpAddr>().is_err() {
                    errs.push(FieldError::invalid(
                        ip.child(key).index(j).child("ip"),
                        json!(addr),
                        "must be a valid IP address",
                    ));
                }
            }
        }
        let ports = arr(ss, "ports");
        for (j, p) in ports.iter().enumerate() {
            let pp = ip.child("ports").index(j);
            let name = s(p, "name");
            if ports.len() > 1 && name.is_empty() {
                errs.push(FieldError::required(pp.child("name"), ""));
            } else if !name.is_empty() {
                dns_label(errs, &pp.child("name"), name);
            }
            let num = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            for m in is_valid_port_num(num) {
                errs.push(FieldError::invalid(pp.child("port"), json!(num), m));
            }
            enum_field(errs, pp.child("protocol"), s(p, "protocol"), &PROTOCOLS);
        }
    }
}

fn validate_binding(errs: &mut Errs, obj: &Value) {
    let empty = json!({});
    let target = obj.get("target").unwrap_or(&empty);
    let tp = Path::new("target");
    if s(target, "name").is_empty() {
        errs.push(FieldError::required(tp.child("name"), ""));
    }
    let kind = s(target, "kind");
    if !kind.is_empty() && kind != "Node" {
        not_supported(errs, tp.child("kind"), kind, &["Node", "<empty>"]);
    }
}

/// Upstream's `ValidatePositiveIntOrPercent` (and `IsNotMoreThan100Percent` when `max_100`).
fn int_or_percent(errs: &mut Errs, v: Option<&Value>, p: Path, max_100: bool) -> Option<i64> {
    match v {
        Some(Value::Number(n)) => {
            let n = n.as_i64().unwrap_or(0);
            if n < 0 {
                errs.push(FieldError::invalid(
                    &p,
                    json!(n),
                    "must be greater than or equal to 0",
                ));
            }
            Some(n)
        }
        Some(Value::String(sv)) => {
            let pct = sv
                .strip_suffix('%')
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<i64>().ok());
            match pct {
                None => {
                    errs.push(FieldError::invalid(
                        &p,
                        json!({"$stringer": sv}),
                        "must be an integer or percentage (e.g '5%')",
                    ));
                    None
                }
                Some(n) => {
                    if max_100 && n > 100 {
                        errs.push(FieldError::invalid(
                            &p,
                            json!({"$stringer": sv}),
                            "must not be greater than 100%",
                        ));
                    }
                    Some(n)
                }
            }
        }
        _ => None,
    }
}

fn validate_pdb(errs: &mut Errs, obj: &Value) {
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let sp = Path::new("spec");
    if present(spec, "minAvailable") && present(spec, "maxUnavailable") {
        errs.push(FieldError::invalid(
            &sp,
            spec.clone(),
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    int_or_percent(
        errs,
        spec.get("minAvailable"),
        sp.child("minAvailable"),
        true,
    );
    int_or_percent(
        errs,
        spec.get("maxUnavailable"),
        sp.child("maxUnavailable"),
        true,
    );
    if let Some(sel) = spec.get("selector").filter(|v| !v.is_null()) {
        let parsed: Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector, _> =
            serde_json::from_value(sel.clone());
        let checked = parsed
            .map_err(|e| e.to_string())
            .and_then(|sel| crate::selector::from_metav1(&sel).map_err(|e| e.to_string()));
        if let Err(e) = checked {
            errs.push(FieldError::invalid(sp.child("selector"), sel.clone(), e));
        }
    }
    if let Some(p) = spec
        .get("unhealthyPodEvictionPolicy")
        .and_then(Value::as_str)
    {
        enum_field(
            errs,
            sp.child("unhealthyPodEvictionPolicy"),
            p,
            &["AlwaysAllow", "IfHealthyBudget"],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults::default_object;
    use crate::validation::aggregate_messages;

    fn check(kind: &str, group: &str, mut obj: Value, old: Option<Value>) -> Vec<String> {
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

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn valid_pod_has_no_errors() {
        let p = pod(
            json!({"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 80, "name": "http"}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "resources": {"limits": {"cpu": "1", "memory": "64Mi"}},
            "livenessProbe": {"httpGet": {"port": "http"}}}],
            "volumes": [{"name": "data", "emptyDir": {}}]}),
        );
        assert_eq!(check("Pod", "", p, None), Vec::<String>::new());
    }

    #[test]
    fn pod_errors_with_upstream_texts() {
        assert_eq!(
            check("Pod", "", pod(json!({})), None),
            vec!["spec.containers: Required value"]
        );
        let errs = check(
            "Pod",
            "",
            pod(json!({"restartPolicy": "Sometimes", "containers": [{"name": "c", "image": "x"}]})),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\""
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(json!({"containers": [{"name": "", "image": ""}]})),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.containers[0].name: Required value",
                "spec.containers[0].image: Required value"
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"initContainers": [{"name": "c", "image": "x"}], "containers": [{"name": "c", "image": "x"}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec!["spec.initContainers[0].name: Duplicate value: \"c\""]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x", "volumeMounts": [{"name": "data", "mountPath": "/d"}]}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec!["spec.containers[0].volumeMounts[0].name: Not found: \"data\""]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "2"}}}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1"
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpus": "1"}}}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.containers[0].resources.limits[cpus]: Invalid value: cpus: must be a standard resource for containers",
                "spec.containers[0].resources.requests[cpus]: Invalid value: cpus: must be a standard resource for containers",
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(json!({"containers": [{"name": "c", "image": "x",
            "readinessProbe": {"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}}}]})),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.containers[0].readinessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type"
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 70000, "protocol": "TCPX"}]}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
                "spec.containers[0].ports[0].protocol: Unsupported value: \"TCPX\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x"}], "volumes": [{"name": "v", "emptyDir": {}, "hostPath": {"path": "/x"}}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec!["spec.volumes[0].hostPath: Forbidden: may not specify more than 1 volume type"]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x"}], "terminationGracePeriodSeconds": -1}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.terminationGracePeriodSeconds: Invalid value: -1: must be greater than or equal to 0"
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x"}], "tolerations": [{"key": "", "operator": "Equal"}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.tolerations[0].operator: Invalid value: \"Equal\": operator must be Exists when `key` is empty, which means \"match all values and all keys\""
            ]
        );
    }

    #[test]
    fn metadata_errors() {
        let errs = check(
            "Pod",
            "",
            json!({"metadata": {"name": "Foo_Bar", "namespace": "default"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "metadata.name: Invalid value: \"Foo_Bar\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
        let errs = check("Namespace", "", json!({"metadata": {"name": "a.b"}}), None);
        assert_eq!(
            errs,
            vec!["metadata.name: Invalid value: \"a.b\": must not contain dots"]
        );
        let errs = check(
            "Namespace",
            "",
            json!({"metadata": {"name": "a", "namespace": "x"}}),
            None,
        );
        assert_eq!(
            errs,
            vec!["metadata.namespace: Forbidden: not allowed on this type"]
        );
        let errs = check("ConfigMap", "", json!({"metadata": {"name": "c"}}), None);
        assert_eq!(errs, vec!["metadata.namespace: Required value"]);
        let errs = check(
            "ConfigMap",
            "",
            json!({"metadata": {"name": "c", "namespace": "d", "labels": {"a": "-x"}}}),
            None,
        );
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].starts_with("metadata.labels: Invalid value: \"-x\": a valid label must be")
        );
        let errs = check("ConfigMap", "", json!({"metadata": {"name": ""}}), None);
        assert_eq!(
            errs[0],
            "metadata.name: Required value: name or generateName is required"
        );
        let errs = check(
            "Service",
            "",
            json!({"metadata": {"name": "1svc", "namespace": "d"}, "spec": {"ports": [{"port": 80}]}}),
            None,
        );
        assert!(errs[0].starts_with(
            "metadata.name: Invalid value: \"1svc\": a DNS-1035 label must consist of"
        ));
    }

    #[test]
    fn pod_updates() {
        let old = pod(
            json!({"containers": [{"name": "c", "image": "busybox:1", "command": ["sleep", "1"]}]}),
        );
        let new_image = pod(
            json!({"containers": [{"name": "c", "image": "busybox:2", "command": ["sleep", "1"]}]}),
        );
        assert_eq!(
            check("Pod", "", new_image, Some(old.clone())),
            Vec::<String>::new()
        );
        let new_cmd = pod(
            json!({"containers": [{"name": "c", "image": "busybox:1", "command": ["sleep", "2"]}]}),
        );
        let errs = check("Pod", "", new_cmd, Some(old.clone()));
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].starts_with(&format!("spec: Forbidden: {POD_UPDATABLE}\n")),
            "{}",
            errs[0]
        );
        assert!(errs[0].contains("spec.containers[0].command[1]"));
        let more_tolerations = pod(
            json!({"containers": [{"name": "c", "image": "busybox:1", "command": ["sleep", "1"]}],
            "tolerations": [{"key": "k", "operator": "Exists"}]}),
        );
        assert_eq!(
            check("Pod", "", more_tolerations, Some(old)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn services() {
        let svc = |spec: Value| json!({"metadata": {"name": "s", "namespace": "d"}, "spec": spec});
        assert_eq!(
            check("Service", "", svc(json!({})), None),
            vec!["spec.ports: Required value"]
        );
        assert_eq!(
            check("Service", "", svc(json!({"clusterIP": "None"})), None),
            Vec::<String>::new()
        );
        assert_eq!(
            check(
                "Service",
                "",
                svc(json!({"type": "Foo", "ports": [{"port": 80}]})),
                None
            ),
            vec![
                "spec.type: Unsupported value: \"Foo\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""
            ]
        );
        assert_eq!(
            check(
                "Service",
                "",
                svc(json!({"ports": [{"port": 80}, {"port": 81}]})),
                None
            ),
            vec![
                "spec.ports[0].name: Required value",
                "spec.ports[1].name: Required value"
            ]
        );
        let old = svc(
            json!({"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1"], "ports": [{"port": 80}]}),
        );
        let new = svc(
            json!({"clusterIP": "10.0.0.2", "clusterIPs": ["10.0.0.2"], "ports": [{"port": 80}]}),
        );
        assert_eq!(
            check("Service", "", new, Some(old)),
            vec![
                "spec.clusterIPs[0]: Invalid value: []string{\"10.0.0.2\"}: may not change once set"
            ]
        );
    }

    #[test]
    fn workloads() {
        let d = json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "other"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        assert_eq!(
            check("Deployment", "apps", d, None),
            vec![
                "spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"other\"}: `selector` does not match template `labels`"
            ]
        );
        let d = json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}});
        assert_eq!(
            check("Deployment", "apps", d, None),
            vec![
                "spec.selector: Required value",
                "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
            ]
        );
        let ok = json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        assert_eq!(
            check("ReplicaSet", "apps", ok.clone(), None),
            Vec::<String>::new()
        );
        assert_eq!(check("DaemonSet", "apps", ok, None), Vec::<String>::new());
    }

    #[test]
    fn other_kinds() {
        assert_eq!(
            check(
                "PriorityClass",
                "scheduling.k8s.io",
                json!({"metadata": {"name": "high"}, "value": 2_000_000_000}),
                None
            ),
            vec![
                "value: Forbidden: maximum allowed value of a user defined priority is 1000000000"
            ]
        );
        assert_eq!(
            check(
                "PriorityClass",
                "scheduling.k8s.io",
                json!({"metadata": {"name": "system-foo"}, "value": 1}),
                None
            ),
            vec![
                "metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use only. error: system-foo is not a known system priority class"
            ]
        );
        let cm = check(
            "ConfigMap",
            "",
            json!({"metadata": {"name": "c", "namespace": "d"}, "data": {"a b": "1"}}),
            None,
        );
        assert_eq!(
            cm,
            vec![
                "data[a b]: Invalid value: \"a b\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
            ]
        );
        assert_eq!(
            check(
                "EndpointSlice",
                "discovery.k8s.io",
                json!({"metadata": {"name": "e", "namespace": "d"}, "addressType": "IPv5"}),
                None
            ),
            vec![
                "addressType: Unsupported value: \"IPv5\": supported values: \"FQDN\", \"IPv4\", \"IPv6\""
            ]
        );
        assert_eq!(
            check(
                "EndpointSlice",
                "discovery.k8s.io",
                json!({"metadata": {"name": "e", "namespace": "d"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.300"]}]}),
                None
            ),
            vec![
                "endpoints[0].addresses[0]: Invalid value: \"10.0.0.300\": must be a valid IPv4 address"
            ]
        );
        let rc = check(
            "RuntimeClass",
            "node.k8s.io",
            json!({"metadata": {"name": "r"}, "handler": "Run_C"}),
            None,
        );
        assert!(rc[0].starts_with("handler: Invalid value: \"Run_C\": a lowercase RFC 1123 label"));
        assert_eq!(
            check(
                "Event",
                "",
                json!({"metadata": {"name": "e", "namespace": "a"}, "involvedObject": {"namespace": "b"}}),
                None
            ),
            vec!["involvedObject.namespace: Invalid value: \"b\": does not match event.namespace"]
        );
        assert_eq!(
            check(
                "Secret",
                "",
                json!({"metadata": {"name": "s", "namespace": "d"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}}),
                None
            ),
            vec!["data[tls.key]: Required value"]
        );
        assert_eq!(
            check(
                "Lease",
                "coordination.k8s.io",
                json!({"metadata": {"name": "n", "namespace": "kube-node-lease"}, "spec": {"leaseDurationSeconds": 0}}),
                None
            ),
            vec!["spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"]
        );
        let node = check(
            "Node",
            "",
            json!({"metadata": {"name": "n"}, "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "a", "effect": "NoSchedule"}]}}),
            None,
        );
        assert_eq!(node.len(), 1);
        assert!(node[0].ends_with(": taints must be unique by key and effect pair"));
        let msg = aggregate_messages(&validate_object(
            &Gvk::new("", "v1", "Pod"),
            &json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"containers": []}}),
            None,
        ));
        assert_eq!(
            msg.as_deref(),
            Some(
                "[spec.terminationGracePeriodSeconds: Required value, spec.containers: Required value, spec.restartPolicy: Required value, spec.dnsPolicy: Required value]"
            )
        );
    }

    #[test]
    fn more_kinds() {
        let old = json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": ["10.244.0.0/24"]}});
        let new = json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": ["10.244.1.0/24"]}});
        assert_eq!(
            check("Node", "", new, Some(old)),
            vec!["spec.podCIDRs: Forbidden: may not change once set"]
        );
        assert_eq!(
            check(
                "Node",
                "",
                json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": ["10.244.0.0/33"]}}),
                None
            ),
            vec![
                "spec.podCIDRs[0]: Invalid value: \"10.244.0.0/33\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
            ]
        );
        let ep = json!({"metadata": {"name": "e", "namespace": "d"}, "subsets": [{"addresses": [{"ip": "nope"}], "ports": [{"port": 80}]}]});
        assert_eq!(
            check("Endpoints", "", ep, None),
            vec!["subsets[0].addresses[0].ip: Invalid value: \"nope\": must be a valid IP address"]
        );
        let pdb =
            json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"minAvailable": "150%"}});
        assert_eq!(
            check("PodDisruptionBudget", "policy", pdb, None),
            vec!["spec.minAvailable: Invalid value: 150%: must not be greater than 100%"]
        );
        let d = json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {"selector": {"matchLabels": {"app": "web"}},
            "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        assert_eq!(
            check("Deployment", "apps", d, None),
            vec![
                "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0%: may not be 0 when `maxSurge` is 0"
            ]
        );
        let b = json!({"metadata": {"name": "p", "namespace": "d"}, "target": {"kind": "Pod", "name": ""}});
        assert_eq!(
            check("Binding", "", b, None),
            vec![
                "target.name: Required value",
                "target.kind: Unsupported value: \"Pod\": supported values: \"Node\", \"<empty>\"",
            ]
        );
        let ds = json!({"metadata": {"name": "d", "namespace": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}},
            "updateStrategy": {"type": "Sometimes"},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        assert_eq!(
            check("DaemonSet", "apps", ds, None),
            vec![
                "spec.updateStrategy.type: Unsupported value: \"Sometimes\": supported values: \"OnDelete\", \"RollingUpdate\""
            ]
        );
    }

    #[test]
    fn wrong_types_are_invalid() {
        let p = json!({"metadata": {"name": "p", "namespace": "d", "labels": {"version": 1}},
            "spec": {"containers": [{"name": "c", "image": "x"}]}});
        let errs = check("Pod", "", p, None);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("metadata.labels.version: Invalid value: invalid type: integer `1`, expected a string"), "{}", errs[0]);
    }

    #[test]
    fn volume_items() {
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x"}], "volumes": [
            {"name": "cfg", "configMap": {"name": "c", "defaultMode": 1000, "items": [{"key": "a", "path": "../etc/passwd"}, {"key": "", "path": "/abs"}]}}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.volumes[0].configMap.defaultMode: Invalid value: 1000: must be a number between 0 and 0777 (octal), both inclusive",
                "spec.volumes[0].configMap.items[0].path: Invalid value: \"../etc/passwd\": must not contain '..'",
                "spec.volumes[0].configMap.items[1].key: Required value",
                "spec.volumes[0].configMap.items[1].path: Invalid value: \"/abs\": must be a relative path",
            ]
        );
    }

    #[test]
    fn security_contexts() {
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"securityContext": {"runAsUser": -1, "seccompProfile": {"type": "Localhost"}},
            "containers": [{"name": "c", "image": "x", "securityContext": {"runAsGroup": 2147483648_i64,
                "seccompProfile": {"type": "Bogus"}, "allowPrivilegeEscalation": false, "privileged": true}}]}),
            ),
            None,
        );
        assert_eq!(errs.len(), 5, "{errs:?}");
        assert_eq!(
            errs[0],
            "spec.containers[0].securityContext.runAsGroup: Invalid value: 2147483648: must be between 0 and 2147483647, inclusive"
        );
        assert_eq!(
            errs[1],
            "spec.containers[0].securityContext.seccompProfile.type: Unsupported value: \"Bogus\": supported values: \"Localhost\", \"RuntimeDefault\", \"Unconfined\""
        );
        assert!(
            errs[2].starts_with("spec.containers[0].securityContext: Invalid value: "),
            "{}",
            errs[2]
        );
        assert!(errs[2].ends_with(
            ": cannot set `allowPrivilegeEscalation` to false and `privileged` to true"
        ));
        assert_eq!(
            errs[3],
            "spec.securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive"
        );
        assert_eq!(
            errs[4],
            "spec.securityContext.seccompProfile.localhostProfile: Required value: must be set when seccomp type is Localhost"
        );
    }

    #[test]
    fn malformed_quantity_is_invalid() {
        let errs = check(
            "Pod",
            "",
            pod(json!({"containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"memory": "1Gb"}, "requests": {"memory": "1Gb"}}}]})),
            None,
        );
        let quantity_err = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
        assert_eq!(
            errs,
            vec![
                format!(
                    "spec.containers[0].resources.limits[memory]: Invalid value: \"1Gb\": {quantity_err}"
                ),
                format!(
                    "spec.containers[0].resources.requests[memory]: Invalid value: \"1Gb\": {quantity_err}"
                ),
            ]
        );
    }

    #[test]
    fn kubelet_static_pod() {
        let mut p: Pod = serde_json::from_value(json!({"metadata": {"name": "static-web", "namespace": "default"},
            "spec": {"containers": [{"name": "web", "image": "nginx:1", "ports": [{"containerPort": 80}]}]}})).unwrap_or_default();
        crate::defaults::default_pod(&mut p);
        assert!(validate_pod_spec_for_kubelet(&p).is_empty());
        let mut bad: Pod = serde_json::from_value(json!({"metadata": {"name": "Bad", "namespace": "default"}, "spec": {"containers": []}})).unwrap_or_default();
        crate::defaults::default_pod(&mut bad);
        let errs: Vec<String> = validate_pod_spec_for_kubelet(&bad)
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[1], "spec.containers: Required value");
    }
}
