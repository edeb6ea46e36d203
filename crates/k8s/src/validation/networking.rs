//! `networking.k8s.io` validation: Ingress, IngressClass and NetworkPolicy, following
//! upstream's `pkg/apis/networking/validation` (its texts included).

use serde_json::{Value, json};

use super::common::{
    Errs, PROTOCOLS, arr, each_msg, is_valid_cidr, is_valid_port_name, is_valid_port_num,
    label_selector, name_is_dns_label, name_is_dns_subdomain, name_is_dns1035_label,
    name_is_path_segment, not_supported, s,
};
use super::names::{is_dns1123_subdomain, is_wildcard_dns1123_subdomain};
use super::{FieldError, Path};

/// The annotation older Ingresses name their class with.
const INGRESS_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
const PATH_TYPES: [&str; 3] = ["Exact", "ImplementationSpecific", "Prefix"];
const INVALID_PATH_SEQUENCES: [&str; 5] = ["//", "/./", "/../", "%2f", "%2F"];
const INVALID_PATH_SUFFIXES: [&str; 2] = ["/..", "/."];
const MAX_LEN_INGRESS_CLASS_CONTROLLER: usize = 250;
const CIDR_ERROR: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";

fn is_ip(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
}

pub(super) fn validate_ingress(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let sp = Path::new("spec");
    let rules = arr(spec, "rules");
    let default_backend = spec.get("defaultBackend").filter(|v| !v.is_null());
    if rules.is_empty() && default_backend.is_none() {
        // Upstream prints the Go value of the missing rules.
        let shown = if spec.get("rules").is_some_and(Value::is_array) {
            "[]networking.IngressRule{}"
        } else {
            "[]networking.IngressRule(nil)"
        };
        errs.push(FieldError::invalid(
            &sp,
            json!({"$stringer": shown}),
            "either `defaultBackend` or `rules` must be specified",
        ));
    }
    if let Some(b) = default_backend {
        validate_backend(errs, b, &sp.child("defaultBackend"));
    }
    // Updates keep a stored wildcard rule that older validation let through.
    let allow_invalid_wildcard = old.is_some_and(|o| {
        arr(o.get("spec").unwrap_or(&empty), "rules")
            .iter()
            .any(|r| {
                let mut e = Vec::new();
                validate_rule_value(&mut e, r, &Path::default());
                s(r, "host").contains('*') && !e.is_empty()
            })
    });
    for (i, rule) in rules.iter().enumerate() {
        let rp = sp.child("rules").index(i);
        let host = s(rule, "host");
        let mut wildcard = false;
        if !host.is_empty() {
            if is_ip(host) {
                errs.push(FieldError::invalid(
                    rp.child("host"),
                    json!(host),
                    "must be a DNS name, not an IP address",
                ));
            }
            if host.contains('*') {
                each_msg(
                    errs,
                    &rp.child("host"),
                    host,
                    is_wildcard_dns1123_subdomain(host),
                );
                wildcard = true;
            } else {
                each_msg(errs, &rp.child("host"), host, is_dns1123_subdomain(host));
            }
        }
        if !wildcard || !allow_invalid_wildcard {
            validate_rule_value(errs, rule, &rp);
        }
    }
    for (i, tls) in arr(spec, "tls").iter().enumerate() {
        let tp = sp.child("tls").index(i);
        for (j, host) in arr(tls, "hosts").iter().enumerate() {
            let host = host.as_str().unwrap_or("");
            let msgs = if host.contains('*') {
                is_wildcard_dns1123_subdomain(host)
            } else {
                is_dns1123_subdomain(host)
            };
            each_msg(errs, &tp.child("hosts").index(j), host, msgs);
        }
        let secret = s(tls, "secretName");
        if !secret.is_empty() {
            each_msg(
                errs,
                &tp.child("secretName"),
                secret,
                name_is_dns_subdomain(secret, false),
            );
        }
    }
    if let Some(class) = spec.get("ingressClassName").and_then(Value::as_str) {
        each_msg(
            errs,
            &sp.child("ingressClassName"),
            class,
            name_is_dns_subdomain(class, false),
        );
        // Upstream checks this on create only (ValidateIngressCreate).
        let annotation = obj
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(INGRESS_CLASS_ANNOTATION))
            .and_then(Value::as_str);
        if old.is_none()
            && let Some(a) = annotation
            && a != class
        {
            errs.push(FieldError::invalid(
                Path::new("annotations").child(INGRESS_CLASS_ANNOTATION),
                json!(a),
                "must match `ingressClassName` when both are specified",
            ));
        }
    }
    validate_load_balancer_status(errs, obj, old);
}

/// Upstream's `ValidateIngressLoadBalancerStatus`, run on every write here (the status
/// subresource and the main resource share this entry point).
fn validate_load_balancer_status(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let lp = Path::new("status").child("loadBalancer").child("ingress");
    let existing: Vec<&str> = old
        .map(|o| arr_at(o, "/status/loadBalancer/ingress"))
        .unwrap_or(&[])
        .iter()
        .map(|i| s(i, "ip"))
        .filter(|ip| !ip.is_empty())
        .collect();
    for (i, ing) in arr_at(obj, "/status/loadBalancer/ingress")
        .iter()
        .enumerate()
    {
        let ip = s(ing, "ip");
        if !ip.is_empty() && !is_ip(ip) && !existing.contains(&ip) {
            errs.push(FieldError::invalid(
                lp.index(i).child("ip"),
                json!(ip),
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            ));
        }
        let hostname = s(ing, "hostname");
        if !hostname.is_empty() {
            each_msg(
                errs,
                &lp.index(i).child("hostname"),
                hostname,
                is_dns1123_subdomain(hostname),
            );
            if is_ip(hostname) {
                errs.push(FieldError::invalid(
                    lp.index(i).child("hostname"),
                    json!(hostname),
                    "must be a DNS name, not an IP address",
                ));
            }
        }
    }
}

fn arr_at<'a>(v: &'a Value, ptr: &str) -> &'a [Value] {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn validate_rule_value(errs: &mut Errs, rule: &Value, rp: &Path) {
    let Some(http) = rule.get("http").filter(|v| !v.is_null()) else {
        return;
    };
    let hp = rp.child("http");
    let paths = arr(http, "paths");
    if paths.is_empty() {
        errs.push(FieldError::required(hp.child("paths"), ""));
    }
    for (i, path) in paths.iter().enumerate() {
        validate_http_path(errs, path, &hp.child("paths").index(i));
    }
}

fn validate_http_path(errs: &mut Errs, path: &Value, pp: &Path) {
    let Some(path_type) = path.get("pathType").and_then(Value::as_str) else {
        errs.push(FieldError::required(
            pp.child("pathType"),
            "pathType must be specified",
        ));
        return;
    };
    let p = s(path, "path");
    let absolute = |errs: &mut Errs| {
        if !p.starts_with('/') {
            errs.push(FieldError::invalid(
                pp.child("path"),
                json!(p),
                "must be an absolute path",
            ));
        }
    };
    match path_type {
        "Exact" | "Prefix" => {
            absolute(errs);
            for seq in INVALID_PATH_SEQUENCES {
                if p.contains(seq) {
                    errs.push(FieldError::invalid(
                        pp.child("path"),
                        json!(p),
                        format!("must not contain '{seq}'"),
                    ));
                }
            }
            for suffix in INVALID_PATH_SUFFIXES {
                if p.ends_with(suffix) {
                    errs.push(FieldError::invalid(
                        pp.child("path"),
                        json!(p),
                        format!("cannot end with '{suffix}'"),
                    ));
                }
            }
        }
        "ImplementationSpecific" => {
            if !p.is_empty() {
                absolute(errs);
            }
        }
        other => not_supported(errs, pp.child("pathType"), other, &PATH_TYPES),
    }
    let empty = json!({});
    validate_backend(
        errs,
        path.get("backend").unwrap_or(&empty),
        &pp.child("backend"),
    );
}

/// Upstream's `validateIngressBackend`: exactly one of a Service (by name, with a port name
/// or number) and a typed resource reference.
fn validate_backend(errs: &mut Errs, backend: &Value, bp: &Path) {
    let resource = backend.get("resource").filter(|v| !v.is_null());
    let service = backend.get("service").filter(|v| !v.is_null());
    match (resource, service) {
        (Some(_), Some(_)) => errs.push(FieldError::invalid(
            bp,
            json!(""),
            "cannot set both resource and service backends",
        )),
        (Some(r), None) => validate_typed_reference(errs, r, &bp.child("resource"), false),
        (None, Some(svc)) => {
            let sp = bp.child("service");
            let name = s(svc, "name");
            if name.is_empty() {
                errs.push(FieldError::required(sp.child("name"), ""));
            } else {
                // A Service's own name rule (DNS-1035); upstream relaxes it only behind the
                // alpha RelaxedServiceNameValidation gate.
                each_msg(
                    errs,
                    &sp.child("name"),
                    name,
                    name_is_dns1035_label(name, false),
                );
            }
            let port = svc.get("port").cloned().unwrap_or_else(|| json!({}));
            let port_name = s(&port, "name");
            let port_number = port.get("number").and_then(Value::as_i64).unwrap_or(0);
            match (port_name.is_empty(), port_number) {
                (false, n) if n != 0 => errs.push(FieldError::invalid(
                    bp,
                    json!(""),
                    "cannot set both port name & port number",
                )),
                (false, _) => each_msg(
                    errs,
                    &sp.child("port").child("name"),
                    port_name,
                    is_valid_port_name(port_name),
                ),
                (true, 0) => errs.push(FieldError::required(bp, "port name or number is required")),
                (true, n) => {
                    for m in is_valid_port_num(n) {
                        errs.push(FieldError::invalid(
                            sp.child("port").child("number"),
                            json!(n),
                            m,
                        ));
                    }
                }
            }
        }
        (None, None) => errs.push(FieldError::invalid(
            bp,
            json!(""),
            "resource or service backend is required",
        )),
    }
}

/// A typed reference (an Ingress backend's `resource`, an IngressClass's `parameters`).
fn validate_typed_reference(errs: &mut Errs, r: &Value, rp: &Path, parameters: bool) {
    if let Some(group) = r.get("apiGroup").and_then(Value::as_str) {
        each_msg(
            errs,
            &rp.child("apiGroup"),
            group,
            is_dns1123_subdomain(group),
        );
    }
    for field in ["kind", "name"] {
        let v = s(r, field);
        if v.is_empty() {
            errs.push(FieldError::required(rp.child(field), ""));
        } else {
            each_msg(errs, &rp.child(field), v, name_is_path_segment(v, false));
        }
    }
    if !parameters {
        return;
    }
    let Some(scope) = r.get("scope").and_then(Value::as_str) else {
        errs.push(FieldError::required(rp.child("scope"), ""));
        return;
    };
    let namespace = r.get("namespace").and_then(Value::as_str);
    match scope {
        "Namespace" => match namespace {
            None => errs.push(FieldError::required(
                rp.child("namespace"),
                "`parameters.scope` is set to 'Namespace'",
            )),
            Some(ns) => each_msg(
                errs,
                &rp.child("namespace"),
                ns,
                name_is_dns_label(ns, false),
            ),
        },
        "Cluster" => {
            if namespace.is_some() {
                errs.push(FieldError::forbidden(
                    rp.child("namespace"),
                    "`parameters.scope` is set to 'Cluster'",
                ));
            }
        }
        other => not_supported(errs, rp.child("scope"), other, &["Cluster", "Namespace"]),
    }
}

pub(super) fn validate_ingress_class(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let sp = Path::new("spec");
    let controller = s(spec, "controller");
    let cp = sp.child("controller");
    if controller.is_empty() {
        errs.push(FieldError::required(&cp, ""));
    } else {
        if controller.len() > MAX_LEN_INGRESS_CLASS_CONTROLLER {
            errs.push(FieldError::too_long(&cp, MAX_LEN_INGRESS_CLASS_CONTROLLER));
        }
        domain_prefixed_path(errs, &cp, controller);
    }
    if let Some(p) = spec.get("parameters").filter(|v| !v.is_null()) {
        validate_typed_reference(errs, p, &sp.child("parameters"), true);
    }
    if let Some(old) = old {
        let was = old.pointer("/spec/controller").and_then(Value::as_str);
        if was.unwrap_or("") != controller {
            errs.push(FieldError::invalid(
                &cp,
                json!(controller),
                "field is immutable",
            ));
        }
    }
}

/// Upstream's `IsDomainPrefixedPath` (an IngressClass's controller, `acme.io/foo`).
fn domain_prefixed_path(errs: &mut Errs, p: &Path, v: &str) {
    let Some((host, path)) = v
        .split_once('/')
        .filter(|(h, p)| !h.is_empty() && !p.is_empty())
    else {
        errs.push(FieldError::invalid(
            p,
            json!(v),
            "must be a domain-prefixed path (such as \"acme.io/foo\")",
        ));
        return;
    };
    each_msg(errs, p, host, is_dns1123_subdomain(host));
    let http_path_char = |c: char| c.is_ascii_alphanumeric() || "/-._~%!$&'()*+,;=:".contains(c);
    if !path.chars().all(http_path_char) {
        errs.push(FieldError::invalid(
            p,
            json!(path),
            "Invalid path (regex used for validation is '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')",
        ));
    }
}

pub(super) fn validate_network_policy(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let sp = Path::new("spec");
    label_selector(
        errs,
        sp.child("podSelector"),
        spec.get("podSelector").unwrap_or(&empty),
    );
    // CIDRs already stored stay acceptable on update (upstream's AllowCIDRsEvenIfInvalid).
    let mut existing: Vec<String> = Vec::new();
    if let Some(old) = old {
        let old_spec = old.get("spec").unwrap_or(&empty);
        for (dir, peers) in [("ingress", "from"), ("egress", "to")] {
            for rule in arr(old_spec, dir) {
                for peer in arr(rule, peers) {
                    if let Some(b) = peer.get("ipBlock") {
                        existing.push(s(b, "cidr").to_string());
                        existing.extend(
                            arr(b, "except")
                                .iter()
                                .filter_map(Value::as_str)
                                .map(str::to_string),
                        );
                    }
                }
            }
        }
    }
    for (dir, peers) in [("ingress", "from"), ("egress", "to")] {
        for (i, rule) in arr(spec, dir).iter().enumerate() {
            let rp = sp.child(dir).index(i);
            for (j, port) in arr(rule, "ports").iter().enumerate() {
                validate_policy_port(errs, port, &rp.child("ports").index(j));
            }
            for (j, peer) in arr(rule, peers).iter().enumerate() {
                validate_peer(errs, peer, &rp.child(peers).index(j), &existing);
            }
        }
    }
    let types = arr(spec, "policyTypes");
    let tp = sp.child("policyTypes");
    if types.len() > 2 {
        errs.push(FieldError::invalid(
            &tp,
            json!(types),
            "may not specify more than two policyTypes",
        ));
        return;
    }
    for (i, t) in types.iter().enumerate() {
        let t = t.as_str().unwrap_or("");
        if t != "Ingress" && t != "Egress" {
            not_supported(errs, tp.index(i), t, &["Ingress", "Egress"]);
        }
    }
}

fn validate_policy_port(errs: &mut Errs, port: &Value, pp: &Path) {
    if let Some(proto) = port.get("protocol").and_then(Value::as_str)
        && !PROTOCOLS.contains(&proto)
    {
        not_supported(errs, pp.child("protocol"), proto, &["TCP", "UDP", "SCTP"]);
    }
    let end = port.get("endPort").and_then(Value::as_i64);
    match port.get("port") {
        Some(Value::Number(n)) => {
            let n = n.as_i64().unwrap_or(0);
            for m in is_valid_port_num(n) {
                errs.push(FieldError::invalid(pp.child("port"), json!(n), m));
            }
            if let Some(end) = end {
                if end < n {
                    errs.push(FieldError::invalid(
                        pp.child("endPort"),
                        json!(end),
                        "must be greater than or equal to `port`",
                    ));
                }
                for m in is_valid_port_num(end) {
                    errs.push(FieldError::invalid(pp.child("endPort"), json!(end), m));
                }
            }
        }
        Some(Value::String(name)) => {
            if let Some(end) = end {
                errs.push(FieldError::invalid(
                    pp.child("endPort"),
                    json!(end),
                    "may not be specified when `port` is non-numeric",
                ));
            }
            each_msg(errs, &pp.child("port"), name, is_valid_port_name(name));
        }
        _ => {
            if let Some(end) = end {
                errs.push(FieldError::invalid(
                    pp.child("endPort"),
                    json!(end),
                    "may not be specified when `port` is not specified",
                ));
            }
        }
    }
}

fn validate_peer(errs: &mut Errs, peer: &Value, pp: &Path, existing: &[String]) {
    let mut peers = 0;
    for sel in ["podSelector", "namespaceSelector"] {
        if let Some(v) = peer.get(sel).filter(|v| !v.is_null()) {
            peers += 1;
            label_selector(errs, pp.child(sel), v);
        }
    }
    let ip_block = peer.get("ipBlock").filter(|v| !v.is_null());
    if let Some(b) = ip_block {
        peers += 1;
        validate_ip_block(errs, b, &pp.child("ipBlock"), existing);
    }
    if peers == 0 {
        errs.push(FieldError::required(pp, "must specify a peer"));
    } else if peers > 1 && ip_block.is_some() {
        errs.push(FieldError::forbidden(
            pp,
            "may not specify both ipBlock and another peer",
        ));
    }
}

/// A parsed CIDR: its masked network address as bits, the prefix length, the family width.
fn parse_cidr(c: &str) -> Option<(u128, u8, u8)> {
    if !is_valid_cidr(c) {
        return None;
    }
    let (ip, bits) = c.split_once('/')?;
    let bits: u8 = bits.parse().ok()?;
    let (addr, width) = match ip.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(a) => (u128::from(u32::from(a)), 32u8),
        std::net::IpAddr::V6(a) => (u128::from(a), 128u8),
    };
    let host_bits = u32::from(width - bits);
    let mask = if host_bits >= 128 {
        0
    } else {
        !((1u128 << host_bits) - 1)
    };
    Some((addr & mask, bits, width))
}

fn validate_ip_block(errs: &mut Errs, b: &Value, bp: &Path, existing: &[String]) {
    let cidr = s(b, "cidr");
    if cidr.is_empty() {
        errs.push(FieldError::required(bp.child("cidr"), ""));
        return;
    }
    let valid = |c: &str| is_valid_cidr(c) || existing.iter().any(|e| e == c);
    if !valid(cidr) {
        errs.push(FieldError::invalid(
            bp.child("cidr"),
            json!(cidr),
            CIDR_ERROR,
        ));
    }
    let Some((net, bits, width)) = parse_cidr(cidr) else {
        return;
    };
    for (i, except) in arr(b, "except").iter().enumerate() {
        let except = except.as_str().unwrap_or("");
        let ep = bp.child("except").index(i);
        if !valid(except) {
            errs.push(FieldError::invalid(&ep, json!(except), CIDR_ERROR));
        }
        let Some((enet, ebits, ewidth)) = parse_cidr(except) else {
            continue;
        };
        let host_bits = u32::from(width - bits);
        let mask = if host_bits >= 128 {
            0
        } else {
            !((1u128 << host_bits) - 1)
        };
        let inside = ewidth == width && enet & mask == net;
        if !inside || bits >= ebits {
            errs.push(FieldError::invalid(
                &ep,
                json!(except),
                "must be a strict subset of `cidr`",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::defaults::default_object;
    use crate::gvk::Gvk;
    use crate::validation::validate_object;
    use serde_json::{Value, json};

    fn check(kind: &str, mut obj: Value) -> Vec<String> {
        let gvk = Gvk::new("networking.k8s.io", "v1", kind);
        default_object(&gvk, &mut obj);
        validate_object(&gvk, &obj, None)
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    fn ingress(spec: Value) -> Value {
        json!({"metadata": {"name": "i", "namespace": "d"}, "spec": spec})
    }

    #[test]
    fn ingress_paths_backends_and_hosts() {
        let path = |p: &str, t: Value| {
            ingress(
                json!({"rules": [{"host": "a.example.com", "http": {"paths": [
                {"path": p, "pathType": t, "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}),
            )
        };
        assert_eq!(
            check("Ingress", path("/", json!("Prefix"))),
            Vec::<String>::new()
        );
        assert_eq!(
            check("Ingress", path("/a//b", json!("Exact"))),
            ["spec.rules[0].http.paths[0].path: Invalid value: \"/a//b\": must not contain '//'"]
        );
        assert_eq!(
            check("Ingress", path("/a/..", json!("Prefix"))),
            ["spec.rules[0].http.paths[0].path: Invalid value: \"/a/..\": cannot end with '/..'"]
        );
        assert_eq!(
            check("Ingress", path("", json!("ImplementationSpecific"))),
            Vec::<String>::new()
        );
        assert_eq!(
            check("Ingress", path("/", Value::Null)),
            ["spec.rules[0].http.paths[0].pathType: Required value: pathType must be specified"]
        );
        assert_eq!(
            check("Ingress", ingress(json!({}))),
            [
                "spec: Invalid value: []networking.IngressRule(nil): either `defaultBackend` or `rules` must be specified"
            ]
        );
        assert_eq!(
            check(
                "Ingress",
                ingress(json!({"defaultBackend": {"service": {"name": "web", "port": {}}}}))
            ),
            ["spec.defaultBackend: Required value: port name or number is required"]
        );
        assert_eq!(
            check(
                "Ingress",
                ingress(json!({"defaultBackend": {
                    "service": {"name": "web", "port": {"number": 80}},
                    "resource": {"kind": "Bucket", "name": "b"}}}))
            ),
            [
                "spec.defaultBackend: Invalid value: \"\": cannot set both resource and service backends"
            ]
        );
        let host = |h: &str| {
            ingress(
                json!({"rules": [{"host": h}], "defaultBackend": {"resource": {"kind": "B", "name": "b"}}}),
            )
        };
        assert_eq!(
            check("Ingress", host("*.example.com")),
            Vec::<String>::new()
        );
        assert_eq!(
            check("Ingress", host("10.0.0.1")),
            [
                "spec.rules[0].host: Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address"
            ]
        );
        assert!(check("Ingress", host("a.*.com"))[0]
            .starts_with("spec.rules[0].host: Invalid value: \"a.*.com\": a wildcard DNS-1123 subdomain must start with '*.'"));
    }

    #[test]
    fn ingress_class_controller_and_parameters() {
        let class = |spec: Value| json!({"metadata": {"name": "c"}, "spec": spec});
        assert_eq!(
            check(
                "IngressClass",
                class(json!({"controller": "example.com/ingress"}))
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            check("IngressClass", class(json!({}))),
            ["spec.controller: Required value"]
        );
        assert_eq!(
            check(
                "IngressClass",
                class(
                    json!({"controller": "a.io/x", "parameters": {"kind": "K", "name": "n", "scope": "Namespace"}})
                )
            ),
            ["spec.parameters.namespace: Required value: `parameters.scope` is set to 'Namespace'"]
        );
    }

    #[test]
    fn network_policy_defaults_and_peers() {
        let np = |spec: Value| json!({"metadata": {"name": "n", "namespace": "d"}, "spec": spec});
        let mut obj = np(json!({"egress": [{"ports": [{"port": 53}]}]}));
        default_object(
            &Gvk::new("networking.k8s.io", "v1", "NetworkPolicy"),
            &mut obj,
        );
        assert_eq!(obj["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(obj["spec"]["podSelector"], json!({}));
        assert_eq!(obj["spec"]["egress"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(
            check("NetworkPolicy", np(json!({"ingress": [{"from": [{}]}]}))),
            ["spec.ingress[0].from[0]: Required value: must specify a peer"]
        );
        assert_eq!(
            check(
                "NetworkPolicy",
                np(
                    json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]})
                )
            ),
            ["spec.ingress[0].from[0]: Forbidden: may not specify both ipBlock and another peer"]
        );
        assert_eq!(
            check(
                "NetworkPolicy",
                np(
                    json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8", "10.1.0.0/16"]}}]}]})
                )
            ),
            [
                "spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"10.0.0.0/8\": must be a strict subset of `cidr`"
            ]
        );
        assert_eq!(
            check(
                "NetworkPolicy",
                np(
                    json!({"ingress": [{"ports": [{"port": "http", "endPort": 90}]}], "policyTypes": ["Sideways"]})
                )
            ),
            [
                "spec.ingress[0].ports[0].endPort: Invalid value: 90: may not be specified when `port` is non-numeric",
                "spec.policyTypes[0]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\""
            ]
        );
    }
}
