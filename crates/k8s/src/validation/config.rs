//! ConfigMap and Secret validation: keys, sizes, types, immutability.

use serde_json::{Value, json};

use super::common::{Errs, each_msg, s, semantic};
use super::names::is_config_map_key;
use super::{FieldError, Path};

pub(super) const MAX_SECRET_SIZE: usize = 1024 * 1024;

pub(super) fn data_keys(errs: &mut Errs, obj: &Value, field: &str) -> usize {
    let mut size = 0;
    if let Some(m) = obj.get(field).and_then(Value::as_object) {
        for (k, v) in m {
            each_msg(errs, &Path::new(field).key(k), k, is_config_map_key(k));
            size += v.as_str().map_or(0, str::len);
        }
    }
    size
}

pub(super) fn immutable_data(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
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
        let empty = Value::Object(Default::default());
        if semantic(obj.get(f).unwrap_or(&empty)) != semantic(old.get(f).unwrap_or(&empty)) {
            errs.push(FieldError::forbidden(
                f,
                "field is immutable when `immutable` is set",
            ));
        }
    }
}

pub(super) fn validate_config_map(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
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

pub(super) fn validate_secret(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
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
