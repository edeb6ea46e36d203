//! rbac.authorization.k8s.io/v1 validation: Role and ClusterRole rules, RoleBinding and
//! ClusterRoleBinding references and subjects (upstream's `pkg/apis/rbac/validation`).

use serde_json::{Value, json};

use super::common::{Errs, arr, each_msg, name_is_dns_subdomain, name_is_path_segment, s};
use super::{FieldError, Path};
use crate::gvk::Gvk;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Role and ClusterRole: every rule, and a ClusterRole's aggregation rule.
pub(super) fn validate_role_object(errs: &mut Errs, gvk: &Gvk, obj: &Value) {
    let namespaced = gvk.kind == "Role";
    for (i, rule) in arr(obj, "rules").iter().enumerate() {
        validate_policy_rule(errs, rule, namespaced, &Path::new("rules").index(i));
    }
    if let Some(agg) = obj.get("aggregationRule").filter(|v| v.is_object())
        && arr(agg, "clusterRoleSelectors").is_empty()
    {
        errs.push(FieldError::required(
            "aggregationRule.clusterRoleSelectors",
            "at least one clusterRoleSelector required if aggregationRule is non-nil",
        ));
    }
}

fn validate_policy_rule(errs: &mut Errs, rule: &Value, namespaced: bool, p: &Path) {
    if arr(rule, "verbs").is_empty() {
        errs.push(FieldError::required(
            p.child("verbs"),
            "verbs must contain at least one value",
        ));
    }
    let urls = arr(rule, "nonResourceURLs");
    if !urls.is_empty() {
        if namespaced {
            errs.push(FieldError::invalid(
                p.child("nonResourceURLs"),
                json!(urls),
                "namespaced rules cannot apply to non-resource URLs",
            ));
        }
        if !arr(rule, "apiGroups").is_empty()
            || !arr(rule, "resources").is_empty()
            || !arr(rule, "resourceNames").is_empty()
        {
            errs.push(FieldError::invalid(
                p.child("nonResourceURLs"),
                json!(urls),
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        return;
    }
    if arr(rule, "apiGroups").is_empty() {
        errs.push(FieldError::required(
            p.child("apiGroups"),
            "resource rules must supply at least one api group",
        ));
    }
    if arr(rule, "resources").is_empty() {
        errs.push(FieldError::required(
            p.child("resources"),
            "resource rules must supply at least one resource",
        ));
    }
}

/// RoleBinding and ClusterRoleBinding: the role reference (immutable) and the subjects.
pub(super) fn validate_binding_object(
    errs: &mut Errs,
    gvk: &Gvk,
    obj: &Value,
    old: Option<&Value>,
) {
    let namespaced = gvk.kind == "RoleBinding";
    let role_ref = obj.get("roleRef").cloned().unwrap_or_else(|| json!({}));
    let p = Path::new("roleRef");
    let group = s(&role_ref, "apiGroup");
    if group != RBAC_GROUP {
        errs.push(FieldError::not_supported(
            p.child("apiGroup"),
            json!(group),
            &[RBAC_GROUP],
        ));
    }
    let kind = s(&role_ref, "kind");
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    if !kinds.contains(&kind) {
        errs.push(FieldError::not_supported(
            p.child("kind"),
            json!(kind),
            kinds,
        ));
    }
    let name = s(&role_ref, "name");
    if name.is_empty() {
        errs.push(FieldError::required(p.child("name"), ""));
    } else {
        each_msg(
            errs,
            &p.child("name"),
            name,
            name_is_path_segment(name, false),
        );
    }
    for (i, subject) in arr(obj, "subjects").iter().enumerate() {
        validate_subject(errs, subject, namespaced, &Path::new("subjects").index(i));
    }
    if let Some(old) = old
        && old.get("roleRef") != obj.get("roleRef")
    {
        errs.push(FieldError::invalid(
            "roleRef",
            role_ref.clone(),
            "cannot change roleRef",
        ));
    }
}

fn validate_subject(errs: &mut Errs, subject: &Value, namespaced: bool, p: &Path) {
    let name = s(subject, "name");
    if name.is_empty() {
        errs.push(FieldError::required(p.child("name"), ""));
    }
    let group = s(subject, "apiGroup");
    match s(subject, "kind") {
        "ServiceAccount" => {
            if !name.is_empty() {
                each_msg(
                    errs,
                    &p.child("name"),
                    name,
                    name_is_dns_subdomain(name, false),
                );
            }
            if !group.is_empty() {
                errs.push(FieldError::not_supported(
                    p.child("apiGroup"),
                    json!(group),
                    &[""],
                ));
            }
            if !namespaced && s(subject, "namespace").is_empty() {
                errs.push(FieldError::required(p.child("namespace"), ""));
            }
        }
        "User" | "Group" => {
            if group != RBAC_GROUP {
                errs.push(FieldError::not_supported(
                    p.child("apiGroup"),
                    json!(group),
                    &[RBAC_GROUP],
                ));
            }
        }
        other => errs.push(FieldError::not_supported(
            p.child("kind"),
            json!(other),
            &["ServiceAccount", "User", "Group"],
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs_of(kind: &str, obj: Value, old: Option<&Value>) -> Vec<String> {
        let gvk = Gvk::new(RBAC_GROUP, "v1", kind);
        let mut errs = Vec::new();
        if kind.ends_with("Binding") {
            validate_binding_object(&mut errs, &gvk, &obj, old);
        } else {
            validate_role_object(&mut errs, &gvk, &obj);
        }
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn rules_as_upstream() {
        let e = errs_of(
            "Role",
            json!({"rules": [{"verbs": ["get"], "nonResourceURLs": ["/x"]}, {"verbs": []}]}),
            None,
        );
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].contains("namespaced rules cannot apply to non-resource URLs"));
        assert!(e[1].starts_with("rules[1].verbs: Required value"));
        assert!(e[2].contains("resource rules must supply at least one api group"));
        let ok = errs_of(
            "ClusterRole",
            json!({"rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]}),
            None,
        );
        assert!(ok.is_empty(), "{ok:?}");
    }

    #[test]
    fn bindings_as_upstream() {
        let b = json!({"roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "r"},
            "subjects": [{"kind": "Robot", "name": "x"},
                         {"kind": "ServiceAccount", "name": "sa"}]});
        let e = errs_of("ClusterRoleBinding", b.clone(), None);
        assert!(
            e[0].starts_with("roleRef.kind: Unsupported value: \"Role\""),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|x| x.starts_with("subjects[0].kind: Unsupported value"))
        );
        assert!(
            e.iter()
                .any(|x| x.starts_with("subjects[1].namespace: Required value"))
        );
        assert!(errs_of("RoleBinding", b.clone(), None).len() == 1);
        let mut changed = b.clone();
        changed["roleRef"]["name"] = json!("other");
        let e = errs_of("RoleBinding", changed, Some(&b));
        assert!(
            e.iter().any(|x| x.contains("cannot change roleRef")),
            "{e:?}"
        );
    }
}
