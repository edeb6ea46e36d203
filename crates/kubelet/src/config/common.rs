//! What the file and HTTP sources share (upstream's `config/common.go`): decoding a manifest
//! into pods and the defaults a static pod gets (name, UID, annotations, node, toleration).

use super::{CONFIG_HASH_ANNOTATION, pod_full_name};
use k8s_openapi::api::core::v1::{Pod, PodStatus, Toleration};
use std::collections::BTreeMap;

/// Manifests larger than this are refused, as upstream's `maxConfigLength`.
pub const MAX_CONFIG_LENGTH: usize = 10 << 20;

/// Where a manifest came from; part of a static pod's UID.
#[derive(Clone, Copy, Debug)]
pub enum ManifestOrigin<'a> {
    /// A file of the static pod directory, by path.
    File(&'a str),
    /// The `--manifest-url`.
    Url(&'a str),
}

impl ManifestOrigin<'_> {
    fn name(&self) -> &str {
        match self {
            ManifestOrigin::File(p) | ManifestOrigin::Url(p) => p,
        }
    }
}

/// Why (part of) a manifest was not turned into a pod.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ManifestError {
    #[error("{origin}: couldn't parse as pod({message}), please check manifest file.")]
    Parse { origin: String, message: String },
    #[error("{origin}: manifest is {size} bytes, larger than the {max} byte limit")]
    TooLarge {
        origin: String,
        size: usize,
        max: usize,
    },
    #[error("{origin}: invalid pod: name is needed for the pod")]
    MissingName { origin: String },
    /// What 1.33 refuses in a static pod: sources only the API server can provide.
    #[error("{origin}: {message}")]
    Forbidden { origin: String, message: String },
    #[error("{origin}: invalid pod {pod:?}: [{}]", .errors.join(", "))]
    Invalid {
        origin: String,
        pod: String,
        errors: Vec<String>,
    },
}

/// Upstream's `generatePodName`: static pod names carry the node name so that mirror pods
/// of different nodes do not collide.
pub fn generate_pod_name(name: &str, node_name: &str) -> String {
    format!("{name}-{}", node_name.to_lowercase())
}

/// 128-bit FNV-1a, the hash upstream derives static pod UIDs with, as lowercase hex.
pub fn fnv128a_hex(parts: &[&[u8]]) -> String {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for part in parts {
        for b in *part {
            h ^= u128::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    }
    hex::encode(h.to_be_bytes())
}

/// Upstream's `applyDefaults` for a decoded static pod: a UID derived from the pod's
/// content and its origin when the manifest gives none, the node-qualified name, namespace
/// `default`, `spec.nodeName`, the `kubernetes.io/config.hash` annotation, for files the
/// NoExecute toleration that keeps static pods from being evicted by node taints, and
/// phase Pending.
pub fn apply_defaults(pod: &mut Pod, origin: ManifestOrigin<'_>, node_name: &str) {
    if pod.metadata.uid.as_deref().unwrap_or_default().is_empty() {
        // Upstream hashes its in-memory object (spew dump); the JSON form plays that role
        // here: same inputs, same UID, and any content change gives a new UID.
        let content = serde_json::to_vec(pod).unwrap_or_default();
        let uid = match origin {
            ManifestOrigin::File(path) => fnv128a_hex(&[
                &content,
                format!("host:{node_name}").as_bytes(),
                format!("file:{path}").as_bytes(),
            ]),
            ManifestOrigin::Url(url) => fnv128a_hex(&[&content, format!("url:{url}").as_bytes()]),
        };
        pod.metadata.uid = Some(uid);
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(generate_pod_name(&name, node_name));
    if pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        pod.metadata.namespace = Some("default".to_string());
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_HASH_ANNOTATION.to_string(), uid);
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node_name.to_string());
        if matches!(origin, ManifestOrigin::File(_)) {
            add_or_update_toleration(
                spec.tolerations.get_or_insert_with(Vec::new),
                Toleration {
                    operator: Some("Exists".to_string()),
                    effect: Some("NoExecute".to_string()),
                    ..Default::default()
                },
            );
        }
    }
    pod.status.get_or_insert_with(PodStatus::default).phase = Some("Pending".to_string());
}

/// Upstream's `AddOrUpdateTolerationInPod`: replace a toleration that matches on key,
/// operator, value and effect, else append.
fn add_or_update_toleration(tolerations: &mut Vec<Toleration>, toleration: Toleration) {
    let norm = |t: &Toleration| {
        (
            t.key.clone().unwrap_or_default(),
            t.operator.clone().unwrap_or_else(|| "Equal".to_string()),
            t.value.clone().unwrap_or_default(),
            t.effect.clone().unwrap_or_default(),
        )
    };
    let want = norm(&toleration);
    match tolerations.iter_mut().find(|t| norm(t) == want) {
        Some(existing) => *existing = toleration,
        None => tolerations.push(toleration),
    }
}

/// Decodes one manifest (YAML or JSON) into static pods, with defaults applied and
/// validated. Upstream reads one pod per file; this also accepts several YAML documents
/// and `v1` `List`/`PodList` objects. A document that fails is reported in the second
/// vector and does not affect the others.
pub fn decode_manifest(
    data: &[u8],
    origin: ManifestOrigin<'_>,
    node_name: &str,
) -> (Vec<Pod>, Vec<ManifestError>) {
    let origin_name = origin.name().to_string();
    let parse_err = |message: String| ManifestError::Parse {
        origin: origin_name.clone(),
        message,
    };
    if data.len() > MAX_CONFIG_LENGTH {
        return (
            Vec::new(),
            vec![ManifestError::TooLarge {
                origin: origin_name.clone(),
                size: data.len(),
                max: MAX_CONFIG_LENGTH,
            }],
        );
    }
    let text = match std::str::from_utf8(data) {
        Ok(t) => t,
        Err(e) => return (Vec::new(), vec![parse_err(e.to_string())]),
    };
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        match <serde_json::Value as serde::Deserialize>::deserialize(doc) {
            Ok(serde_json::Value::Null) => {}
            Ok(v) => objects.push(v),
            Err(e) => {
                // A syntax error ends the stream; what was read before stays valid.
                errors.push(parse_err(e.to_string()));
                break;
            }
        }
    }
    let mut pods = Vec::new();
    for obj in objects {
        match object_pods(obj) {
            Ok(items) => {
                for item in items {
                    match finish_pod(item, origin, node_name) {
                        Ok(p) => pods.push(p),
                        Err(e) => errors.push(e),
                    }
                }
            }
            Err(message) => errors.push(parse_err(message)),
        }
    }
    (pods, errors)
}

/// The raw pods inside one decoded object: itself if it is a Pod, its items if it is a
/// List or PodList.
fn object_pods(obj: serde_json::Value) -> Result<Vec<serde_json::Value>, String> {
    let kind = obj.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    let api_version = obj
        .get("apiVersion")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    if kind.is_empty() {
        // Upstream quotes the whole object here; a manifest directory may hold (or link to)
        // a file that is not a manifest at all, such as a secret, and its content must not
        // reach the log. Only the shape is named.
        let shape = match &obj {
            serde_json::Value::Object(m) => {
                format!("an object with {} top-level fields", m.len())
            }
            serde_json::Value::Array(_) => "a list".to_string(),
            serde_json::Value::String(_) => "a string".to_string(),
            _ => "a scalar".to_string(),
        };
        return Err(format!("Object 'Kind' is missing in {shape}"));
    }
    if api_version != "v1" {
        return Err(format!(
            "no kind \"{kind}\" is registered for version \"{api_version}\""
        ));
    }
    match kind {
        "Pod" => Ok(vec![obj]),
        "List" | "PodList" => {
            let items = obj
                .get("items")
                .and_then(|i| i.as_array())
                .cloned()
                .unwrap_or_default();
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let k = item.get("kind").and_then(|k| k.as_str());
                // PodList items carry no kind; List items must say they are pods.
                if kind == "List" && k != Some("Pod") {
                    return Err(format!(
                        "List item of kind {:?} is not a Pod",
                        k.unwrap_or_default()
                    ));
                }
                out.push(item);
            }
            Ok(out)
        }
        other => Err(format!("invalid pod: object of kind \"{other}\"")),
    }
}

fn finish_pod(
    raw: serde_json::Value,
    origin: ManifestOrigin<'_>,
    node_name: &str,
) -> Result<Pod, ManifestError> {
    let origin_name = origin.name().to_string();
    // Upstream's decoder ignores unknown fields in manifests; say so rather than silently.
    let pod_gvk = nodus_k8s::Gvk::new("", "v1", "Pod");
    for field in nodus_k8s::strict::unknown_fields(&pod_gvk, &raw) {
        tracing::warn!(
            origin = %origin_name,
            field = %field.trim_start_matches('.'),
            "unknown field in pod manifest, ignored"
        );
    }
    let mut pod: Pod = serde_json::from_value(raw).map_err(|e| ManifestError::Parse {
        origin: origin_name.clone(),
        message: e.to_string(),
    })?;
    if pod.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err(ManifestError::MissingName {
            origin: origin_name,
        });
    }
    nodus_k8s::defaults::default_pod(&mut pod);
    apply_defaults(&mut pod, origin, node_name);
    let errors = nodus_k8s::validation::validate_pod_spec_for_kubelet(&pod);
    if !errors.is_empty() {
        return Err(ManifestError::Invalid {
            origin: origin_name,
            pod: pod_full_name(&pod),
            errors: errors.iter().map(|e| e.to_string()).collect(),
        });
    }
    if let Some(message) = forbidden_in_static_pod(&pod) {
        return Err(ManifestError::Forbidden {
            origin: origin_name,
            message: message.to_string(),
        });
    }
    Ok(pod)
}

/// Kubernetes 1.33's checks on static pods (before PreventStaticPodAPIReferences): no
/// ClusterTrustBundle projections and no ResourceClaims, which need the API server.
fn forbidden_in_static_pod(pod: &Pod) -> Option<&'static str> {
    let spec = pod.spec.as_ref()?;
    let trust_bundle = spec.volumes.iter().flatten().any(|v| {
        v.projected.as_ref().is_some_and(|p| {
            p.sources
                .iter()
                .flatten()
                .any(|s| s.cluster_trust_bundle.is_some())
        })
    });
    if trust_bundle {
        return Some("static pods may not use ClusterTrustBundle projected volume sources");
    }
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return Some("static pods may not use ResourceClaims");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CONFIG_HASH_ANNOTATION, FILE_SOURCE};

    const NGINX: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels:
    app: web
spec:
  containers:
  - name: nginx
    image: nginx:1.27
"#;

    fn decode_file(data: &str) -> (Vec<Pod>, Vec<ManifestError>) {
        decode_manifest(
            data.as_bytes(),
            ManifestOrigin::File("/etc/kubernetes/manifests/web.yaml"),
            "node-1",
        )
    }

    #[test]
    fn fnv128a_matches_the_reference_vectors() {
        // Published FNV-1a 128-bit test vectors (the same as Go's hash/fnv).
        assert_eq!(fnv128a_hex(&[b""]), "6c62272e07bb014262b821756295c58d");
        assert_eq!(fnv128a_hex(&[b"a"]), "d228cb696f1a8caf78912b704e4a8964");
        assert_eq!(fnv128a_hex(&[b"fo", b"obar"]), fnv128a_hex(&[b"foobar"]));
    }

    #[test]
    fn static_pod_gets_upstream_defaults() {
        let (pods, errors) = decode_file(NGINX);
        assert!(errors.is_empty(), "{errors:?}");
        let p = &pods[0];
        assert_eq!(p.metadata.name.as_deref(), Some("web-node-1"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("default"));
        let uid = p.metadata.uid.clone().unwrap_or_default();
        assert_eq!(uid.len(), 32, "uid {uid:?} is not a 128-bit hex hash");
        let annotations = p.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.get(CONFIG_HASH_ANNOTATION), Some(&uid));
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        // Node names are lowercase (the kubelet lowercases the host name); the pod name
        // lowercases whatever it is given, as upstream's generatePodName.
        assert_eq!(generate_pod_name("web", "Node-1"), "web-node-1");
        let tolerations = spec.tolerations.clone().unwrap_or_default();
        assert!(
            tolerations
                .iter()
                .any(|t| t.operator.as_deref() == Some("Exists")
                    && t.effect.as_deref() == Some("NoExecute")
                    && t.key.is_none())
        );
        assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
        // The API defaults apply as for a pod created through the API server.
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        // The source annotation is the merger's business, not the decoder's.
        assert!(!annotations.contains_key(crate::config::CONFIG_SOURCE_ANNOTATION));
        let _ = FILE_SOURCE;
    }

    #[test]
    fn uid_is_stable_and_depends_on_content_node_and_file() {
        let uid = |data: &str, origin: ManifestOrigin<'_>, node: &str| {
            decode_manifest(data.as_bytes(), origin, node).0[0]
                .metadata
                .uid
                .clone()
                .unwrap_or_default()
        };
        let f = ManifestOrigin::File("/m/web.yaml");
        let base = uid(NGINX, f, "n1");
        assert_eq!(base, uid(NGINX, f, "n1"));
        assert_ne!(base, uid(&NGINX.replace("1.27", "1.28"), f, "n1"));
        assert_ne!(base, uid(NGINX, f, "n2"));
        assert_ne!(
            base,
            uid(NGINX, ManifestOrigin::File("/m/other.yaml"), "n1")
        );
        assert_ne!(base, uid(NGINX, ManifestOrigin::Url("http://x/m"), "n1"));
        // A UID in the manifest is kept.
        let given = NGINX.replace("  name: web\n", "  name: web\n  uid: abc-123\n");
        assert_eq!(uid(&given, f, "n1"), "abc-123");
    }

    #[test]
    fn url_pods_get_no_toleration_and_keep_their_namespace() {
        let data = NGINX.replace("  name: web\n", "  name: web\n  namespace: kube-system\n");
        let (pods, errors) = decode_manifest(
            data.as_bytes(),
            ManifestOrigin::Url("http://127.0.0.1/p"),
            "n1",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(pods[0].metadata.namespace.as_deref(), Some("kube-system"));
        let spec = pods[0].spec.as_ref().unwrap();
        assert!(spec.tolerations.as_ref().is_none_or(|t| t.is_empty()));
    }

    #[test]
    fn json_lists_and_multi_document_yaml_are_accepted() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "PodList",
            "items": [
                {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
                {"metadata": {"name": "b"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
            ]
        })
        .to_string();
        let (pods, errors) = decode_file(&json);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(pods.len(), 2);
        let two = format!("{NGINX}---\n{}", NGINX.replace("name: web", "name: api"));
        let (pods, errors) = decode_file(&two);
        assert!(errors.is_empty(), "{errors:?}");
        let names: Vec<_> = pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, vec!["web-node-1", "api-node-1"]);
    }

    #[test]
    fn bad_manifests_are_reported_and_do_not_hide_good_documents() {
        let (pods, errors) = decode_file("apiVersion: v1\nkind: Pod\nmetadata: [oops\n");
        assert!(pods.is_empty());
        let msg = errors[0].to_string();
        assert!(
            msg.starts_with("/etc/kubernetes/manifests/web.yaml: couldn't parse as pod("),
            "{msg}"
        );

        let (_, errors) = decode_file("apiVersion: v1\nmetadata:\n  name: x\n");
        assert!(
            errors[0].to_string().contains("Object 'Kind' is missing"),
            "{}",
            errors[0]
        );

        // A file that is no manifest (a token, a key) is refused without its content.
        for secret in ["s3cr3t-t0ken\n", "password: hunter2\n", "[hunter2]\n"] {
            let (pods, errors) = decode_file(secret);
            assert!(pods.is_empty());
            let msg = errors[0].to_string();
            assert!(msg.contains("Object 'Kind' is missing in"), "{msg}");
            assert!(
                !msg.contains("hunter2") && !msg.contains("s3cr3t"),
                "the content leaked: {msg}"
            );
        }

        let (_, errors) = decode_file("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n");
        assert!(errors[0].to_string().contains("Service"), "{}", errors[0]);

        let (_, errors) = decode_file(&NGINX.replace("  name: web\n", ""));
        assert!(
            errors[0]
                .to_string()
                .ends_with("invalid pod: name is needed for the pod"),
            "{}",
            errors[0]
        );

        let claims =
            format!("{NGINX}  resourceClaims:\n  - name: gpu\n    resourceClaimName: gpu\n");
        let (pods, errors) = decode_file(&claims);
        assert!(pods.is_empty());
        assert!(
            errors[0]
                .to_string()
                .ends_with("static pods may not use ResourceClaims"),
            "{}",
            errors[0]
        );

        let mixed = format!(
            "{}---\n{NGINX}",
            NGINX.replace("kind: Pod", "kind: Deployment")
        );
        let (pods, errors) = decode_file(&mixed);
        assert_eq!((pods.len(), errors.len()), (1, 1));
    }

    #[test]
    fn validation_errors_name_the_field() {
        let (pods, errors) = decode_file(&NGINX.replace("    image: nginx:1.27\n", ""));
        assert!(pods.is_empty());
        let msg = errors.first().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("spec.containers[0].image"), "{msg}");
        assert!(
            msg.starts_with("/etc/kubernetes/manifests/web.yaml: invalid pod"),
            "{msg}"
        );
        let (pods, errors) = decode_file(&format!("{NGINX}  restartPolicy: Sometimes\n"));
        assert!(pods.is_empty());
        let msg = errors.first().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("spec.restartPolicy"), "{msg}");
    }

    /// The shape kubeadm writes to /etc/kubernetes/manifests: host network, priority
    /// class, seccomp, probes against 127.0.0.1, hostPath volumes, resource requests.
    const KUBEADM_ETCD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  annotations:
    kubeadm.kubernetes.io/etcd.advertise-client-urls: https://10.0.0.10:2379
  creationTimestamp: null
  labels:
    component: etcd
    tier: control-plane
  name: etcd
  namespace: kube-system
spec:
  containers:
  - command:
    - etcd
    - --advertise-client-urls=https://10.0.0.10:2379
    - --data-dir=/var/lib/etcd
    image: registry.k8s.io/etcd:3.5.21-0
    imagePullPolicy: IfNotPresent
    livenessProbe:
      failureThreshold: 8
      httpGet:
        host: 127.0.0.1
        path: /livez
        port: 2381
        scheme: HTTP
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
    name: etcd
    resources:
      requests:
        cpu: 100m
        memory: 100Mi
    startupProbe:
      failureThreshold: 24
      httpGet:
        host: 127.0.0.1
        path: /readyz
        port: 2381
        scheme: HTTP
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
    volumeMounts:
    - mountPath: /var/lib/etcd
      name: etcd-data
  hostNetwork: true
  priority: 2000001000
  priorityClassName: system-node-critical
  securityContext:
    seccompProfile:
      type: RuntimeDefault
  volumes:
  - hostPath:
      path: /var/lib/etcd
      type: DirectoryOrCreate
    name: etcd-data
status: {}
"#;

    #[test]
    fn a_kubeadm_control_plane_manifest_is_accepted() {
        let (pods, errors) = decode_manifest(
            KUBEADM_ETCD.as_bytes(),
            ManifestOrigin::File("/etc/kubernetes/manifests/etcd.yaml"),
            "cp-1",
        );
        assert!(errors.is_empty(), "{errors:?}");
        let p = &pods[0];
        assert_eq!(p.metadata.name.as_deref(), Some("etcd-cp-1"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("kube-system"));
        let annotations = p.metadata.annotations.clone().unwrap_or_default();
        assert!(annotations.contains_key("kubeadm.kubernetes.io/etcd.advertise-client-urls"));
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.host_network, Some(true));
        let probe = spec.containers[0].startup_probe.as_ref().unwrap();
        assert_eq!(probe.failure_threshold, Some(24));
        assert_eq!(probe.success_threshold, Some(1), "probe defaults applied");
    }
}
