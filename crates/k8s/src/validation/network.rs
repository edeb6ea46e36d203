//! Service, Endpoints and EndpointSlice validation.

use serde_json::{Value, json};
use std::collections::BTreeSet;

use super::common::{
    Errs, PROTOCOLS, arr, dns_label, each_msg, enum_field, is_valid_port_num, not_supported,
    port_num_or_name, present, s, strmap,
};
use super::meta::validate_labels;
use super::names::is_dns1123_subdomain;
use super::{FieldError, Path};

pub(super) fn validate_service(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
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
    // Upstream's validateServiceExternalTrafficPolicy / internal traffic policy checks.
    let has_external_ips = !arr(spec, "externalIPs").is_empty();
    let externally_accessible =
        ty == "LoadBalancer" || ty == "NodePort" || (ty == "ClusterIP" && has_external_ips);
    let etp = s(spec, "externalTrafficPolicy");
    if !externally_accessible {
        if !etp.is_empty() {
            errs.push(FieldError::invalid(
                sp.child("externalTrafficPolicy"),
                json!(etp),
                "may only be set for externally-accessible services",
            ));
        }
    } else {
        enum_field(
            errs,
            sp.child("externalTrafficPolicy"),
            etp,
            &["Cluster", "Local"],
        );
    }
    if let Some(itp) = spec.get("internalTrafficPolicy").and_then(Value::as_str)
        && itp != "Cluster"
        && itp != "Local"
    {
        not_supported(
            errs,
            sp.child("internalTrafficPolicy"),
            itp,
            &["Cluster", "Local"],
        );
    }
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

pub(super) fn validate_endpoint_slice(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
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

pub(super) fn validate_endpoints(errs: &mut Errs, obj: &Value) {
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
