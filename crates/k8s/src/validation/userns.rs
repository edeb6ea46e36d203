//! upstream's validateHostUsers and the procMount rule that depends on it: a pod with
//! `hostUsers: false` may not share the node's network, PID or IPC namespace, and only
//! such a pod may ask for an unmasked /proc.

use serde_json::{Value, json};

use super::common::{Errs, arr};
use super::{FieldError, Path};

/// The message upstream gives each host namespace a user-namespaced pod asks for.
const WITH_HOST_USERS_FALSE: &str = "when `pod.Spec.HostUsers` is false";

/// `hostUsers` defaults to true: only an explicit false gives the pod its own users.
pub(super) fn host_users(spec: &Value) -> bool {
    spec.get("hostUsers").and_then(Value::as_bool) != Some(false)
}

/// upstream's validateHostUsers, field names as upstream spells them (`HostPID` and
/// `HostIPC` with capitals: that is what its error paths say).
pub(super) fn validate_host_users(errs: &mut Errs, spec: &Value, p: &Path) {
    if host_users(spec) {
        return;
    }
    for (field, path) in [
        ("hostNetwork", "hostNetwork"),
        ("hostPID", "HostPID"),
        ("hostIPC", "HostIPC"),
    ] {
        if spec.get(field).and_then(Value::as_bool) == Some(true) {
            errs.push(FieldError::forbidden(p.child(path), WITH_HOST_USERS_FALSE));
        }
    }
}

/// `procMount: Unmasked` exposes the host's /proc: upstream allows it only inside a
/// user namespace. Checked for every container kind, as upstream's container validation
/// does.
pub(super) fn validate_proc_mounts(errs: &mut Errs, spec: &Value, p: &Path) {
    if !host_users(spec) {
        return;
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for (i, c) in arr(spec, list).iter().enumerate() {
            if c.pointer("/securityContext/procMount")
                .and_then(Value::as_str)
                == Some("Unmasked")
            {
                errs.push(FieldError::invalid(
                    p.child(list)
                        .index(i)
                        .child("securityContext")
                        .child("procMount"),
                    json!("Unmasked"),
                    "`hostUsers` must be false to use `Unmasked`",
                ));
            }
        }
    }
}
