//! DefaultIngressClass: a new Ingress that names no class (neither `spec.ingressClassName`
//! nor the older `kubernetes.io/ingress.class` annotation) gets the IngressClass marked
//! `ingressclass.kubernetes.io/is-default-class: "true"`. With several such classes the
//! create is refused, as upstream's plugin does.

use nodus_k8s::status;
use serde_json::{Value, json};

use crate::apiserver::rest::{ApiError, ApiResult, meta_str};
use crate::apiserver::state::ApiState;

/// The annotation that marks the cluster's default IngressClass.
pub(crate) const IS_DEFAULT_CLASS: &str = "ingressclass.kubernetes.io/is-default-class";
/// The class annotation Ingresses used before `spec.ingressClassName`.
const INGRESS_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

pub(crate) fn admit(st: &ApiState, ingress: &mut Value) -> ApiResult<()> {
    if !matches!(
        ingress.pointer("/spec/ingressClassName"),
        None | Some(Value::Null)
    ) {
        return Ok(());
    }
    if ingress
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(INGRESS_CLASS_ANNOTATION))
        .is_some()
    {
        return Ok(());
    }
    let (classes, _) = st
        .store
        .list("/networking.k8s.io/ingressclasses/")
        .map_err(crate::apiserver::rest::storage_failure)?;
    let defaults: Vec<&str> = classes
        .iter()
        .filter(|c| {
            c.object
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(IS_DEFAULT_CLASS))
                .and_then(Value::as_str)
                == Some("true")
        })
        .filter_map(|c| meta_str(&c.object, "name"))
        .collect();
    match defaults.as_slice() {
        [] => Ok(()),
        [name] => {
            let name = name.to_string();
            if !ingress.get("spec").is_some_and(Value::is_object) {
                ingress["spec"] = json!({});
            }
            ingress["spec"]["ingressClassName"] = json!(name);
            Ok(())
        }
        many => Err(ApiError(status::forbidden_with(
            "networking.k8s.io",
            "ingresses",
            meta_str(ingress, "name").unwrap_or(""),
            &format!(
                "Internal error occurred: {} default IngressClasses were found, only 1 allowed",
                many.len()
            ),
        ))),
    }
}
