//! Container environment: `envFrom` (configMaps and secrets, with `prefix`), `env` with
//! `$(VAR)` expansion, the downward API and `configMapKeyRef`/`secretKeyRef` (upstream's
//! makeEnvironmentVariables and expansion.Expand), with upstream's error messages.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use std::collections::HashMap;

/// Facts about the node and the pod's network that the downward API can expose.
#[derive(Clone, Debug, Default)]
pub struct EnvContext {
    pub node_name: String,
    pub host_ips: Vec<String>,
    pub pod_ips: Vec<String>,
    /// Node allocatable, used when a resourceFieldRef names a limit the container lacks.
    pub node_cpu_milli: i64,
    pub node_memory_bytes: i64,
    /// The configMaps and secrets the pod refers to, fetched for this sync.
    pub objects: crate::volumes::PodObjects,
    /// The service variables the pod sees ([`super::envvars`]); an error while the
    /// kubelet has not yet listed Services. Standalone kubelets have none.
    pub service_env: ServiceEnv,
}

/// The service variables for one pod, or why they cannot be had yet.
#[derive(Clone, Debug)]
pub struct ServiceEnv(pub Result<std::collections::BTreeMap<String, String>, String>);

impl Default for ServiceEnv {
    fn default() -> Self {
        ServiceEnv(Ok(Default::default()))
    }
}

/// upstream's validation.IsEnvVarName: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
pub fn is_env_var_name(k: &str) -> bool {
    let mut chars = k.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || "-._".contains(c) => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

/// A container config error the user sees as `CreateContainerConfigError`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EnvError(pub String);

/// Expands `$(VAR)` references from `vars`; `$$` escapes a dollar; unknown references stay
/// as written, as upstream's expansion does.
pub fn expand(input: &str, vars: &dyn Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            match bytes[i + 1] {
                b'$' => {
                    out.push('$');
                    i += 2;
                    continue;
                }
                b'(' => {
                    if let Some(end) = input[i + 2..].find(')') {
                        let name = &input[i + 2..i + 2 + end];
                        match vars(name) {
                            Some(v) => out.push_str(&v),
                            None => out.push_str(&input[i..i + 3 + end]),
                        }
                        i += 3 + end;
                        continue;
                    }
                }
                _ => {}
            }
        }
        let ch = input[i..].chars().next().unwrap_or('\0');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

pub(crate) fn field_ref(pod: &Pod, ctx: &EnvContext, path: &str) -> Result<String, EnvError> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let subscript = |prefix: &str, map: Option<&std::collections::BTreeMap<String, String>>| {
        let key = path
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
            .unwrap_or_default();
        map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
    };
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| ctx.node_name.clone()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" => ctx.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => ctx.host_ips.join(","),
        "status.podIP" => ctx.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => ctx.pod_ips.join(","),
        p if p.starts_with("metadata.labels[") => subscript("metadata.labels", m.labels.as_ref()),
        p if p.starts_with("metadata.annotations[") => {
            subscript("metadata.annotations", m.annotations.as_ref())
        }
        other => {
            return Err(EnvError(format!(
                "unsupported fieldRef path {other:?} in the downward API"
            )));
        }
    })
}

pub(crate) fn resource_ref(
    container: &Container,
    ctx: &EnvContext,
    resource: &str,
    divisor: Option<&str>,
) -> Result<String, EnvError> {
    let res = container.resources.as_ref();
    let (kind, name) = resource
        .split_once('.')
        .ok_or_else(|| EnvError(format!("unsupported resourceFieldRef {resource:?}")))?;
    let map = match kind {
        "limits" => res.and_then(|r| r.limits.as_ref()),
        "requests" => res.and_then(|r| r.requests.as_ref()),
        _ => {
            return Err(EnvError(format!(
                "unsupported resourceFieldRef {resource:?}"
            )));
        }
    };
    let q = map.and_then(|m| m.get(name));
    let cpu = name == "cpu";
    // Upstream: an unset limit reads as node allocatable; an unset request as 0 (cpu: the
    // limit's defaulting already made request = limit when only the limit was set).
    let milli: i64 = match q {
        Some(q) => nodus_k8s::quantity::parse_quantity(&q.0)
            .map_err(|e| EnvError(format!("{resource}: {e}")))?
            .milli_value(),
        None if kind == "limits" && cpu => ctx.node_cpu_milli,
        None if kind == "limits" => ctx.node_memory_bytes.saturating_mul(1000),
        None => 0,
    };
    let div_milli = match divisor {
        Some(d) if !d.is_empty() && d != "0" => nodus_k8s::quantity::parse_quantity(d)
            .map_err(|e| EnvError(format!("divisor of {resource}: {e}")))?
            .milli_value(),
        _ => 1000,
    };
    if div_milli <= 0 {
        return Err(EnvError(format!("divisor of {resource} must be positive")));
    }
    // Rounded up, as upstream's ExtractContainerResourceValue.
    let v = (milli + div_milli - 1) / div_milli;
    Ok(v.max(if cpu && milli > 0 { 1 } else { 0 }).to_string())
}

/// The container's environment in order, with references expanded.
pub fn make_env(
    pod: &Pod,
    container: &Container,
    ctx: &EnvContext,
) -> Result<Vec<(String, String)>, EnvError> {
    use crate::objectcache::{Kind, ObjectError};
    let mut out: Vec<(String, String)> = Vec::new();
    let mut vars: HashMap<String, String> = HashMap::new();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let service_env = ctx
        .service_env
        .0
        .as_ref()
        .map_err(|e| EnvError(e.clone()))?;
    let set = |out: &mut Vec<(String, String)>, k: String, v: String| {
        if let Some(slot) = out.iter_mut().find(|(n, _)| *n == k) {
            slot.1 = v;
        } else {
            out.push((k, v));
        }
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (kind, name, optional) = if let Some(cm) = &from.config_map_ref {
            (
                Kind::ConfigMap,
                cm.name.clone(),
                cm.optional.unwrap_or(false),
            )
        } else if let Some(s) = &from.secret_ref {
            (Kind::Secret, s.name.clone(), s.optional.unwrap_or(false))
        } else {
            continue;
        };
        let data = match ctx.objects.get(kind, &name) {
            Ok(d) => d,
            Err(ObjectError::NotFound(_)) if optional => continue,
            Err(e) => return Err(EnvError(e.to_string())),
        };
        let mut invalid: Vec<String> = Vec::new();
        for (k, v) in data {
            let key = format!("{prefix}{k}");
            if !is_env_var_name(&key) {
                invalid.push(key);
                continue;
            }
            let v = String::from_utf8_lossy(v).into_owned();
            vars.insert(key.clone(), v.clone());
            set(&mut out, key, v);
        }
        if !invalid.is_empty() {
            invalid.sort();
            let what = match kind {
                Kind::ConfigMap => "configMap",
                Kind::Secret => "secret",
            };
            let message = format!(
                "Keys [{}] from the EnvFrom {what} {ns}/{name} were skipped since they are considered invalid environment variable names.",
                invalid.join(", ")
            );
            tracing::warn!(pod = ?pod.metadata.name, container = %container.name, reason = "InvalidEnvironmentVariableNames", "{message}");
            crate::events::recorder().event(
                &crate::events::pod_ref(pod),
                "Warning",
                "InvalidEnvironmentVariableNames",
                &message,
            );
        }
    }
    for EnvVar {
        name,
        value,
        value_from,
    } in container.env.iter().flatten()
    {
        let v = if let Some(from) = value_from {
            if let Some(f) = &from.field_ref {
                field_ref(pod, ctx, &f.field_path)?
            } else if let Some(r) = &from.resource_field_ref {
                resource_ref(
                    container,
                    ctx,
                    &r.resource,
                    r.divisor.as_ref().map(|d| d.0.as_str()),
                )?
            } else if let Some(r) = &from.config_map_key_ref {
                let optional = r.optional.unwrap_or(false);
                match ctx.objects.get(Kind::ConfigMap, &r.name) {
                    Ok(d) => match d.get(&r.key) {
                        Some(v) => String::from_utf8_lossy(v).into_owned(),
                        None if optional => continue,
                        None => {
                            return Err(EnvError(format!(
                                "couldn't find key {} in ConfigMap {ns}/{}",
                                r.key, r.name
                            )));
                        }
                    },
                    Err(ObjectError::NotFound(_)) if optional => continue,
                    Err(e) => return Err(EnvError(e.to_string())),
                }
            } else if let Some(r) = &from.secret_key_ref {
                let optional = r.optional.unwrap_or(false);
                match ctx.objects.get(Kind::Secret, &r.name) {
                    Ok(d) => match d.get(&r.key) {
                        Some(v) => String::from_utf8_lossy(v).into_owned(),
                        None if optional => continue,
                        None => {
                            return Err(EnvError(format!(
                                "couldn't find key {} in Secret {ns}/{}",
                                r.key, r.name
                            )));
                        }
                    },
                    Err(ObjectError::NotFound(_)) if optional => continue,
                    Err(e) => return Err(EnvError(e.to_string())),
                }
            } else {
                String::new()
            }
        } else {
            let raw = value.clone().unwrap_or_default();
            // upstream's MappingFuncFor(tmpEnv, serviceEnv): the container's own first.
            expand(&raw, &|k| {
                vars.get(k).or_else(|| service_env.get(k)).cloned()
            })
        };
        vars.insert(name.clone(), v.clone());
        set(&mut out, name.clone(), v);
    }
    // Service variables come last and never replace what the container set.
    for (k, v) in service_env {
        if !vars.contains_key(k) {
            out.push((k.clone(), v.clone()));
        }
    }
    Ok(out)
}

/// Expands `$(VAR)` in command and args with the container's environment.
pub fn expand_all(items: &[String], env: &[(String, String)]) -> Vec<String> {
    let lookup = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    items.iter().map(|s| expand(s, &lookup)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(k: &str) -> Option<String> {
        match k {
            "A" => Some("x".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expansion_follows_upstream() {
        assert_eq!(expand("$(A)-$(A)", &vars), "x-x");
        assert_eq!(expand("$$(A)", &vars), "$(A)");
        assert_eq!(expand("$(B)", &vars), "$(B)");
        assert_eq!(expand("$(EMPTY)z", &vars), "z");
        assert_eq!(expand("a$b$", &vars), "a$b$");
        assert_eq!(expand("$(A", &vars), "$(A");
        assert_eq!(expand("héllo $(A)", &vars), "héllo x");
    }

    #[test]
    fn env_refers_to_earlier_vars_and_downward_api() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"containers": [{
                "name": "c",
                "resources": {"limits": {"memory": "64Mi"}},
                "env": [
                    {"name": "A", "value": "one"},
                    {"name": "B", "value": "$(A)-two"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                    {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}
                ]
            }]}
        }))
        .unwrap();
        let ctx = EnvContext {
            node_name: "n".into(),
            pod_ips: vec!["10.0.0.5".into()],
            node_cpu_milli: 2000,
            node_memory_bytes: 1 << 30,
            ..Default::default()
        };
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let env = make_env(&pod, c, &ctx).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(get("B"), "one-two");
        assert_eq!(get("POD"), "p");
        assert_eq!(get("APP"), "web");
        assert_eq!(get("IP"), "10.0.0.5");
        assert_eq!(get("MEM"), "64");
        assert_eq!(get("CPU"), "2");
        assert_eq!(
            expand_all(&["echo $(B) $(NOPE)".to_string()], &env),
            vec!["echo one-two $(NOPE)".to_string()]
        );
    }
}
