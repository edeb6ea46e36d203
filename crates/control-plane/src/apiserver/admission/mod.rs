//! Built-in admission: [`serviceaccount`] (pod service account and token volume),
//! DefaultTolerationSeconds,
//! Priority (priorityClassName → priority), Service ClusterIP and NodePort allocation,
//! DefaultStorageClass (a claim without a class gets the default one) and
//! StorageObjectInUseProtection (the pvc-/pv-protection finalizers on create).
//! NodeRestriction, ServiceAccount, [`runtimeclass`] and [`defaultingressclass`] admission are
//! modules of their own.

pub(crate) mod defaultingressclass;
pub(crate) mod noderestriction;
pub(crate) mod runtimeclass;
pub mod serviceaccount;

use std::collections::HashSet;
use std::net::Ipv4Addr;

use nodus_k8s::status;
use nodus_k8s::validation::FieldError;
use serde_json::{Value, json};
use tokio::sync::MutexGuard;

use crate::apiserver::rest::path::Target;
use crate::apiserver::rest::{ApiError, ApiResult, meta_str};
use crate::apiserver::state::ApiState;

/// Admission that depends on who writes (NodeRestriction), for creates (`old` = None) and
/// updates of any resource.
pub fn admit_user(
    user: &crate::apiserver::authn::User,
    t: &Target,
    obj: &Value,
    old: Option<&Value>,
) -> ApiResult<()> {
    noderestriction::admit(user, t, obj, old)
}

/// IPs and node ports in use by Services, read while holding the allocation lock.
#[derive(Debug, Default)]
pub struct Allocations {
    pub ips: HashSet<Ipv4Addr>,
    pub node_ports: HashSet<u16>,
}

/// The allocation lock and a snapshot of allocations, for writes to Services.
pub struct AllocGuard<'a> {
    _guard: MutexGuard<'a, ()>,
    pub allocations: Allocations,
}

fn snapshot(st: &ApiState, skip_key: Option<&str>) -> Allocations {
    let mut a = Allocations::default();
    if let Ok((items, _)) = st.store.list("/core/services/") {
        for s in items.iter().filter(|s| Some(s.key.as_str()) != skip_key) {
            if let Some(ips) = s
                .object
                .pointer("/spec/clusterIPs")
                .and_then(Value::as_array)
            {
                a.ips.extend(
                    ips.iter()
                        .filter_map(|i| i.as_str()?.parse::<Ipv4Addr>().ok()),
                );
            }
            if let Some(ip) = s
                .object
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .and_then(|i| i.parse().ok())
            {
                a.ips.insert(ip);
            }
            for p in s
                .object
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(n) = p
                    .get("nodePort")
                    .and_then(Value::as_u64)
                    .and_then(|n| u16::try_from(n).ok())
                {
                    a.node_ports.insert(n);
                }
            }
        }
    }
    a
}

/// Takes the allocation lock for writes to Services (None for other kinds).
pub async fn lock_for<'a>(st: &'a ApiState, t: &Target) -> Option<AllocGuard<'a>> {
    if t.info.kind != "Service" || !t.info.group.is_empty() {
        return None;
    }
    let guard = st.alloc_lock.lock().await;
    let skip = t.name.as_deref().map(|n| t.key_for(n));
    Some(AllocGuard {
        _guard: guard,
        allocations: snapshot(st, skip.as_deref()),
    })
}

fn in_cidr(ip: Ipv4Addr, (net, bits): (Ipv4Addr, u8)) -> bool {
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(bits))
    };
    (u32::from(ip) & mask) == (u32::from(net) & mask)
}

/// The `kubernetes` Service's IP: the first address of the range.
pub fn first_service_ip((net, _): (Ipv4Addr, u8)) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net) + 1)
}

fn invalid(kind: &str, name: &str, errs: Vec<FieldError>) -> ApiError {
    ApiError(status::invalid(kind, name, &errs))
}

/// Allocates ClusterIP and node ports of a Service being created or updated.
pub fn allocate_service(
    st: &ApiState,
    obj: &mut Value,
    old: Option<&Value>,
    used: &mut Allocations,
) -> ApiResult<()> {
    let name = meta_str(obj, "name").unwrap_or("").to_string();
    let svc_type = obj
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_string();
    if let Some(old) = old {
        let old_ip = old
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let new_ip = obj
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if new_ip.is_empty() && !old_ip.is_empty() && svc_type != "ExternalName" {
            obj["spec"]["clusterIP"] = json!(old_ip);
            obj["spec"]["clusterIPs"] = old
                .pointer("/spec/clusterIPs")
                .cloned()
                .unwrap_or(json!([old_ip]));
        } else if !old_ip.is_empty() && new_ip != old_ip && svc_type != "ExternalName" {
            return Err(invalid(
                "Service",
                &name,
                vec![FieldError::invalid(
                    "spec.clusterIPs[0]",
                    json!(new_ip),
                    "may not change once set",
                )],
            ));
        }
        // Node ports carry over for ports that stay.
        let old_ports = old
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if let Some(ports) = obj.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
            for p in ports.iter_mut() {
                if p.get("nodePort").is_none()
                    && let Some(o) = old_ports.iter().find(|o| {
                        o.get("port") == p.get("port") && o.get("protocol") == p.get("protocol")
                    })
                    && let Some(np) = o.get("nodePort")
                {
                    p["nodePort"] = np.clone();
                }
            }
        }
    }
    if svc_type == "ExternalName" {
        return Ok(());
    }
    let cidr = st.config.service_cidr;
    let ip = obj
        .pointer("/spec/clusterIP")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if ip.is_empty() {
        let size: u32 = 1u32 << (32 - u32::from(cidr.1)).min(31);
        let base = u32::from(cidr.0);
        // Random start, like upstream's bitmap allocator, so deleted IPs are not reused at once.
        let start = rand::random_range(2..size.saturating_sub(1).max(3));
        let found = (0..size)
            .map(|i| 2 + (start - 2 + i) % size.saturating_sub(3).max(1))
            .map(|off| Ipv4Addr::from(base + off))
            .find(|ip| !used.ips.contains(ip));
        let Some(ip) = found else {
            return Err(ApiError(status::internal(
                "failed to allocate a serviceIP: range is full",
            )));
        };
        used.ips.insert(ip);
        obj["spec"]["clusterIP"] = json!(ip.to_string());
        obj["spec"]["clusterIPs"] = json!([ip.to_string()]);
    } else if ip != "None"
        && old
            .and_then(|o| o.pointer("/spec/clusterIP"))
            .and_then(Value::as_str)
            != Some(ip.as_str())
    {
        let parsed: Ipv4Addr = ip.parse().map_err(|_| {
            invalid(
                "Service",
                &name,
                vec![FieldError::invalid(
                    "spec.clusterIPs[0]",
                    json!(ip),
                    "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                )],
            )
        })?;
        if !in_cidr(parsed, cidr) {
            return Err(invalid(
                "Service",
                &name,
                vec![FieldError::invalid(
                    "spec.clusterIPs",
                    json!([ip]),
                    format!(
                        "failed to allocate IP {ip}: the provided IP ({ip}) is not in the valid range. The range of valid IPs is {}/{}",
                        cidr.0, cidr.1
                    ),
                )],
            ));
        }
        if used.ips.contains(&parsed) {
            return Err(invalid(
                "Service",
                &name,
                vec![FieldError::invalid(
                    "spec.clusterIPs",
                    json!([ip]),
                    format!("failed to allocate IP {ip}: provided IP is already allocated"),
                )],
            ));
        }
        used.ips.insert(parsed);
        obj["spec"]["clusterIPs"] = json!([ip]);
    }
    if svc_type == "NodePort" || svc_type == "LoadBalancer" {
        let (lo, hi) = st.config.node_port_range;
        let old_ports: HashSet<u64> = old
            .and_then(|o| o.pointer("/spec/ports"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("nodePort")?.as_u64())
            .collect();
        let mut errs = Vec::new();
        if let Some(ports) = obj.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
            for (i, p) in ports.iter_mut().enumerate() {
                match p.get("nodePort").and_then(Value::as_u64) {
                    Some(n) if old_ports.contains(&n) => {}
                    Some(n) => {
                        let field = format!("spec.ports[{i}].nodePort");
                        if n < u64::from(lo) || n > u64::from(hi) {
                            errs.push(FieldError::invalid(field, json!(n), format!("provided port is not in the valid range. The range of valid ports is {lo}-{hi}")));
                        } else if used.node_ports.contains(&(n as u16)) {
                            errs.push(FieldError::invalid(
                                field,
                                json!(n),
                                "provided port is already allocated",
                            ));
                        } else {
                            used.node_ports.insert(n as u16);
                        }
                    }
                    None => {
                        let span = u32::from(hi - lo) + 1;
                        let start = rand::random_range(0..span);
                        let port = (0..span)
                            .map(|k| lo as u32 + (start + k) % span)
                            .map(|p| p as u16)
                            .find(|p| !used.node_ports.contains(p));
                        match port {
                            Some(pn) => {
                                used.node_ports.insert(pn);
                                p["nodePort"] = json!(pn);
                            }
                            None => {
                                return Err(ApiError(status::internal(
                                    "failed to allocate a nodePort: range is full",
                                )));
                            }
                        }
                    }
                }
            }
        }
        if !errs.is_empty() {
            return Err(invalid("Service", &name, errs));
        }
    }
    Ok(())
}

/// Admission for creates. Returns the allocation lock for Services, to hold until stored.
pub async fn create<'a>(
    st: &'a ApiState,
    t: &Target,
    obj: &mut Value,
    _dry_run: bool,
) -> ApiResult<Option<AllocGuard<'a>>> {
    match (t.info.group, t.info.kind) {
        ("", "Pod") => {
            admit_pod(st, obj)?;
            Ok(None)
        }
        ("", "PersistentVolumeClaim") => {
            admit_claim(st, obj)?;
            add_finalizer(obj, PVC_PROTECTION);
            Ok(None)
        }
        ("", "PersistentVolume") => {
            add_finalizer(obj, PV_PROTECTION);
            Ok(None)
        }
        ("networking.k8s.io", "Ingress") => {
            defaultingressclass::admit(st, obj)?;
            Ok(None)
        }
        ("", "Service") => {
            let mut guard = lock_for(st, t).await;
            if let Some(g) = guard.as_mut() {
                allocate_service(st, obj, None, &mut g.allocations)?;
            }
            Ok(guard)
        }
        _ => Ok(None),
    }
}

/// Admission for updates (runs under the store's write lock: must not read the store).
pub fn update(
    st: &ApiState,
    t: &Target,
    old: &Value,
    new: &mut Value,
    alloc: Option<&mut Allocations>,
) -> ApiResult<()> {
    if let ("", "Service", Some(a)) = (t.info.group, t.info.kind, alloc) {
        allocate_service(st, new, Some(old), a)?;
    }
    Ok(())
}

/// The finalizer that keeps a claim while pods use it (upstream's pvc-protection).
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The finalizer that keeps a volume while a claim is bound to it (pv-protection).
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// Appends `f` to the object's finalizers unless it is there.
pub fn add_finalizer(obj: &mut Value, f: &str) {
    let list = &mut obj["metadata"]["finalizers"];
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(a) = list.as_array_mut()
        && !a.iter().any(|x| x == f)
    {
        a.push(json!(f));
    }
}

/// DefaultStorageClass: a claim that names no class (the field absent, not `""`) gets the
/// default StorageClass; with several defaults, the newest wins, as upstream since 1.26.
fn admit_claim(st: &ApiState, pvc: &mut Value) -> ApiResult<()> {
    if !matches!(
        pvc.pointer("/spec/storageClassName"),
        None | Some(Value::Null)
    ) {
        return Ok(());
    }
    let (classes, _) = st
        .store
        .list("/storage.k8s.io/storageclasses/")
        .map_err(crate::apiserver::rest::storage_failure)?;
    let newest = classes
        .iter()
        .filter(|c| nodus_k8s::printers::is_default_storage_class(&c.object))
        .max_by_key(|c| {
            (
                meta_str(&c.object, "creationTimestamp")
                    .unwrap_or("")
                    .to_string(),
                meta_str(&c.object, "name").unwrap_or("").to_string(),
            )
        });
    if let Some(c) = newest.and_then(|c| meta_str(&c.object, "name"))
        && let Some(spec) = pvc.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.insert("storageClassName".into(), json!(c));
    }
    Ok(())
}

/// Pod admission (service account, default tolerations, RuntimeClass, priority), also for pods the
/// in-process controllers create.
pub(crate) fn admit_pod(st: &ApiState, pod: &mut Value) -> ApiResult<()> {
    serviceaccount::admit(st, pod)?;
    if pod.pointer("/spec/serviceAccount").is_none()
        && let Some(s) = pod.pointer("/spec/serviceAccountName").cloned()
    {
        pod["spec"]["serviceAccount"] = s;
    }
    nodus_k8s::defaults::default_tolerations(pod);
    runtimeclass::admit(st, pod)?;
    let class = pod
        .pointer("/spec/priorityClassName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let found = if class.is_empty() {
        st.listers.priority_classes.list().ok().and_then(|items| {
            items
                .into_iter()
                .find(|p| p.object.get("globalDefault") == Some(&json!(true)))
        })
    } else {
        let pc = st
            .listers
            .priority_classes
            .get(&format!("/scheduling.k8s.io/priorityclasses/{class}"))
            .map_err(crate::apiserver::rest::storage_failure)?;
        if pc.is_none() {
            return Err(ApiError(status::forbidden_with(
                "",
                "pods",
                meta_str(pod, "name").unwrap_or(""),
                &format!("no PriorityClass with name {class} was found"),
            )));
        }
        pc
    };
    let (value, policy) = match &found {
        Some(pc) => (
            pc.object.get("value").and_then(Value::as_i64).unwrap_or(0),
            pc.object
                .get("preemptionPolicy")
                .cloned()
                .unwrap_or(json!("PreemptLowerPriority")),
        ),
        None => (0, json!("PreemptLowerPriority")),
    };
    if let Some(p) = pod.pointer("/spec/priority").and_then(Value::as_i64)
        && p != value
    {
        return Err(ApiError(status::forbidden_with(
            "",
            "pods",
            meta_str(pod, "name").unwrap_or(""),
            "the integer value of priority must not be provided in pod spec; priority admission controller computed the priority from the given PriorityClass name",
        )));
    }
    pod["spec"]["priority"] = json!(value);
    if let Some(pc) = &found
        && class.is_empty()
        && let Some(n) = meta_str(&pc.object, "name")
    {
        pod["spec"]["priorityClassName"] = json!(n);
    }
    if pod.pointer("/spec/preemptionPolicy").is_none() {
        pod["spec"]["preemptionPolicy"] = policy;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_membership_and_first_ip() {
        let cidr = (Ipv4Addr::new(10, 96, 0, 0), 12);
        assert!(in_cidr(Ipv4Addr::new(10, 100, 3, 4), cidr));
        assert!(!in_cidr(Ipv4Addr::new(10, 112, 0, 1), cidr));
        assert_eq!(first_service_ip(cidr), Ipv4Addr::new(10, 96, 0, 1));
    }
}
