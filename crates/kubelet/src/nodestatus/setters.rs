//! The node status setters (upstream's pkg/kubelet/nodestatus): each fills one part of the
//! Node's status from what the kubelet knows, so registration and every heartbeat build
//! the status the same way.

use crate::cm::allocatable::NodeResources;
use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, NodeAddress, NodeCondition, NodeDaemonEndpoints,
    NodeRuntimeHandler, NodeRuntimeHandlerFeatures, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodus_k8s::quantity::{Format, ParsedQuantity};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The version the kubelet reports (kubeletVersion, kubeProxyVersion), matching the API
/// server's gitVersion.
pub const KUBELET_VERSION: &str = "v1.33.0+nodus";

/// upstream's nodeStatusMaxImages default.
pub const MAX_IMAGES: usize = 50;
/// upstream's maxNamesPerImageInNodeStatus.
const MAX_NAMES_PER_IMAGE: usize = 5;

/// Go's GOARCH for this machine (what `kubernetes.io/arch` and nodeInfo.architecture say).
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

fn quantity(nanos: i128, format: Format) -> Quantity {
    Quantity(ParsedQuantity::from_nanos(nanos, format).canonical())
}

/// Capacity or Allocatable as the API lists them: cpu, memory, ephemeral-storage, pods and
/// hugepages-<size>, in upstream's formats (memory in binary SI, e.g. `8130972Ki`).
pub fn resource_list(r: &NodeResources) -> BTreeMap<String, Quantity> {
    const NANO: i128 = 1_000_000_000;
    let mut m = BTreeMap::new();
    m.insert(
        "cpu".into(),
        quantity(r.cpu_milli as i128 * 1_000_000, Format::DecimalSI),
    );
    m.insert(
        "memory".into(),
        quantity(r.memory_bytes.max(0) as i128 * NANO, Format::BinarySI),
    );
    m.insert(
        "ephemeral-storage".into(),
        quantity(
            r.ephemeral_storage_bytes.max(0) as i128 * NANO,
            Format::BinarySI,
        ),
    );
    m.insert(
        "pods".into(),
        quantity(r.pods as i128 * NANO, Format::DecimalSI),
    );
    for (name, bytes) in &r.hugepages {
        m.insert(
            name.clone(),
            quantity((*bytes).max(0) as i128 * NANO, Format::BinarySI),
        );
    }
    m
}

/// InternalIP and Hostname, as upstream's NodeAddress setter without a cloud provider.
pub fn addresses(node_ip: Option<IpAddr>, hostname: &str) -> Vec<NodeAddress> {
    let mut out = Vec::new();
    if let Some(ip) = node_ip {
        out.push(NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        });
    }
    out.push(NodeAddress {
        type_: "Hostname".into(),
        address: hostname.to_string(),
    });
    out
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// PRETTY_NAME from /etc/os-release (upstream's cadvisor reads the same), else "Linux".
pub fn os_image() -> String {
    let text = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "Linux".into())
}

/// nodeInfo: machine, boot and system ids, kernel, OS image, runtime and kubelet versions.
pub fn node_info(runtime_version: &str) -> NodeSystemInfo {
    let kernel = read_trim("/proc/sys/kernel/osrelease");
    let machine_id = {
        let m = read_trim("/etc/machine-id");
        if m.is_empty() {
            read_trim("/var/lib/dbus/machine-id")
        } else {
            m
        }
    };
    NodeSystemInfo {
        machine_id,
        system_uuid: read_trim("/sys/class/dmi/id/product_uuid"),
        boot_id: read_trim("/proc/sys/kernel/random/boot_id"),
        kernel_version: kernel,
        os_image: os_image(),
        container_runtime_version: runtime_version.to_string(),
        kubelet_version: KUBELET_VERSION.into(),
        kube_proxy_version: KUBELET_VERSION.into(),
        operating_system: "linux".into(),
        architecture: go_arch().into(),
        ..Default::default()
    }
}

pub fn daemon_endpoints(port: i32) -> NodeDaemonEndpoints {
    NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint { port }),
    }
}

/// runtimeHandlers: each handler the runtime reports and whether it supports recursive
/// read-only mounts and user namespaces (the default handler's name is empty), so users
/// and schedulers can see where `hostUsers: false` can run. Sorted by name, so a runtime
/// that lists its handlers in a different order each time does not count as a change.
pub fn runtime_handlers(handlers: &[cri::runtime::v1::RuntimeHandler]) -> Vec<NodeRuntimeHandler> {
    let mut handlers: Vec<_> = handlers.iter().collect();
    handlers.sort_by(|a, b| a.name.cmp(&b.name));
    handlers
        .into_iter()
        .map(|h| {
            let f = h.features.unwrap_or_default();
            NodeRuntimeHandler {
                name: Some(h.name.clone()),
                features: Some(NodeRuntimeHandlerFeatures {
                    recursive_read_only_mounts: Some(f.recursive_read_only_mounts),
                    user_namespaces: Some(f.user_namespaces),
                }),
            }
        })
        .collect()
}

/// The images on the node, largest first, at most [`MAX_IMAGES`], each with up to five
/// names (digests first, then tags), as upstream's Images setter.
pub fn images(list: &[cri::runtime::v1::Image]) -> Vec<ContainerImage> {
    let mut sorted: Vec<&cri::runtime::v1::Image> = list.iter().collect();
    sorted.sort_by_key(|i| std::cmp::Reverse(i.size));
    sorted
        .into_iter()
        .take(MAX_IMAGES)
        .map(|i| {
            let mut names: Vec<String> = i
                .repo_digests
                .iter()
                .chain(i.repo_tags.iter())
                .cloned()
                .collect();
            names.truncate(MAX_NAMES_PER_IMAGE);
            ContainerImage {
                names: Some(names),
                size_bytes: Some(i.size as i64),
            }
        })
        .collect()
}

/// The standard labels a kubelet puts on its Node.
pub fn default_labels(node: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), node.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), go_arch().to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), go_arch().to_string()),
    ])
}

/// One condition's verdict before times are filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub type_: &'static str,
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// Ready: KubeletReady, or KubeletNotReady with the runtime, PLEG and network errors
/// joined as upstream's error aggregate prints them.
pub fn ready(errors: &[String]) -> Verdict {
    if errors.is_empty() {
        return Verdict {
            type_: "Ready",
            status: "True",
            reason: "KubeletReady",
            message: "kubelet is posting ready status".into(),
        };
    }
    let message = if errors.len() == 1 {
        errors[0].clone()
    } else {
        format!("[{}]", errors.join(", "))
    };
    Verdict {
        type_: "Ready",
        status: "False",
        reason: "KubeletNotReady",
        message,
    }
}

/// The pressure conditions, as the eviction manager judges them, with upstream's reasons
/// and messages.
pub fn pressure(memory: bool, disk: bool, pid: bool) -> [Verdict; 3] {
    let v = |type_, on: bool, yes, no, yes_msg: &str, no_msg: &str| Verdict {
        type_,
        status: if on { "True" } else { "False" },
        reason: if on { yes } else { no },
        message: if on { yes_msg } else { no_msg }.to_string(),
    };
    [
        v(
            "MemoryPressure",
            memory,
            "KubeletHasInsufficientMemory",
            "KubeletHasSufficientMemory",
            "kubelet has insufficient memory available",
            "kubelet has sufficient memory available",
        ),
        v(
            "DiskPressure",
            disk,
            "KubeletHasDiskPressure",
            "KubeletHasNoDiskPressure",
            "kubelet has disk pressure",
            "kubelet has no disk pressure",
        ),
        v(
            "PIDPressure",
            pid,
            "KubeletHasInsufficientPID",
            "KubeletHasSufficientPID",
            "kubelet has insufficient PID available",
            "kubelet has sufficient PID available",
        ),
    ]
}

/// The node event a condition's new verdict calls for (upstream records one on every
/// transition, and on the first report).
pub fn transition_event(v: &Verdict) -> Option<&'static str> {
    Some(match (v.type_, v.status) {
        ("Ready", "True") => "NodeReady",
        ("Ready", _) => "NodeNotReady",
        ("MemoryPressure", "True") => "NodeHasInsufficientMemory",
        ("MemoryPressure", _) => "NodeHasSufficientMemory",
        ("DiskPressure", "True") => "NodeHasDiskPressure",
        ("DiskPressure", _) => "NodeHasNoDiskPressure",
        ("PIDPressure", "True") => "NodeHasInsufficientPID",
        ("PIDPressure", _) => "NodeHasSufficientPID",
        _ => return None,
    })
}

/// Turns verdicts into conditions: lastHeartbeatTime is now; lastTransitionTime is kept
/// from `old` while the status stays the same.
pub fn conditions(verdicts: &[Verdict], old: &[NodeCondition], now: Time) -> Vec<NodeCondition> {
    verdicts
        .iter()
        .map(|v| {
            let prev = old.iter().find(|c| c.type_ == v.type_);
            let transition = match prev {
                Some(p) if p.status == v.status && p.last_transition_time.is_some() => {
                    p.last_transition_time.clone()
                }
                _ => Some(now.clone()),
            };
            NodeCondition {
                type_: v.type_.to_string(),
                status: v.status.to_string(),
                reason: Some(v.reason.to_string()),
                message: Some(v.message.clone()),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: transition,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_handlers_carry_their_features() {
        use cri::runtime::v1 as pb;
        let got = runtime_handlers(&[
            pb::RuntimeHandler {
                name: "crun".into(),
                features: None,
            },
            pb::RuntimeHandler {
                name: String::new(),
                features: Some(pb::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: true,
                }),
            },
        ]);
        assert_eq!(
            serde_json::to_value(&got).unwrap(),
            serde_json::json!([
                {"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
                {"name": "crun", "features": {"recursiveReadOnlyMounts": false, "userNamespaces": false}},
            ])
        );
    }

    #[test]
    fn resources_print_like_upstream() {
        let r = NodeResources {
            cpu_milli: 2000,
            memory_bytes: 8_130_972 * 1024,
            ephemeral_storage_bytes: 1 << 30,
            pods: 110,
            hugepages: vec![("hugepages-2Mi".into(), 0)],
        };
        let m = resource_list(&r);
        assert_eq!(m["cpu"].0, "2");
        assert_eq!(m["memory"].0, "8130972Ki");
        assert_eq!(m["ephemeral-storage"].0, "1Gi");
        assert_eq!(m["pods"].0, "110");
        assert_eq!(m["hugepages-2Mi"].0, "0");
        let half = NodeResources {
            cpu_milli: 1900,
            ..r
        };
        assert_eq!(resource_list(&half)["cpu"].0, "1900m");
    }

    #[test]
    fn ready_messages_aggregate_like_upstream() {
        assert_eq!(ready(&[]).reason, "KubeletReady");
        let one = ready(&["container runtime is down".into()]);
        assert_eq!(
            (one.status, one.reason, one.message.as_str()),
            ("False", "KubeletNotReady", "container runtime is down")
        );
        let two = ready(&["a".into(), "b".into()]);
        assert_eq!(two.message, "[a, b]");
    }

    #[test]
    fn transition_time_kept_while_status_holds() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1000).unwrap());
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(2000).unwrap());
        let first = conditions(&[ready(&[])], &[], t0.clone());
        let again = conditions(&[ready(&[])], &first, t1.clone());
        assert_eq!(again[0].last_transition_time, Some(t0));
        assert_eq!(again[0].last_heartbeat_time, Some(t1.clone()));
        let down = conditions(&[ready(&["x".into()])], &again, t1.clone());
        assert_eq!(down[0].last_transition_time, Some(t1));
    }

    #[test]
    fn images_largest_first_with_at_most_five_names() {
        let img = |size, n: usize| cri::runtime::v1::Image {
            size,
            repo_tags: (0..n).map(|i| format!("t{i}")).collect(),
            repo_digests: vec!["d".into()],
            ..Default::default()
        };
        let out = images(&[img(1, 1), img(3, 9)]);
        assert_eq!(out[0].size_bytes, Some(3));
        assert_eq!(out[0].names.as_ref().unwrap().len(), 5);
        assert_eq!(out[0].names.as_ref().unwrap()[0], "d");
    }
}
