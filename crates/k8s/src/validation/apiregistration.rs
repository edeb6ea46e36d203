//! `apiregistration.k8s.io` validation: APIService, following kube-aggregator's
//! `pkg/apis/apiregistration/validation`.

use serde_json::{Value, json};

use super::common::{Errs, is_valid_port_num, s};
use super::names::{is_dns1035_label, is_dns1123_subdomain};
use super::{FieldError, Path};

pub(super) fn validate_api_service(errs: &mut Errs, obj: &Value) {
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let sp = Path::new("spec");
    let group = s(spec, "group");
    let version = s(spec, "version");
    let required = format!("{version}.{group}");
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !name.is_empty() && name != required {
        errs.push(FieldError::invalid(
            Path::new("metadata").child("name"),
            json!(name),
            format!("must be `spec.version+\".\"+spec.group`: {required:?}"),
        ));
    }
    if group.is_empty() && version != "v1" {
        errs.push(FieldError::required(
            sp.child("group"),
            "only v1 may have an empty group and it better be legacy kube",
        ));
    }
    if !group.is_empty() {
        for m in is_dns1123_subdomain(group) {
            errs.push(FieldError::invalid(sp.child("group"), json!(group), m));
        }
    }
    for m in is_dns1035_label(version) {
        errs.push(FieldError::invalid(sp.child("version"), json!(version), m));
    }
    let int = |k: &str| spec.get(k).and_then(Value::as_i64).unwrap_or(0);
    let gpm = int("groupPriorityMinimum");
    if gpm <= 0 || gpm > 20000 {
        errs.push(FieldError::invalid(
            sp.child("groupPriorityMinimum"),
            json!(gpm),
            "must be positive and less than 20000",
        ));
    }
    let vp = int("versionPriority");
    if vp <= 0 || vp > 1000 {
        errs.push(FieldError::invalid(
            sp.child("versionPriority"),
            json!(vp),
            "must be positive and less than 1000",
        ));
    }
    let ca_len = s(spec, "caBundle").len();
    let skip_verify = spec
        .get("insecureSkipTLSVerify")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let Some(svc) = spec.get("service").filter(|v| !v.is_null()) else {
        if ca_len > 0 {
            // The bundle arrives base64-encoded; upstream counts decoded bytes.
            errs.push(FieldError::invalid(
                sp.child("caBundle"),
                json!(format!("{} bytes", ca_len / 4 * 3)),
                "local APIServices may not have a caBundle",
            ));
        }
        if skip_verify {
            errs.push(FieldError::invalid(
                sp.child("insecureSkipTLSVerify"),
                json!(true),
                "local APIServices may not have insecureSkipTLSVerify",
            ));
        }
        return;
    };
    let svp = sp.child("service");
    for field in ["namespace", "name"] {
        if s(svc, field).is_empty() {
            errs.push(FieldError::required(svp.child(field), ""));
        }
    }
    let port = svc.get("port").and_then(Value::as_i64).unwrap_or(443);
    let msgs = is_valid_port_num(port);
    if !msgs.is_empty() {
        errs.push(FieldError::invalid(
            svp.child("port"),
            json!(port),
            format!("port is not valid: {}", msgs.join(", ")),
        ));
    }
    if skip_verify && ca_len > 0 {
        errs.push(FieldError::invalid(
            sp.child("insecureSkipTLSVerify"),
            json!(true),
            "may not be true if caBundle is present",
        ));
    }
}
