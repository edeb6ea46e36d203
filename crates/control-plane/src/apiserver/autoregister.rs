//! APIServices for what this server serves itself, as upstream's autoregister controller
//! (built-in group-versions, labelled `kube-aggregator.kubernetes.io/automanaged: onstart`)
//! and crdregistration controller (CRD group-versions, `automanaged: "true"`, removed when
//! no CRD serves them any more) keep them: one `Local` APIService per group-version, named
//! `<version>.<group>` (`v1.` for the core group), with `Available=True`. `metrics.k8s.io`
//! is served in-process here (see [`super::metrics_api`]), so its APIService is Local too.
//!
//! An APIService that names a Service is not touched here: [`super::aggregator`] proxies
//! to it and keeps its `Available` condition.

use std::collections::BTreeMap;

use nodus_k8s::catalog;
use serde_json::{Value, json};

use crate::apiserver::bootstrap::ensure_object;
use crate::apiserver::state::ApiState;
use crate::storage::Mutation;

const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";
const PREFIX: &str = "/apiregistration.k8s.io/apiservices/";

/// Upstream's (groupPriorityMinimum, versionPriority) of the built-in group-versions
/// (kube-apiserver's `apiVersionPriorities`); discovery lists groups in this order.
fn priority(group: &str, version: &str) -> (i64, i64) {
    let group_priority = match group {
        "" => return (18000, 1),
        "apiregistration.k8s.io" => 18000,
        "apps" => 17800,
        "events.k8s.io" => 17750,
        "authentication.k8s.io" => 17700,
        "authorization.k8s.io" => 17600,
        "autoscaling" => 17500,
        "batch" => 17400,
        "certificates.k8s.io" => 17300,
        "networking.k8s.io" => 17200,
        "policy" => 17100,
        "rbac.authorization.k8s.io" => 17000,
        "storage.k8s.io" => 16800,
        "admissionregistration.k8s.io" | "apiextensions.k8s.io" => 16700,
        "scheduling.k8s.io" => 16600,
        "coordination.k8s.io" => 16500,
        "node.k8s.io" => 16300,
        "discovery.k8s.io" => 16200,
        "flowcontrol.apiserver.k8s.io" => return (16100, 21),
        // metrics-server's own APIService asks for these.
        "metrics.k8s.io" => return (100, 100),
        // crdregistration's values for CRD groups.
        _ => return (1000, 100),
    };
    let version_priority = if version == "v2" { 30 } else { 15 };
    (group_priority, version_priority)
}

fn name_of(group: &str, version: &str) -> String {
    format!("{version}.{group}")
}

/// Every served group-version and whether a CRD serves it.
fn served() -> BTreeMap<(&'static str, &'static str), bool> {
    let mut out = BTreeMap::new();
    for r in catalog::all()
        .iter()
        .chain(crate::apiserver::metrics_api::RESOURCES.iter())
    {
        out.insert((r.group, r.version), false);
    }
    for r in catalog::custom() {
        out.entry((r.group, r.version)).or_insert(true);
    }
    out
}

/// Ensures the Local APIServices exist and are Available; drops CRD-managed ones whose
/// group-version is no longer served.
pub(crate) fn sync(st: &ApiState) {
    let served = served();
    let settled = |o: &Value| {
        let available = o
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Available" && c["status"] == "True")
            });
        // A Local APIService is always available; one the user pointed at a Service is
        // left alone.
        available || o.pointer("/spec/service").is_some_and(|s| !s.is_null())
    };
    for (&(group, version), &custom) in &served {
        let name = name_of(group, version);
        let key = format!("{PREFIX}{name}");
        // Runs on every CRD sync pass: reads only, once everything is in place.
        if let Ok(Some(cur)) = st.store.get(&key)
            && settled(&cur.object)
        {
            continue;
        }
        let (gp, vp) = priority(group, version);
        let managed = if custom { "true" } else { "onstart" };
        let obj = json!({
            "metadata": {"name": name, "labels": {AUTOMANAGED: managed}},
            "spec": {"group": group, "version": version,
                     "groupPriorityMinimum": gp, "versionPriority": vp},
        });
        if let Err(e) = ensure_object(st, "apiregistration.k8s.io", "apiservices", None, obj) {
            tracing::warn!(apiservice = %name, error = %e, "cannot register APIService");
            continue;
        }
        let out = st.store.mutate(&key, &mut |cur| {
            let Some(cur) = cur else {
                return Ok(Mutation::Keep);
            };
            if settled(&cur.object) {
                return Ok(Mutation::Keep);
            }
            let mut new = (*cur.object).clone();
            new["status"] = json!({"conditions": [{
                "type": "Available", "status": "True",
                "lastTransitionTime": crate::apiserver::rest::now_rfc3339(),
                "reason": "Local", "message": "Local APIServices are always available"}]});
            Ok(Mutation::Put(new))
        });
        if let Err(e) = out {
            tracing::warn!(apiservice = %name, error = %e, "cannot mark APIService available");
        }
    }
    let Ok((existing, _)) = st.store.list(PREFIX) else {
        return;
    };
    for item in existing {
        let o = &item.object;
        let label = o
            .pointer("/metadata/labels")
            .and_then(|l| l.get(AUTOMANAGED))
            .and_then(Value::as_str);
        let gv = (
            o.pointer("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or(""),
            o.pointer("/spec/version")
                .and_then(Value::as_str)
                .unwrap_or(""),
        );
        if label == Some("true") && !served.keys().any(|(g, v)| (*g, *v) == gv) {
            let name = o
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let _ = st.store.delete(&format!("{PREFIX}{name}"), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_priorities_follow_upstream() {
        assert_eq!(name_of("", "v1"), "v1.");
        assert_eq!(name_of("apps", "v1"), "v1.apps");
        assert_eq!(priority("", "v1"), (18000, 1));
        assert_eq!(priority("autoscaling", "v2"), (17500, 30));
        assert_eq!(priority("metrics.k8s.io", "v1beta1"), (100, 100));
        let served = served();
        for gv in [
            ("", "v1"),
            ("networking.k8s.io", "v1"),
            ("flowcontrol.apiserver.k8s.io", "v1"),
            ("apiregistration.k8s.io", "v1"),
            ("metrics.k8s.io", "v1beta1"),
        ] {
            assert_eq!(served.get(&gv), Some(&false), "{gv:?}");
        }
    }
}
