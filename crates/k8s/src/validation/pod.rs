//! Pod spec validation (containers, volumes, resources, probes, security contexts) and
//! upstream's pod update rules.

use serde_json::{Value, json};
use std::collections::BTreeSet;

use super::common::{
    Errs, NameFn, PROTOCOLS, arr, dns_label, each_msg, enum_field, is_valid_port_name,
    is_valid_port_num, local_descending_path, name_is_dns_subdomain, nonnegative, not_supported,
    port_num_or_name, present, s, semantic, strmap,
};
use super::meta::validate_labels;
use super::names::{is_config_map_key, is_dns1123_label, is_qualified_name, is_valid_label_value};
use super::{FieldError, Path};
use crate::quantity::parse_quantity;

pub(super) fn validate_pod_spec(errs: &mut Errs, spec: &Value, p: &Path, is_pod: bool) {
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
    super::userns::validate_proc_mounts(errs, spec, p);
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
    if let Some(a) = spec.get("affinity").filter(|v| !v.is_null()) {
        validate_affinity(errs, a, &p.child("affinity"));
    }
    validate_topology_spread(
        errs,
        arr(spec, "topologySpreadConstraints"),
        &p.child("topologySpreadConstraints"),
    );
    super::userns::validate_host_users(errs, spec, p);
    if let Some(dc) = spec.get("dnsConfig").filter(|d| !d.is_null()) {
        let np = p.child("dnsConfig").child("nameservers");
        let servers = arr(dc, "nameservers");
        if servers.len() > 3 {
            errs.push(FieldError::invalid(
                &np,
                json!(servers),
                "must not have more than 3 nameservers",
            ));
        }
        for (i, ns) in servers.iter().enumerate() {
            let ns = ns.as_str().unwrap_or("");
            if ns.parse::<std::net::IpAddr>().is_err() {
                errs.push(FieldError::invalid(
                    np.index(i),
                    json!(ns),
                    "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                ));
            }
        }
    }
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
pub(super) fn validate_volumes(errs: &mut Errs, spec: &Value, p: &Path) -> BTreeSet<String> {
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

pub(super) const FILE_MODE_ERROR: &str =
    "must be a number between 0 and 0777 (octal), both inclusive";

pub(super) fn file_mode(errs: &mut Errs, v: &Value, key: &str, p: &Path) {
    if let Some(m) = v.get(key).and_then(Value::as_i64)
        && !(0..=0o777).contains(&m)
    {
        errs.push(FieldError::invalid(p.child(key), json!(m), FILE_MODE_ERROR));
    }
}

/// Upstream's `validateKeyToPathList` (configMap/secret items; downwardAPI items have a
/// path but no key).
pub(super) fn key_to_path_items(errs: &mut Errs, v: &Value, p: &Path, with_key: bool) {
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
pub(super) const VOLUME_SOURCE_ORDER: &[&str] = &[
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

pub(super) fn validate_container_common(
    errs: &mut Errs,
    c: &Value,
    volumes: &BTreeSet<String>,
    p: &Path,
) {
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

pub(super) fn validate_node_selector_requirement(errs: &mut Errs, rq: &Value, p: &Path) {
    let values = arr(rq, "values");
    let vp = p.child("values");
    match s(rq, "operator") {
        "In" | "NotIn" if values.is_empty() => {
            errs.push(FieldError::required(
                vp,
                "must be specified when `operator` is 'In' or 'NotIn'",
            ));
        }
        "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(FieldError::forbidden(
            vp,
            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        )),
        "Gt" | "Lt" if values.len() != 1 => errs.push(FieldError::required(
            vp,
            "must be specified single value when `operator` is 'Lt' or 'Gt'",
        )),
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => {}
        other => errs.push(FieldError::invalid(
            p.child("operator"),
            json!(other),
            "not a valid selector operator",
        )),
    }
    let key = s(rq, "key");
    each_msg(errs, &p.child("key"), key, is_qualified_name(key));
}

fn validate_node_selector_term(errs: &mut Errs, term: &Value, p: &Path) {
    for (i, rq) in arr(term, "matchExpressions").iter().enumerate() {
        validate_node_selector_requirement(errs, rq, &p.child("matchExpressions").index(i));
    }
    for (i, rq) in arr(term, "matchFields").iter().enumerate() {
        let fp = p.child("matchFields").index(i);
        if s(rq, "key") != "metadata.name" {
            errs.push(FieldError::invalid(
                fp.child("key"),
                json!(s(rq, "key")),
                "not a valid field selector key",
            ));
        }
    }
}

fn weight(errs: &mut Errs, v: &Value, p: &Path) {
    let w = v.get("weight").and_then(Value::as_i64).unwrap_or(0);
    if !(1..=100).contains(&w) {
        errs.push(FieldError::invalid(
            p.child("weight"),
            json!(w),
            "must be in the range 1-100",
        ));
    }
}

fn validate_pod_affinity_term(errs: &mut Errs, term: &Value, p: &Path) {
    if let Some(sel) = term.get("labelSelector").filter(|v| !v.is_null()) {
        super::common::label_selector(errs, p.child("labelSelector"), sel);
    }
    let key = s(term, "topologyKey");
    if key.is_empty() {
        errs.push(FieldError::required(
            p.child("topologyKey"),
            "can not be empty",
        ));
    } else {
        each_msg(errs, &p.child("topologyKey"), key, is_qualified_name(key));
    }
}

/// Upstream's `validateAffinity`: node affinity selector terms and pod (anti-)affinity terms.
fn validate_affinity(errs: &mut Errs, a: &Value, p: &Path) {
    if let Some(na) = a.get("nodeAffinity").filter(|v| !v.is_null()) {
        let np = p.child("nodeAffinity");
        if let Some(req) = na
            .get("requiredDuringSchedulingIgnoredDuringExecution")
            .filter(|v| !v.is_null())
        {
            let rp = np.child("requiredDuringSchedulingIgnoredDuringExecution");
            let terms = arr(req, "nodeSelectorTerms");
            if terms.is_empty() {
                errs.push(FieldError::required(
                    rp.child("nodeSelectorTerms"),
                    "must have at least one node selector term",
                ));
            }
            for (i, t) in terms.iter().enumerate() {
                validate_node_selector_term(errs, t, &rp.child("nodeSelectorTerms").index(i));
            }
        }
        let pp = np.child("preferredDuringSchedulingIgnoredDuringExecution");
        for (i, pref) in arr(na, "preferredDuringSchedulingIgnoredDuringExecution")
            .iter()
            .enumerate()
        {
            let ip = pp.index(i);
            weight(errs, pref, &ip);
            if let Some(t) = pref.get("preference") {
                validate_node_selector_term(errs, t, &ip.child("preference"));
            }
        }
    }
    for kind in ["podAffinity", "podAntiAffinity"] {
        let Some(pa) = a.get(kind).filter(|v| !v.is_null()) else {
            continue;
        };
        let kp = p.child(kind);
        let rp = kp.child("requiredDuringSchedulingIgnoredDuringExecution");
        for (i, t) in arr(pa, "requiredDuringSchedulingIgnoredDuringExecution")
            .iter()
            .enumerate()
        {
            validate_pod_affinity_term(errs, t, &rp.index(i));
        }
        let wp = kp.child("preferredDuringSchedulingIgnoredDuringExecution");
        for (i, w) in arr(pa, "preferredDuringSchedulingIgnoredDuringExecution")
            .iter()
            .enumerate()
        {
            let ip = wp.index(i);
            weight(errs, w, &ip);
            if let Some(t) = w.get("podAffinityTerm") {
                validate_pod_affinity_term(errs, t, &ip.child("podAffinityTerm"));
            }
        }
    }
}

/// Upstream's `validateTopologySpreadConstraints` (maxSkew, topologyKey, whenUnsatisfiable,
/// and no repeated `{topologyKey, whenUnsatisfiable}`).
fn validate_topology_spread(errs: &mut Errs, constraints: &[Value], p: &Path) {
    for (i, c) in constraints.iter().enumerate() {
        let ip = p.index(i);
        let skew = c.get("maxSkew").and_then(Value::as_i64).unwrap_or(0);
        if skew <= 0 {
            errs.push(FieldError::invalid(
                ip.child("maxSkew"),
                json!(skew),
                "must be greater than zero",
            ));
        }
        let key = s(c, "topologyKey");
        if key.is_empty() {
            errs.push(FieldError::required(
                ip.child("topologyKey"),
                "can not be empty",
            ));
        }
        let when = s(c, "whenUnsatisfiable");
        if when != "DoNotSchedule" && when != "ScheduleAnyway" {
            not_supported(
                errs,
                ip.child("whenUnsatisfiable"),
                when,
                &["DoNotSchedule", "ScheduleAnyway"],
            );
        }
        let repeated = constraints[i + 1..]
            .iter()
            .any(|o| s(o, "topologyKey") == key && s(o, "whenUnsatisfiable") == when);
        if repeated {
            errs.push(FieldError::duplicate(
                ip.child("{topologyKey, whenUnsatisfiable}"),
                json!(format!("{{{key}, {when}}}")),
            ));
        }
    }
}

const ID_RANGE: &str = "must be between 0 and 2147483647, inclusive";

/// Upstream's `IsValidUserID`/`IsValidGroupID` for an optional id field.
pub(super) fn id_field(errs: &mut Errs, v: &Value, key: &str, p: &Path) {
    if let Some(id) = v.get(key).and_then(Value::as_i64)
        && !(0..=i64::from(i32::MAX)).contains(&id)
    {
        errs.push(FieldError::invalid(p.child(key), json!(id), ID_RANGE));
    }
}

pub(super) fn validate_seccomp(errs: &mut Errs, sc: &Value, p: &Path) {
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

pub(super) fn validate_pod_security_context(errs: &mut Errs, spec: &Value, p: &Path) {
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

pub(super) fn validate_container_security_context(errs: &mut Errs, sc: &Value, p: &Path) {
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

pub(super) const STANDARD_CONTAINER_RESOURCES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

pub(super) fn validate_resources(errs: &mut Errs, r: &Value, p: &Path) {
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

pub(super) fn host_port_conflicts(errs: &mut Errs, containers: &[Value], p: &Path) {
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

pub(super) fn validate_handler(
    errs: &mut Errs,
    h: &Value,
    kinds: &[&str],
    grace: Option<i64>,
    p: &Path,
) {
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

pub(super) fn validate_lifecycle(errs: &mut Errs, l: &Value, grace: Option<i64>, p: &Path) {
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

pub(super) fn validate_probes(errs: &mut Errs, c: &Value, grace: Option<i64>, p: &Path) {
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

pub(super) fn validate_tolerations(errs: &mut Errs, tolerations: &[Value], p: &Path) {
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

pub(super) const POD_UPDATABLE: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

pub(super) fn validate_pod_update(errs: &mut Errs, new: &Value, old: &Value) {
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
            semantic(&oc) == semantic(n)
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
    let (munged, old_norm) = (semantic(&munged), semantic(old_spec));
    if munged != old_norm {
        let mut changed = Vec::new();
        diff_paths(&old_norm, &munged, "spec", &mut changed);
        errs.push(FieldError::forbidden(
            &sp,
            format!("{POD_UPDATABLE}\n  changed: {}", changed.join(", ")),
        ));
    }
}

/// The annotation the kubelet puts on the mirror pod of a static pod.
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Upstream's rules for a change of `spec.ephemeralContainers`: none on a static pod's
/// mirror, and an ephemeral container once added may be neither removed nor changed
/// (matched by name, as a patch may reorder the list).
pub(super) fn validate_ephemeral_containers_update(errs: &mut Errs, new: &Value, old: &Value) {
    let mirror = old
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_POD_ANNOTATION))
        .is_some();
    if mirror {
        errs.clear();
        errs.push(FieldError::forbidden(
            Path::new(""),
            "static pods do not support ephemeral containers",
        ));
        return;
    }
    let empty = json!({});
    let new_spec = new.get("spec").unwrap_or(&empty);
    let old_spec = old.get("spec").unwrap_or(&empty);
    let sp = Path::new("spec").child("ephemeralContainers");
    let new_list = arr(new_spec, "ephemeralContainers");
    for o in arr(old_spec, "ephemeralContainers") {
        let name = s(o, "name");
        match new_list.iter().find(|n| s(n, "name") == name) {
            None => errs.push(FieldError::forbidden(
                &sp,
                format!("existing ephemeral containers {name:?} may not be removed\n"),
            )),
            Some(n) if semantic(n) != semantic(o) => {
                let mut changed = Vec::new();
                diff_paths(&semantic(o), &semantic(n), name, &mut changed);
                errs.push(FieldError::forbidden(
                    &sp,
                    format!(
                        "existing ephemeral containers {name:?} may not be changed\n  changed: {}",
                        changed.join(", ")
                    ),
                ));
            }
            Some(_) => {}
        }
    }
}

/// Paths where two JSON values differ (a short stand-in for upstream's `cmp.Diff`).
pub(super) fn diff_paths(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
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
