//! Upstream's API defaulting (`SetDefaults_*`) for the catalogue kinds, applied to JSON.
//!
//! Pod-only rules (requests from limits, `enableServiceLinks`) apply to Pods and not to pod
//! templates, as upstream keeps them out of `SetDefaults_PodSpec`. A few values upstream
//! sets in registry strategies or admission rather than defaulting are included where noted,
//! because every cluster applies them: namespace finalizers, the DefaultTolerationSeconds
//! admission plugin ([`default_tolerations`]), and a Service's `ipFamilyPolicy`.
//!
//! Resource lists (requests, limits, overhead, node capacity and allocatable) are rounded up
//! to milli-units and written in canonical form (`0.5` → `500m`, `1024Mi` → `1Gi`, a YAML
//! number `1` → `"1"`), as upstream stores them.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value, json};

use crate::gvk::Gvk;

/// Applies upstream's defaults to an object of a catalogue kind (others are left alone).
pub fn default_object(gvk: &Gvk, obj: &mut Value) {
    let Value::Object(o) = obj else { return };
    match (gvk.group.as_str(), gvk.kind.as_str()) {
        ("", "Pod") => default_pod_value(o),
        ("", "Service") => default_service(o),
        ("", "Namespace") => default_namespace(o),
        ("", "Secret") => set_str(o, "type", "Opaque"),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => default_crd(o),
        ("", "Node") => default_node(o),
        ("", "Endpoints") => {
            for subset in arr_mut(o, "subsets") {
                if let Value::Object(s) = subset {
                    for port in arr_mut(s, "ports") {
                        if let Value::Object(p) = port {
                            set_str(p, "protocol", "TCP");
                        }
                    }
                }
            }
        }
        ("discovery.k8s.io", "EndpointSlice") => {
            for port in arr_mut(o, "ports") {
                if let Value::Object(p) = port {
                    set_val(p, "name", json!(""));
                    set_val(p, "protocol", json!("TCP"));
                }
            }
        }
        ("scheduling.k8s.io", "PriorityClass") => {
            set_val(o, "preemptionPolicy", json!("PreemptLowerPriority"))
        }
        ("networking.k8s.io", "NetworkPolicy") => default_network_policy(o),
        ("networking.k8s.io", "IngressClass") => {
            if let Some(Value::Object(p)) = o.get_mut("spec").and_then(|s| s.get_mut("parameters"))
            {
                set_str(p, "scope", "Cluster");
            }
        }
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => {
            set_val(obj_mut(o, "spec"), "matchingPrecedence", json!(1000));
        }
        ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration") => {
            default_priority_level(obj_mut(o, "spec"))
        }
        ("apiregistration.k8s.io", "APIService") => {
            if let Some(Value::Object(svc)) = o.get_mut("spec").and_then(|s| s.get_mut("service")) {
                set_val(svc, "port", json!(443));
            }
        }
        ("apps", "Deployment") => default_deployment(o),
        ("apps", "ReplicaSet") => {
            let spec = obj_mut(o, "spec");
            set_val(spec, "replicas", json!(1));
            default_template(spec);
        }
        ("apps", "DaemonSet") => default_daemonset(o),
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            default_role_binding(o)
        }
        ("batch", "Job") => default_job(o),
        ("batch", "CronJob") => default_cronjob(o),
        ("", "PersistentVolume") => default_persistent_volume(o),
        ("", "PersistentVolumeClaim") => default_persistent_volume_claim(o),
        ("storage.k8s.io", "StorageClass") => {
            set_val(o, "reclaimPolicy", json!("Delete"));
            set_val(o, "volumeBindingMode", json!("Immediate"));
        }
        ("", "ReplicationController") => default_replication_controller(o),
        ("apps", "StatefulSet") => default_statefulset(o),
        _ => {}
    }
}

/// Upstream's `SetDefaults_PersistentVolume` (and the hostPath type default inside it).
fn default_persistent_volume(o: &mut Map<String, Value>) {
    let spec = obj_mut(o, "spec");
    set_str(spec, "persistentVolumeReclaimPolicy", "Retain");
    set_str(spec, "volumeMode", "Filesystem");
    if let Some(Value::Object(h)) = spec.get_mut("hostPath") {
        set_val(h, "type", json!(""));
    }
    canonical_resource_list(spec.get_mut("capacity"));
    set_str(obj_mut(o, "status"), "phase", "Pending");
}

/// Upstream's `SetDefaults_PersistentVolumeClaim`.
fn default_persistent_volume_claim(o: &mut Map<String, Value>) {
    let spec = obj_mut(o, "spec");
    set_str(spec, "volumeMode", "Filesystem");
    if let Some(Value::Object(r)) = spec.get_mut("resources") {
        canonical_resource_list(r.get_mut("requests"));
        canonical_resource_list(r.get_mut("limits"));
    }
    set_str(obj_mut(o, "status"), "phase", "Pending");
}

/// The DefaultTolerationSeconds admission plugin: pods that do not tolerate the not-ready and
/// unreachable NoExecute taints get tolerations for 300 seconds. Applied on pod creation.
pub fn default_tolerations(pod: &mut Value) {
    let Some(spec) = pod.as_object_mut().map(|p| obj_mut(p, "spec")) else {
        return;
    };
    let tolerates = |tols: &[Value], key: &str| {
        tols.iter().any(|t| {
            let k = t.get("key").and_then(Value::as_str).unwrap_or("");
            let e = t.get("effect").and_then(Value::as_str).unwrap_or("");
            (k == key || k.is_empty()) && (e == "NoExecute" || e.is_empty())
        })
    };
    let current: Vec<Value> = spec
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut added = Vec::new();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        if !tolerates(&current, key) {
            added.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
    if !added.is_empty() {
        let mut all = current;
        all.extend(added);
        spec.insert("tolerations".into(), Value::Array(all));
    }
}

/// The pod defaults on the typed struct (the kubelet applies them to static pods).
pub fn default_pod(pod: &mut Pod) {
    let Ok(mut v) = serde_json::to_value(&*pod) else {
        return;
    };
    default_object(&Gvk::new("", "v1", "Pod"), &mut v);
    // The defaulted JSON only adds valid fields to a value that came from the same type.
    if let Ok(p) = serde_json::from_value(v) {
        *pod = p;
    }
}

fn obj_mut<'a>(o: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = o
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(m) => m,
        _ => unreachable!("slot was just made an object"),
    }
}

fn arr_mut<'a>(o: &'a mut Map<String, Value>, key: &str) -> std::slice::IterMut<'a, Value> {
    match o.get_mut(key) {
        Some(Value::Array(a)) => a.iter_mut(),
        _ => [].iter_mut(),
    }
}

fn is_unset(v: Option<&Value>) -> bool {
    matches!(v, None | Some(Value::Null)) || v.and_then(Value::as_str) == Some("")
}

/// Sets a string field that is missing or empty (Go's zero value).
fn set_str(o: &mut Map<String, Value>, key: &str, value: &str) {
    if is_unset(o.get(key)) {
        o.insert(key.to_string(), json!(value));
    }
}

/// Sets a pointer field that is missing or null.
fn set_val(o: &mut Map<String, Value>, key: &str, value: Value) {
    if matches!(o.get(key), None | Some(Value::Null)) {
        o.insert(key.to_string(), value);
    }
}

/// Upstream's `SetDefaults_NetworkPolicy`: a policy naming no types is an Ingress policy,
/// and an Egress one too when it has egress rules; ports default to TCP.
fn default_network_policy(o: &mut Map<String, Value>) {
    let spec = obj_mut(o, "spec");
    obj_mut(spec, "podSelector");
    let has_egress = spec
        .get("egress")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if spec
        .get("policyTypes")
        .and_then(Value::as_array)
        .is_none_or(|a| a.is_empty())
    {
        let mut types = vec![json!("Ingress")];
        if has_egress {
            types.push(json!("Egress"));
        }
        spec.insert("policyTypes".into(), Value::Array(types));
    }
    for dir in ["ingress", "egress"] {
        for rule in arr_mut(spec, dir) {
            if let Value::Object(r) = rule {
                for port in arr_mut(r, "ports") {
                    if let Value::Object(p) = port {
                        set_str(p, "protocol", "TCP");
                    }
                }
            }
        }
    }
}

/// Upstream's v1 PriorityLevelConfiguration defaults (30 nominal shares for a limited level,
/// 64 queues of hand size 8 and length 50 when queuing).
fn default_priority_level(spec: &mut Map<String, Value>) {
    if let Some(Value::Object(ex)) = spec.get_mut("exempt") {
        set_val(ex, "nominalConcurrencyShares", json!(0));
        set_val(ex, "lendablePercent", json!(0));
    }
    if let Some(Value::Object(l)) = spec.get_mut("limited") {
        set_val(l, "nominalConcurrencyShares", json!(30));
        set_val(l, "lendablePercent", json!(0));
        if let Some(Value::Object(q)) = l
            .get_mut("limitResponse")
            .and_then(|r| r.get_mut("queuing"))
        {
            set_val(q, "queues", json!(64));
            set_val(q, "handSize", json!(8));
            set_val(q, "queueLengthLimit", json!(50));
        }
    }
}

fn default_pod_value(o: &mut Map<String, Value>) {
    let spec = obj_mut(o, "spec");
    for list in ["containers", "initContainers"] {
        for c in arr_mut(spec, list) {
            if let Value::Object(c) = c {
                requests_from_limits(c);
            }
        }
    }
    set_val(spec, "enableServiceLinks", json!(true));
    if spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
        default_host_network_ports(spec);
    }
    default_pod_spec(spec);
}

/// A limit without a request implies an equal request (Pods only, not templates).
fn requests_from_limits(c: &mut Map<String, Value>) {
    let Some(limits) = c
        .get("resources")
        .and_then(|r| r.get("limits"))
        .and_then(Value::as_object)
        .cloned()
    else {
        return;
    };
    let requests = obj_mut(obj_mut(c, "resources"), "requests");
    for (k, v) in limits {
        requests.entry(k).or_insert(v);
    }
}

fn default_host_network_ports(spec: &mut Map<String, Value>) {
    for list in ["containers", "initContainers"] {
        for c in arr_mut(spec, list) {
            let Value::Object(c) = c else { continue };
            for p in arr_mut(c, "ports") {
                let Value::Object(p) = p else { continue };
                let host = p.get("hostPort").and_then(Value::as_i64).unwrap_or(0);
                if host == 0
                    && let Some(cp) = p.get("containerPort").cloned()
                {
                    p.insert("hostPort".into(), cp);
                }
            }
        }
    }
}

/// `SetDefaults_PodSpec` plus the defaults of everything a pod spec contains.
fn default_pod_spec(spec: &mut Map<String, Value>) {
    set_str(spec, "dnsPolicy", "ClusterFirst");
    set_str(spec, "restartPolicy", "Always");
    set_val(spec, "securityContext", json!({}));
    set_val(spec, "terminationGracePeriodSeconds", json!(30));
    set_str(spec, "schedulerName", "default-scheduler");
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in arr_mut(spec, list) {
            if let Value::Object(c) = c {
                default_container(c);
                if let Some(Value::Object(r)) = c.get_mut("resources") {
                    for key in ["requests", "limits"] {
                        canonical_resource_list(r.get_mut(key));
                    }
                }
            }
        }
    }
    canonical_resource_list(spec.get_mut("overhead"));
    if let Some(Value::Object(r)) = spec.get_mut("resources") {
        for key in ["requests", "limits"] {
            canonical_resource_list(r.get_mut(key));
        }
    }
    for v in arr_mut(spec, "volumes") {
        if let Value::Object(v) = v {
            default_volume(v);
        }
    }
}

/// Upstream's `SetDefaults_ResourceList` rounds every quantity up to milli-units, and the
/// stored object carries each quantity in its canonical form (`0.5` → `500m`,
/// `1024Mi` → `1Gi`). Unparseable quantities are left for validation to report.
fn canonical_resource_list(list: Option<&mut Value>) {
    let Some(Value::Object(m)) = list else { return };
    for v in m.values_mut() {
        // YAML `cpu: 1` arrives as a JSON number; upstream decodes it and stores a string.
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => continue,
        };
        let Ok(q) = crate::quantity::parse_quantity(&text) else {
            continue;
        };
        let n = q.nano_value();
        let milli = 1_000_000i128;
        let rounded = if n % milli == 0 {
            n
        } else if n > 0 {
            (n / milli + 1) * milli
        } else {
            (n / milli - 1) * milli
        };
        *v = json!(crate::quantity::ParsedQuantity::from_nanos(rounded, q.format()).canonical());
    }
}

/// The image's tag as upstream's `parsers.ParseImageName` finds it (`latest` when neither a
/// tag nor a digest is given).
pub fn image_tag(image: &str) -> String {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let last_segment = name.rsplit('/').next().unwrap_or(name);
    match last_segment.rsplit_once(':') {
        Some((_, tag)) => tag.to_string(),
        None if digest.is_some() => String::new(),
        None => "latest".to_string(),
    }
}

fn default_container(c: &mut Map<String, Value>) {
    if is_unset(c.get("imagePullPolicy")) {
        let image = c.get("image").and_then(Value::as_str).unwrap_or("");
        let policy = if image_tag(image) == "latest" {
            "Always"
        } else {
            "IfNotPresent"
        };
        c.insert("imagePullPolicy".into(), json!(policy));
    }
    set_str(c, "terminationMessagePath", "/dev/termination-log");
    set_str(c, "terminationMessagePolicy", "File");
    for p in arr_mut(c, "ports") {
        if let Value::Object(p) = p {
            set_str(p, "protocol", "TCP");
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(Value::Object(p)) = c.get_mut(probe) {
            set_val(p, "timeoutSeconds", json!(1));
            set_val(p, "periodSeconds", json!(10));
            set_val(p, "successThreshold", json!(1));
            set_val(p, "failureThreshold", json!(3));
            default_http_get(p);
        }
    }
    if let Some(Value::Object(l)) = c.get_mut("lifecycle") {
        for hook in ["postStart", "preStop"] {
            if let Some(Value::Object(h)) = l.get_mut(hook) {
                default_http_get(h);
            }
        }
    }
    for e in arr_mut(c, "env") {
        if let Some(Value::Object(f)) = e.pointer_mut("/valueFrom/fieldRef") {
            set_str(f, "apiVersion", "v1");
        }
    }
}

fn default_http_get(handler: &mut Map<String, Value>) {
    if let Some(Value::Object(h)) = handler.get_mut("httpGet") {
        set_str(h, "path", "/");
        set_str(h, "scheme", "HTTP");
    }
}

/// Every volume source field of `v1.VolumeSource`; a volume naming none is an emptyDir.
const VOLUME_SOURCES: &[&str] = &[
    "hostPath",
    "emptyDir",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "persistentVolumeClaim",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "downwardAPI",
    "fc",
    "azureFile",
    "configMap",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "projected",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "csi",
    "ephemeral",
    "image",
];

/// The volume source fields of `v1.VolumeSource` (a volume must name exactly one).
pub fn volume_sources() -> &'static [&'static str] {
    VOLUME_SOURCES
}

fn default_volume(v: &mut Map<String, Value>) {
    let has_source = VOLUME_SOURCES
        .iter()
        .any(|s| !matches!(v.get(*s), None | Some(Value::Null)));
    if !has_source {
        v.insert("emptyDir".into(), json!({}));
    }
    if let Some(Value::Object(h)) = v.get_mut("hostPath") {
        set_val(h, "type", json!(""));
    }
    if let Some(Value::Object(img)) = v.get_mut("image")
        && is_unset(img.get("pullPolicy"))
    {
        let reference = img.get("reference").and_then(Value::as_str).unwrap_or("");
        let policy = if image_tag(reference) == "latest" {
            "Always"
        } else {
            "IfNotPresent"
        };
        img.insert("pullPolicy".into(), json!(policy));
    }
    for src in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(Value::Object(s)) = v.get_mut(src) {
            set_val(s, "defaultMode", json!(420));
        }
    }
    if let Some(Value::Object(d)) = v.get_mut("downwardAPI") {
        for item in arr_mut(d, "items") {
            if let Some(Value::Object(f)) = item.get_mut("fieldRef") {
                set_str(f, "apiVersion", "v1");
            }
        }
    }
    if let Some(Value::Object(p)) = v.get_mut("projected") {
        for s in arr_mut(p, "sources") {
            if let Some(Value::Object(t)) = s.get_mut("serviceAccountToken") {
                set_val(t, "expirationSeconds", json!(3600));
            }
            if let Some(Value::Object(d)) = s.get_mut("downwardAPI") {
                for item in arr_mut(d, "items") {
                    if let Some(Value::Object(f)) = item.get_mut("fieldRef") {
                        set_str(f, "apiVersion", "v1");
                    }
                }
            }
        }
    }
}

fn default_template(spec: &mut Map<String, Value>) {
    let template = obj_mut(spec, "template");
    default_pod_spec(obj_mut(template, "spec"));
}

fn default_deployment(o: &mut Map<String, Value>) {
    let spec = obj_mut(o, "spec");
    set_val(spec, "replicas", json!(1));
    let strategy = obj_mut(spec, "strategy");
    set_str(strategy, "type", "RollingUpdate");
    if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
        let ru = obj_mut(strategy, "rollingUpdate");
        set_val(ru, "maxUnavailable", json!("25%"));
        set_val(ru, "maxSurge", json!("25%"));
    }
    set_val(spec, "revisionHistoryLimit", json!(10));
    set_val(spec, "progressDeadlineSeconds", json!(600));
    default_template(spec);
}

/// Upstream's SetDefaults_ReplicationController: an empty selector, or empty labels,
/// default to the template's labels.
fn default_replication_controller(o: &mut Map<String, Value>) {
    let template_labels = o
        .get("spec")
        .and_then(|s| s.pointer("/template/metadata/labels"))
        .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
        .cloned();
    if let Some(l) = &template_labels {
        let spec = obj_mut(o, "spec");
        if spec
            .get("selector")
            .and_then(Value::as_object)
            .is_none_or(|m| m.is_empty())
        {
            spec.insert("selector".into(), l.clone());
        }
        let meta = obj_mut(o, "metadata");
        if meta
            .get("labels")
            .and_then(Value::as_object)
            .is_none_or(|m| m.is_empty())
        {
            meta.insert("labels".into(), l.clone());
        }
    }
    let spec = obj_mut(o, "spec");
    set_val(spec, "replicas", json!(1));
    default_template(spec);
}

fn default_daemonset(o: &mut Map<String, Value>) {
    let spec = obj_mut(o, "spec");
    let strategy = obj_mut(spec, "updateStrategy");
    set_str(strategy, "type", "RollingUpdate");
    if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
        let ru = obj_mut(strategy, "rollingUpdate");
        set_val(ru, "maxUnavailable", json!(1));
        set_val(ru, "maxSurge", json!(0));
    }
    set_val(spec, "revisionHistoryLimit", json!(10));
    default_template(spec);
}

/// `SetDefaults_Job`; `manualSelector` and the generated selector are the registry
/// strategy's (`generate_job_selector`), applied on create only.
fn default_job(o: &mut Map<String, Value>) {
    let template_labels = o
        .get("spec")
        .and_then(|s| s.pointer("/template/metadata/labels"))
        .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
        .cloned();
    let spec = obj_mut(o, "spec");
    if is_unset(spec.get("completions")) && is_unset(spec.get("parallelism")) {
        set_val(spec, "completions", json!(1));
    }
    set_val(spec, "parallelism", json!(1));
    if is_unset(spec.get("backoffLimit")) {
        let limit = if is_unset(spec.get("backoffLimitPerIndex")) {
            6
        } else {
            i32::MAX as i64
        };
        set_val(spec, "backoffLimit", json!(limit));
    }
    set_str(spec, "completionMode", "NonIndexed");
    set_val(spec, "suspend", json!(false));
    let has_failure_policy = !is_unset(spec.get("podFailurePolicy"));
    if let Some(rules) = spec
        .get_mut("podFailurePolicy")
        .and_then(|p| p.get_mut("rules"))
        .and_then(Value::as_array_mut)
    {
        for rule in rules {
            if let Some(pats) = rule
                .get_mut("onPodConditions")
                .and_then(Value::as_array_mut)
            {
                for pat in pats {
                    if let Value::Object(p) = pat {
                        set_str(p, "status", "True");
                    }
                }
            }
        }
    }
    set_str(
        spec,
        "podReplacementPolicy",
        if has_failure_policy {
            "Failed"
        } else {
            "TerminatingOrFailed"
        },
    );
    default_template(spec);
    if let Some(labels) = template_labels {
        let meta = obj_mut(o, "metadata");
        if meta
            .get("labels")
            .and_then(Value::as_object)
            .is_none_or(|m| m.is_empty())
        {
            meta.insert("labels".into(), labels);
        }
    }
}

/// The Job registry strategy's `generateSelector` (on create, unless `manualSelector`):
/// the pods of a Job are selected by its uid, and its template carries the uid and name
/// labels (the legacy unprefixed ones too).
pub fn generate_job_selector(job: &mut Value) {
    let Value::Object(o) = job else { return };
    let uid = o
        .get("metadata")
        .and_then(|m| m.get("uid"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let name = o
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let spec = obj_mut(o, "spec");
    if spec.get("manualSelector").and_then(Value::as_bool) == Some(true) {
        return;
    }
    spec.insert("manualSelector".into(), json!(false));
    let labels = obj_mut(obj_mut(obj_mut(spec, "template"), "metadata"), "labels");
    for (k, v) in [
        ("controller-uid", &uid),
        ("batch.kubernetes.io/controller-uid", &uid),
        ("job-name", &name),
        ("batch.kubernetes.io/job-name", &name),
    ] {
        labels.entry(k).or_insert_with(|| json!(v));
    }
    if is_unset(spec.get("selector")) {
        spec.insert(
            "selector".into(),
            json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}),
        );
    }
}

/// `SetDefaults_CronJob`; the job template's pod template gets pod-spec defaults.
fn default_cronjob(o: &mut Map<String, Value>) {
    let spec = obj_mut(o, "spec");
    set_str(spec, "concurrencyPolicy", "Allow");
    set_val(spec, "suspend", json!(false));
    set_val(spec, "successfulJobsHistoryLimit", json!(3));
    set_val(spec, "failedJobsHistoryLimit", json!(1));
    let job_spec = obj_mut(obj_mut(spec, "jobTemplate"), "spec");
    default_template(job_spec);
}

/// Upstream's rbac/v1 defaults: the roleRef's group, and each subject's group by its kind
/// (ServiceAccounts are in the core group, Users and Groups in RBAC's).
fn default_role_binding(o: &mut Map<String, Value>) {
    set_str(obj_mut(o, "roleRef"), "apiGroup", RBAC_GROUP);
    for subject in arr_mut(o, "subjects") {
        if let Value::Object(s) = subject {
            let group = match s.get("kind").and_then(Value::as_str) {
                Some("User" | "Group") => RBAC_GROUP,
                _ => continue,
            };
            set_str(s, "apiGroup", group);
        }
    }
}

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Upstream's SetDefaults_StatefulSet (apps/v1), claim templates defaulted as PVCs are.
fn default_statefulset(o: &mut Map<String, Value>) {
    let spec = obj_mut(o, "spec");
    set_val(spec, "replicas", json!(1));
    set_str(spec, "podManagementPolicy", "OrderedReady");
    let strategy = obj_mut(spec, "updateStrategy");
    set_str(strategy, "type", "RollingUpdate");
    if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
        let ru = obj_mut(strategy, "rollingUpdate");
        set_val(ru, "partition", json!(0));
    }
    set_val(spec, "revisionHistoryLimit", json!(10));
    let retention = obj_mut(spec, "persistentVolumeClaimRetentionPolicy");
    set_str(retention, "whenDeleted", "Retain");
    set_str(retention, "whenScaled", "Retain");
    for claim in arr_mut(spec, "volumeClaimTemplates") {
        if let Value::Object(c) = claim {
            set_str(c, "apiVersion", "v1");
            set_str(c, "kind", "PersistentVolumeClaim");
            let cs = obj_mut(c, "spec");
            set_str(cs, "volumeMode", "Filesystem");
            set_val(obj_mut(c, "status"), "phase", json!("Pending"));
        }
    }
    default_template(spec);
}

fn default_service(o: &mut Map<String, Value>) {
    let spec = obj_mut(o, "spec");
    set_str(spec, "sessionAffinity", "None");
    match spec.get("sessionAffinity").and_then(Value::as_str) {
        Some("None") => {
            spec.remove("sessionAffinityConfig");
        }
        Some("ClientIP") => {
            let has_timeout = spec
                .get("sessionAffinityConfig")
                .and_then(|c| c.pointer("/clientIP/timeoutSeconds"))
                .is_some_and(|t| !t.is_null());
            if !has_timeout {
                spec.insert(
                    "sessionAffinityConfig".into(),
                    json!({"clientIP": {"timeoutSeconds": 10800}}),
                );
            }
        }
        _ => {}
    }
    set_str(spec, "type", "ClusterIP");
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    for p in arr_mut(spec, "ports") {
        let Value::Object(p) = p else { continue };
        set_str(p, "protocol", "TCP");
        let target_unset = match p.get("targetPort") {
            None | Some(Value::Null) => true,
            Some(Value::Number(n)) => n.as_i64() == Some(0),
            Some(Value::String(s)) => s.is_empty(),
            _ => false,
        };
        if target_unset && let Some(port) = p.get("port").cloned() {
            p.insert("targetPort".into(), port);
        }
    }
    let has_external_ips = spec
        .get("externalIPs")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let externally_accessible =
        ty == "LoadBalancer" || ty == "NodePort" || (ty == "ClusterIP" && has_external_ips);
    if externally_accessible {
        set_str(spec, "externalTrafficPolicy", "Cluster");
    }
    if matches!(ty.as_str(), "NodePort" | "LoadBalancer" | "ClusterIP") {
        set_val(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if ty == "LoadBalancer" {
        set_val(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
    // Upstream's service registry picks the IP family policy on create; single-stack here.
    if ty != "ExternalName" {
        set_val(spec, "ipFamilyPolicy", json!("SingleStack"));
    }
    if ty == "LoadBalancer"
        && let Some(Value::Array(ingress)) = o
            .get_mut("status")
            .and_then(|s| s.get_mut("loadBalancer"))
            .and_then(|l| l.get_mut("ingress"))
    {
        for ing in ingress.iter_mut() {
            let has_ip = ing
                .get("ip")
                .and_then(Value::as_str)
                .is_some_and(|ip| !ip.is_empty());
            if let (true, Value::Object(m)) = (has_ip, ing) {
                set_val(m, "ipMode", json!("VIP"));
            }
        }
    }
}

fn default_namespace(o: &mut Map<String, Value>) {
    let name = o
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !name.is_empty() {
        let labels = obj_mut(obj_mut(o, "metadata"), "labels");
        labels.insert("kubernetes.io/metadata.name".into(), json!(name));
    }
    // Set by upstream's namespace strategy on create.
    set_val(obj_mut(o, "spec"), "finalizers", json!(["kubernetes"]));
    set_str(obj_mut(o, "status"), "phase", "Active");
}

fn default_node(o: &mut Map<String, Value>) {
    let Some(Value::Object(status)) = o.get_mut("status") else {
        return;
    };
    canonical_resource_list(status.get_mut("capacity"));
    canonical_resource_list(status.get_mut("allocatable"));
    if matches!(status.get("allocatable"), None | Some(Value::Null))
        && let Some(cap) = status.get("capacity").cloned()
        && !cap.is_null()
    {
        status.insert("allocatable".into(), cap);
    }
}

/// Upstream's CRD defaults: singular is the lowercased kind, listKind is `<kind>List`, the
/// conversion strategy is `None`.
fn default_crd(o: &mut Map<String, Value>) {
    let Some(Value::Object(spec)) = o.get_mut("spec") else {
        return;
    };
    if let Some(Value::Object(names)) = spec.get_mut("names") {
        let kind = names
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if !kind.is_empty() {
            set_str(names, "singular", &kind.to_lowercase());
            set_str(names, "listKind", &format!("{kind}List"));
        }
    }
    let conv = spec
        .entry("conversion")
        .or_insert_with(|| json!({"strategy": "None"}));
    if let Value::Object(c) = conv {
        set_str(c, "strategy", "None");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaulted(kind: &str, group: &str, mut v: Value) -> Value {
        default_object(&Gvk::new(group, "v1", kind), &mut v);
        v
    }

    #[test]
    fn pod_defaults_match_upstream() {
        let pod = defaulted(
            "Pod",
            "",
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{
            "name": "c", "image": "nginx",
            "ports": [{"containerPort": 80}],
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}},
            "livenessProbe": {"httpGet": {"port": 80}},
            "env": [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
        }], "volumes": [{"name": "v"}, {"name": "s", "secret": {"secretName": "x"}}, {"name": "h", "hostPath": {"path": "/x"}}]}}),
        );
        let spec = &pod["spec"];
        assert_eq!(spec["restartPolicy"], "Always");
        assert_eq!(spec["dnsPolicy"], "ClusterFirst");
        assert_eq!(spec["schedulerName"], "default-scheduler");
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(spec["securityContext"], json!({}));
        assert_eq!(spec["enableServiceLinks"], true);
        let c = &spec["containers"][0];
        assert_eq!(c["imagePullPolicy"], "Always");
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(
            c["resources"]["requests"],
            json!({"cpu": "500m", "memory": "1Gi"})
        );
        // No resize policy defaulting: upstream dropped it when the feature went beta.
        assert!(c.get("resizePolicy").is_none());
        assert_eq!(
            c["livenessProbe"],
            json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1,
                   "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
        );
        assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"], "v1");
        assert_eq!(spec["volumes"][0]["emptyDir"], json!({}));
        assert_eq!(spec["volumes"][1]["secret"]["defaultMode"], 420);
        assert_eq!(spec["volumes"][2]["hostPath"]["type"], "");
    }

    #[test]
    fn quantities_are_rounded_to_milli_and_canonical() {
        let pod = defaulted(
            "Pod",
            "",
            json!({"spec": {"containers": [{"name": "c", "image": "x:1",
            "resources": {"limits": {"cpu": "0.5", "memory": "1024Mi"}, "requests": {"cpu": "1.5m", "memory": "1e3"}}}]}}),
        );
        let r = &pod["spec"]["containers"][0]["resources"];
        assert_eq!(r["limits"], json!({"cpu": "500m", "memory": "1Gi"}));
        assert_eq!(r["requests"], json!({"cpu": "2m", "memory": "1e3"}));
        let numeric = defaulted(
            "Pod",
            "",
            json!({"spec": {"containers": [{"name": "c", "image": "x:1",
            "resources": {"limits": {"cpu": 1, "memory": 134217728}}}]}}),
        );
        assert_eq!(
            numeric["spec"]["containers"][0]["resources"]["limits"],
            json!({"cpu": "1", "memory": "134217728"})
        );
        let node = defaulted(
            "Node",
            "",
            json!({"status": {"capacity": {"cpu": "4", "memory": "8048312Ki", "pods": "110"}}}),
        );
        assert_eq!(
            node["status"]["allocatable"],
            json!({"cpu": "4", "memory": "8048312Ki", "pods": "110"})
        );
        let svc = defaulted(
            "Service",
            "",
            json!({"spec": {"sessionAffinity": "ClientIP", "ports": [{"port": 80}]}}),
        );
        assert_eq!(
            svc["spec"]["sessionAffinityConfig"],
            json!({"clientIP": {"timeoutSeconds": 10800}})
        );
    }

    #[test]
    fn image_pull_policy_from_tag() {
        assert_eq!(image_tag("nginx"), "latest");
        assert_eq!(image_tag("nginx:latest"), "latest");
        assert_eq!(image_tag("nginx:1.25"), "1.25");
        assert_eq!(image_tag("localhost:5000/nginx"), "latest");
        assert_eq!(image_tag("localhost:5000/nginx:v1"), "v1");
        assert_eq!(image_tag("nginx@sha256:abcd"), "");
        let pod = defaulted(
            "Pod",
            "",
            json!({"spec": {"containers": [
            {"name": "a", "image": "busybox:1.36"}, {"name": "b", "image": "busybox@sha256:ab"},
            {"name": "c", "image": "busybox", "imagePullPolicy": "Never"}]}}),
        );
        let policies: Vec<&str> = (0..3)
            .filter_map(|i| pod["spec"]["containers"][i]["imagePullPolicy"].as_str())
            .collect();
        assert_eq!(policies, vec!["IfNotPresent", "IfNotPresent", "Never"]);
    }

    #[test]
    fn templates_do_not_get_pod_only_defaults() {
        let d = defaulted(
            "Deployment",
            "apps",
            json!({"spec": {"template": {"spec": {"containers": [
            {"name": "c", "image": "nginx:1", "resources": {"limits": {"cpu": "1"}}}]}}}}),
        );
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(
            d["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        );
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(d["spec"]["progressDeadlineSeconds"], 600);
        let t = &d["spec"]["template"]["spec"];
        assert_eq!(t["restartPolicy"], "Always");
        assert!(t.get("enableServiceLinks").is_none());
        assert!(t["containers"][0]["resources"].get("requests").is_none());
        let recreate = defaulted(
            "Deployment",
            "apps",
            json!({"spec": {"strategy": {"type": "Recreate"}}}),
        );
        assert_eq!(recreate["spec"]["strategy"], json!({"type": "Recreate"}));
        let ds = defaulted("DaemonSet", "apps", json!({"spec": {}}));
        assert_eq!(
            ds["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
        );
    }

    #[test]
    fn storage_defaults_match_upstream() {
        let pv = defaulted(
            "PersistentVolume",
            "",
            json!({"spec": {"capacity": {"storage": "1024Mi"}, "hostPath": {"path": "/x"}}}),
        );
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(pv["spec"]["volumeMode"], "Filesystem");
        assert_eq!(pv["spec"]["hostPath"]["type"], "");
        assert_eq!(pv["spec"]["capacity"]["storage"], "1Gi");
        assert_eq!(pv["status"]["phase"], "Pending");
        let pvc = defaulted(
            "PersistentVolumeClaim",
            "",
            json!({"spec": {"resources": {"requests": {"storage": "1G"}}}}),
        );
        assert_eq!(pvc["spec"]["volumeMode"], "Filesystem");
        assert_eq!(pvc["status"]["phase"], "Pending");
        let sc = defaulted(
            "StorageClass",
            "storage.k8s.io",
            json!({"provisioner": "x", "reclaimPolicy": "Retain"}),
        );
        assert_eq!(sc["reclaimPolicy"], "Retain");
        assert_eq!(sc["volumeBindingMode"], "Immediate");
    }

    #[test]
    fn service_namespace_secret_defaults() {
        let s = defaulted(
            "Service",
            "",
            json!({"spec": {"ports": [{"port": 80}, {"port": 53, "protocol": "UDP", "targetPort": "dns"}]}}),
        );
        assert_eq!(s["spec"]["type"], "ClusterIP");
        assert_eq!(s["spec"]["sessionAffinity"], "None");
        assert_eq!(
            s["spec"]["ports"][0],
            json!({"port": 80, "protocol": "TCP", "targetPort": 80})
        );
        assert_eq!(s["spec"]["ports"][1]["targetPort"], "dns");
        assert_eq!(s["spec"]["internalTrafficPolicy"], "Cluster");
        assert!(s["spec"].get("externalTrafficPolicy").is_none());
        let np = defaulted("Service", "", json!({"spec": {"type": "NodePort"}}));
        assert_eq!(np["spec"]["externalTrafficPolicy"], "Cluster");
        let ns = defaulted("Namespace", "", json!({"metadata": {"name": "dev"}}));
        assert_eq!(
            ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "dev"
        );
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(ns["status"]["phase"], "Active");
        assert_eq!(defaulted("Secret", "", json!({}))["type"], "Opaque");
        assert_eq!(
            defaulted("Secret", "", json!({"type": "kubernetes.io/tls"}))["type"],
            "kubernetes.io/tls"
        );
    }

    #[test]
    fn default_toleration_seconds_admission() {
        let mut pod = json!({"spec": {"containers": []}});
        default_tolerations(&mut pod);
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}])
        );
        let mut tolerant = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        default_tolerations(&mut tolerant);
        assert_eq!(
            tolerant["spec"]["tolerations"],
            json!([{"operator": "Exists"}])
        );
    }

    #[test]
    fn job_and_cronjob_defaults() {
        let mut job = json!({"metadata": {"name": "pi", "uid": "u1"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "perl"}]}}}});
        generate_job_selector(&mut job);
        default_object(&Gvk::new("batch", "v1", "Job"), &mut job);
        let spec = &job["spec"];
        assert_eq!(spec["completions"], json!(1));
        assert_eq!(spec["parallelism"], json!(1));
        assert_eq!(spec["backoffLimit"], json!(6));
        assert_eq!(spec["completionMode"], json!("NonIndexed"));
        assert_eq!(spec["suspend"], json!(false));
        assert_eq!(spec["manualSelector"], json!(false));
        assert_eq!(spec["podReplacementPolicy"], json!("TerminatingOrFailed"));
        assert_eq!(
            spec["selector"],
            json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "u1"}})
        );
        let labels = json!({"batch.kubernetes.io/controller-uid": "u1", "batch.kubernetes.io/job-name": "pi",
            "controller-uid": "u1", "job-name": "pi"});
        assert_eq!(spec["template"]["metadata"]["labels"], labels);
        assert_eq!(job["metadata"]["labels"], labels);
        assert_eq!(
            spec["template"]["spec"]["terminationGracePeriodSeconds"],
            json!(30)
        );

        // Parallelism alone leaves completions unset (a work queue).
        let q = defaulted("Job", "batch", json!({"spec": {"parallelism": 3}}));
        assert_eq!(q["spec"].get("completions"), None);

        let cj = defaulted(
            "CronJob",
            "batch",
            json!({"spec": {"schedule": "* * * * *"}}),
        );
        assert_eq!(cj["spec"]["concurrencyPolicy"], json!("Allow"));
        assert_eq!(cj["spec"]["suspend"], json!(false));
        assert_eq!(cj["spec"]["successfulJobsHistoryLimit"], json!(3));
        assert_eq!(cj["spec"]["failedJobsHistoryLimit"], json!(1));
    }

    #[test]
    fn typed_pod_defaults() {
        let mut pod: Pod = serde_json::from_value(json!({"metadata": {"name": "s"}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}))
            .unwrap_or_default();
        default_pod(&mut pod);
        let spec = pod.spec.unwrap_or_default();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            spec.containers
                .first()
                .and_then(|c| c.image_pull_policy.as_deref()),
            Some("IfNotPresent")
        );
    }
}
