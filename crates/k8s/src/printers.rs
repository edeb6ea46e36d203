//! Server-side `meta.k8s.io/v1` Table output for `kubectl get`, with the columns, priorities
//! and cell texts of upstream's `pkg/printers/internalversion`.
//!
//! The server always produces every column (as upstream does with `Wide: true`); kubectl
//! hides priority-1 columns unless `-o wide`. Each row's `object` is the object's
//! PartialObjectMetadata (upstream's default `includeObject=Metadata`).

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::gvk::Gvk;

const NAME_DOC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DOC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

fn col(name: &str, ty: &str, priority: u8, description: &str) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority})
}

fn name_col() -> Value {
    col("Name", "string", 0, NAME_DOC)
}

fn age_col() -> Value {
    col("Age", "string", 0, AGE_DOC)
}

/// A Table of the objects with upstream's columns for the kind; kinds without a printer get
/// NAME and AGE (as custom resources do).
pub fn table(gvk: &Gvk, objects: &[Value], now: Timestamp) -> Value {
    let columns = columns(gvk);
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let (cells, conditions) = cells(gvk, o, now);
            let mut row = Map::new();
            row.insert("cells".into(), Value::Array(cells));
            if let Some(c) = conditions {
                row.insert("conditions".into(), c);
            }
            row.insert("object".into(), partial_metadata(o));
            Value::Object(row)
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// The object's metadata as a `meta.k8s.io/v1` PartialObjectMetadata.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// Column definitions for a kind.
pub fn columns(gvk: &Gvk) -> Vec<Value> {
    let s = |n: &str, d: &str| col(n, "string", 0, d);
    let w = |n: &str, d: &str| col(n, "string", 1, d);
    let i = |n: &str, d: &str| col(n, "integer", 0, d);
    match (gvk.group.as_str(), gvk.kind.as_str()) {
        ("", "Pod") => vec![
            name_col(),
            s(
                "Ready",
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            s(
                "Status",
                "The aggregate status of the containers in this pod.",
            ),
            s(
                "Restarts",
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
            ),
            age_col(),
            w(
                "IP",
                "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
            ),
            w(
                "Node",
                "NodeName indicates in which node this pod is scheduled.",
            ),
            w(
                "Nominated Node",
                "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods.",
            ),
            w(
                "Readiness Gates",
                "If specified, all readiness gates will be evaluated for pod readiness.",
            ),
        ],
        ("", "Node") => vec![
            name_col(),
            s("Status", "The status of the node"),
            s("Roles", "The roles of the node"),
            age_col(),
            s("Version", "Kubelet Version reported by the node."),
            w("Internal-IP", "List of addresses reachable to the node."),
            w("External-IP", "List of addresses reachable to the node."),
            w(
                "OS-Image",
                "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
            ),
            w(
                "Kernel-Version",
                "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
            ),
            w(
                "Container-Runtime",
                "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
            ),
        ],
        ("", "Namespace") => vec![
            name_col(),
            s("Status", "The status of the namespace"),
            age_col(),
        ],
        ("", "Service") => vec![
            name_col(),
            s("Type", "type determines how the Service is exposed."),
            s(
                "Cluster-IP",
                "clusterIP is the IP address of the service and is usually assigned randomly.",
            ),
            s(
                "External-IP",
                "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.",
            ),
            s(
                "Port(s)",
                "The list of ports that are exposed by this service.",
            ),
            age_col(),
            w(
                "Selector",
                "Route service traffic to pods with label keys and values matching this selector.",
            ),
        ],
        ("", "Endpoints") => vec![
            name_col(),
            s(
                "Endpoints",
                "Endpoints is the list of endpoints in the service.",
            ),
            age_col(),
        ],
        ("", "ConfigMap") => vec![
            name_col(),
            s("Data", "Data contains the configuration data."),
            age_col(),
        ],
        ("", "Secret") => vec![
            name_col(),
            s("Type", "The type of the secret"),
            s("Data", "Data contains the secret data."),
            age_col(),
        ],
        ("", "ServiceAccount") => vec![
            name_col(),
            s(
                "Secrets",
                "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use.",
            ),
            age_col(),
        ],
        ("", "Event") | ("events.k8s.io", "Event") => vec![
            s(
                "Last Seen",
                "The time at which the most recent occurrence of this event was recorded.",
            ),
            s(
                "Type",
                "Type of this event (Normal, Warning), new types could be added in the future",
            ),
            s(
                "Reason",
                "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
            ),
            s("Object", "The object that this event is about."),
            w(
                "Subobject",
                "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement.",
            ),
            w(
                "Source",
                "The component reporting this event. Should be a short machine understandable string.",
            ),
            s(
                "Message",
                "A human-readable description of the status of this operation.",
            ),
            w(
                "First Seen",
                "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
            ),
            w("Count", "The number of times this event has occurred."),
            col("Name", "string", 1, NAME_DOC),
        ],
        ("certificates.k8s.io", "CertificateSigningRequest") => vec![
            name_col(),
            age_col(),
            s(
                "SignerName",
                "signerName indicates the requested signer, and is a qualified name.",
            ),
            s(
                "Requestor",
                "request contains an x509 certificate signing request encoded in a \"CERTIFICATE REQUEST\" PEM block. When serialized as JSON or YAML, the data is additionally base64-encoded.",
            ),
            s(
                "RequestedDuration",
                "expirationSeconds is the requested duration of validity of the issued certificate. The certificate signer may issue a certificate with a different validity duration so a client must check the delta between the notBefore and and notAfter fields in the issued certificate to determine the actual duration.",
            ),
            s(
                "Condition",
                "conditions applied to the request. Known conditions are \"Approved\", \"Denied\", and \"Failed\".",
            ),
        ],
        ("coordination.k8s.io", "Lease") => vec![
            name_col(),
            s(
                "Holder",
                "holderIdentity contains the identity of the holder of a current lease.",
            ),
            age_col(),
        ],
        ("discovery.k8s.io", "EndpointSlice") => vec![
            name_col(),
            s(
                "AddressType",
                "addressType specifies the type of address carried by this EndpointSlice.",
            ),
            s(
                "Ports",
                "ports specifies the list of network ports exposed by each endpoint in this slice.",
            ),
            s(
                "Endpoints",
                "endpoints is a list of unique endpoints in this slice.",
            ),
            age_col(),
        ],
        ("node.k8s.io", "RuntimeClass") => vec![
            name_col(),
            s(
                "Handler",
                "handler specifies the underlying runtime and configuration that the CRI implementation will use to handle pods of this class.",
            ),
            age_col(),
        ],
        ("scheduling.k8s.io", "PriorityClass") => vec![
            name_col(),
            i(
                "Value",
                "value represents the integer value of this priority class.",
            ),
            col(
                "Global-Default",
                "boolean",
                0,
                "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class.",
            ),
            age_col(),
            s(
                "PreemptionPolicy",
                "preemptionPolicy is the Policy for preempting pods with lower priority.",
            ),
        ],
        ("policy", "PodDisruptionBudget") => vec![
            name_col(),
            s(
                "Min Available",
                "The minimum number of pods that must be available.",
            ),
            s(
                "Max Unavailable",
                "The maximum number of pods that may be unavailable.",
            ),
            i(
                "Allowed Disruptions",
                "Calculated number of pods that may be disrupted at this time.",
            ),
            age_col(),
        ],
        ("apps", "Deployment") => vec![
            name_col(),
            s("Ready", "Number of the pod with ready state"),
            s(
                "Up-to-date",
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
            ),
            s(
                "Available",
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
            ),
            age_col(),
            w("Containers", "Names of each container in the template."),
            w(
                "Images",
                "Images referenced by each container in the template.",
            ),
            w(
                "Selector",
                "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
            ),
        ],
        ("apps", "ReplicaSet") | ("", "ReplicationController") => vec![
            name_col(),
            i("Desired", "Replicas is the number of desired replicas."),
            i(
                "Current",
                "Replicas is the most recently observed number of replicas.",
            ),
            i(
                "Ready",
                "The number of ready replicas for this replica set.",
            ),
            age_col(),
            w("Containers", "Names of each container in the template."),
            w(
                "Images",
                "Images referenced by each container in the template.",
            ),
            w(
                "Selector",
                "Selector is a label query over pods that should match the replica count.",
            ),
        ],
        ("apps", "ControllerRevision") => vec![
            name_col(),
            s("Controller", "Controller of the object"),
            s(
                "Revision",
                "Revision indicates the revision of the state represented by Data.",
            ),
            age_col(),
        ],
        ("apps", "StatefulSet") => vec![
            name_col(),
            s("Ready", "Number of the pod with ready state"),
            age_col(),
            w("Containers", "Names of each container in the template."),
            w(
                "Images",
                "Images referenced by each container in the template.",
            ),
        ],
        ("apps", "DaemonSet") => vec![
            name_col(),
            i(
                "Desired",
                "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod).",
            ),
            i(
                "Current",
                "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.",
            ),
            i(
                "Ready",
                "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition.",
            ),
            i(
                "Up-to-date",
                "The total number of nodes that are running updated daemon pod",
            ),
            i(
                "Available",
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
            ),
            s(
                "Node Selector",
                "NodeSelector is a selector which must be true for the pod to fit on a node.",
            ),
            age_col(),
            w("Containers", "Names of each container in the template."),
            w(
                "Images",
                "Images referenced by each container in the template.",
            ),
            w(
                "Selector",
                "A label query over pods that are managed by the daemon set.",
            ),
        ],
        ("batch", "Job") => vec![
            name_col(),
            s("Status", "Status of the job."),
            s(
                "Completions",
                "The number of pods which reached phase Succeeded. The value increases monotonically for a given spec. However, it may decrease in reaction to scale down of elastic indexed jobs.",
            ),
            s("Duration", "Time required to complete the job."),
            age_col(),
            w("Containers", "Names of each container in the template."),
            w(
                "Images",
                "Images referenced by each container in the template.",
            ),
            w("Selector", JOB_SELECTOR_DOC),
        ],
        ("batch", "CronJob") => vec![
            name_col(),
            s(
                "Schedule",
                "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
            ),
            s(
                "Timezone",
                "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process. The set of valid time zone names and the time zone offset is loaded from the system-wide time zone database by the API server during CronJob validation and the controller manager during execution. If no system-wide time zone database can be found a bundled version of the database is used instead. If the time zone name becomes invalid during the lifetime of a CronJob or due to a change in host configuration, the controller will stop creating new new Jobs and will create a system event with the reason UnknownTimeZone. More information can be found in https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones",
            ),
            col(
                "Suspend",
                "boolean",
                0,
                "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false.",
            ),
            i("Active", "A list of pointers to currently running jobs."),
            s(
                "Last Schedule",
                "Information when was the last time the job was successfully scheduled.",
            ),
            age_col(),
            w("Containers", "Names of each container in the template."),
            w(
                "Images",
                "Images referenced by each container in the template.",
            ),
            w("Selector", JOB_SELECTOR_DOC),
        ],
        ("", "PersistentVolume") => vec![
            name_col(),
            s(
                "Capacity",
                "capacity is the description of the persistent volume's resources and capacity.",
            ),
            s(
                "Access Modes",
                "accessModes contains all ways the volume can be mounted.",
            ),
            s(
                "Reclaim Policy",
                "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim.",
            ),
            s(
                "Status",
                "phase indicates if a volume is available, bound to a claim, or released by a claim.",
            ),
            s(
                "Claim",
                "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim.",
            ),
            s(
                "StorageClass",
                "storageClassName is the name of StorageClass to which this persistent volume belongs.",
            ),
            s(
                "VolumeAttributesClass",
                "volumeAttributesClassName is the name of VolumeAttributesClass to which this persistent volume belongs.",
            ),
            s(
                "Reason",
                "reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy display in the CLI.",
            ),
            age_col(),
            w(
                "VolumeMode",
                "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state.",
            ),
        ],
        ("", "PersistentVolumeClaim") => vec![
            name_col(),
            s(
                "Status",
                "phase represents the current phase of PersistentVolumeClaim.",
            ),
            s(
                "Volume",
                "volumeName is the binding reference to the PersistentVolume backing this claim.",
            ),
            s(
                "Capacity",
                "capacity represents the actual resources of the underlying volume.",
            ),
            s(
                "Access Modes",
                "accessModes contains the actual access modes the volume backing the PVC has.",
            ),
            s(
                "StorageClass",
                "storageClassName is the name of the StorageClass required by the claim.",
            ),
            s(
                "VolumeAttributesClass",
                "volumeAttributesClassName may be used to set the VolumeAttributesClass used by this claim.",
            ),
            age_col(),
            w(
                "VolumeMode",
                "volumeMode defines what type of volume is required by the claim.",
            ),
        ],
        ("rbac.authorization.k8s.io", "Role" | "ClusterRole") => {
            vec![name_col(), col("Created At", "date", 0, AGE_DOC)]
        }
        ("rbac.authorization.k8s.io", kind @ ("RoleBinding" | "ClusterRoleBinding")) => {
            let (what, role_doc) = if kind == "RoleBinding" {
                (
                    "roleBinding",
                    "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable.",
                )
            } else {
                (
                    "clusterrolebinding",
                    "RoleRef can only reference a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable.",
                )
            };
            vec![
                name_col(),
                s("Role", role_doc),
                age_col(),
                w("Users", &format!("Users in the {what}")),
                w("Groups", &format!("Groups in the {what}")),
                w("ServiceAccounts", &format!("ServiceAccounts in the {what}")),
            ]
        }
        ("storage.k8s.io", "StorageClass") => vec![
            name_col(),
            s(
                "Provisioner",
                "provisioner indicates the type of the provisioner.",
            ),
            s(
                "ReclaimPolicy",
                "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class.",
            ),
            s(
                "VolumeBindingMode",
                "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.",
            ),
            s(
                "AllowVolumeExpansion",
                "allowVolumeExpansion shows whether the storage class allow volume expand.",
            ),
            age_col(),
        ],
        ("networking.k8s.io", "Ingress") => vec![
            name_col(),
            s("Class", "The name of the IngressClass resource."),
            s(
                "Hosts",
                "Hosts that incoming requests are matched against before the ingress rule",
            ),
            s(
                "Address",
                "Address is a list containing ingress points for the load-balancer",
            ),
            s("Ports", "Ports of TLS configurations that open"),
            age_col(),
        ],
        ("networking.k8s.io", "IngressClass") => vec![
            name_col(),
            s(
                "Controller",
                "Controller that is responsible for handling this class",
            ),
            s(
                "Parameters",
                "A reference to a resource with additional parameters",
            ),
            age_col(),
        ],
        ("networking.k8s.io", "NetworkPolicy") => vec![
            name_col(),
            s(
                "Pod-Selector",
                "podSelector selects the pods to which this NetworkPolicy object applies. The array of rules is applied to any pods selected by this field. An empty selector matches all pods in the policy's namespace. Multiple network policies can select the same set of pods. In this case, the ingress rules for each are combined additively. This field is optional. If it is not specified, it defaults to an empty selector.",
            ),
            age_col(),
        ],
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => vec![
            name_col(),
            s(
                "PriorityLevel",
                "name is the name of the priority level configuration being referenced Required.",
            ),
            s(
                "MatchingPrecedence",
                "matchingPrecedence is used to choose among the FlowSchemas that match a given request. The chosen FlowSchema is among those with the numerically lowest (which we take to be logically highest) MatchingPrecedence.  Each MatchingPrecedence value must be ranged in [1,10000]. Note that if the precedence is not specified, it will be set to 1000 as default.",
            ),
            s(
                "DistinguisherMethod",
                "`type` is the type of flow distinguisher method The supported types are \"ByUser\" and \"ByNamespace\". Required.",
            ),
            age_col(),
            s(
                "MissingPL",
                "indicates whether the referenced PriorityLevelConfiguration object does not exist",
            ),
        ],
        ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration") => vec![
            name_col(),
            s(
                "Type",
                "`type` indicates whether this priority level is subject to limitation on request execution.  A value of `\"Exempt\"` means that requests of this priority level are not subject to a limit (and thus are never queued) and do not detract from the capacity made available to other priority levels.  A value of `\"Limited\"` means that (a) requests of this priority level _are_ subject to limits and (b) some of the server's limited capacity is made available exclusively to this priority level. Required.",
            ),
            s(
                "NominalConcurrencyShares",
                "nominalConcurrencyShares (NCS) contributes to the computation of the NominalConcurrencyLimit (NominalCL) of this level.",
            ),
            s(
                "Queues",
                "`queues` is the number of queues for this priority level. The queues exist independently at each apiserver. The value must be positive.  Setting it to 1 effectively precludes shufflesharding and thus makes the distinguisher method of associated flow schemas irrelevant.  This field has a default value of 64.",
            ),
            s(
                "HandSize",
                "`handSize` is a small positive number that configures the shuffle sharding of requests into queues.",
            ),
            s(
                "QueueLengthLimit",
                "`queueLengthLimit` is the maximum number of requests allowed to be waiting in a given queue of this priority level at a time; excess requests are rejected.  This value must be positive.  If not specified, it will be defaulted to 50.",
            ),
            age_col(),
        ],
        ("apiregistration.k8s.io", "APIService") => vec![
            name_col(),
            s(
                "Service",
                "The reference to the service that hosts this API endpoint.",
            ),
            s("Available", "Whether this service is available."),
            age_col(),
        ],
        _ => vec![name_col(), age_col()],
    }
}

const JOB_SELECTOR_DOC: &str = "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors";

fn has_condition(o: &Value, ty: &str) -> bool {
    arr(o, "/status/conditions")
        .iter()
        .any(|c| s_at(c, "/type") == ty && s_at(c, "/status") == "True")
}

/// upstream's `printJob`.
fn job_cells(o: &Value, now: Timestamp) -> Vec<Value> {
    let succeeded = i_at(o, "/status/succeeded");
    let completions = match o.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        None => match i_at(o, "/spec/parallelism") {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let start = parse_time(s_at(o, "/status/startTime"));
    let end = parse_time(s_at(o, "/status/completionTime"));
    let duration = match (start, end) {
        (None, _) => String::new(),
        (Some(s), None) => human_duration(now.duration_since(s).as_secs()),
        (Some(s), Some(e)) => human_duration(e.duration_since(s).as_secs()),
    };
    let status = if has_condition(o, "Complete") {
        "Complete"
    } else if has_condition(o, "Failed") {
        "Failed"
    } else if o.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else if has_condition(o, "Suspended") {
        "Suspended"
    } else if has_condition(o, "FailureTarget") {
        "FailureTarget"
    } else if has_condition(o, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    };
    let (containers, images) = container_cells(o);
    vec![
        json!(s_at(o, "/metadata/name")),
        json!(status),
        json!(completions),
        json!(duration),
        json!(age(o, now)),
        json!(containers),
        json!(images),
        json!(selector_string(o)),
    ]
}

/// upstream's `printCronJob`.
fn cronjob_cells(o: &Value, now: Timestamp) -> Vec<Value> {
    let last = match o.pointer("/status/lastScheduleTime") {
        Some(Value::String(_)) => since(o, "/status/lastScheduleTime", now),
        _ => "<none>".to_string(),
    };
    let suspend = match o.pointer("/spec/suspend").and_then(Value::as_bool) {
        Some(true) => "True",
        Some(false) => "False",
        None => "<unset>",
    };
    let template = o
        .pointer("/spec/jobTemplate")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let (containers, images) = container_cells(&template);
    let selector = match selector_string(&template) {
        s if s.is_empty() => "<none>".to_string(),
        s => s,
    };
    vec![
        json!(s_at(o, "/metadata/name")),
        json!(s_at(o, "/spec/schedule")),
        json!(or_none(s_at(o, "/spec/timeZone"))),
        json!(suspend),
        json!(arr(o, "/status/active").len()),
        json!(last),
        json!(age(o, now)),
        json!(containers),
        json!(images),
        json!(selector),
    ]
}

/// Upstream's `GetAccessModesAsString`: the short forms in a fixed order, each once.
fn access_modes_string(modes: &[Value]) -> String {
    let has = |m: &str| modes.iter().any(|x| x.as_str() == Some(m));
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(long, _)| has(long))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

fn phase_or_terminating(o: &Value) -> &str {
    if o.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else {
        s_at(o, "/status/phase")
    }
}

fn unset_or(o: &Value, ptr: &str) -> String {
    match o.pointer(ptr).and_then(Value::as_str) {
        Some(v) => v.to_string(),
        None => "<unset>".to_string(),
    }
}

/// The class of a PV or PVC: the field, else the beta annotation upstream still honours.
fn storage_class_of(o: &Value) -> &str {
    match s_at(o, "/spec/storageClassName") {
        "" => s_at(
            o,
            "/metadata/annotations/volume.beta.kubernetes.io~1storage-class",
        ),
        c => c,
    }
}

/// Whether a StorageClass is the cluster default (upstream's `IsDefaultAnnotation`).
pub fn is_default_storage_class(o: &Value) -> bool {
    [
        "/metadata/annotations/storageclass.kubernetes.io~1is-default-class",
        "/metadata/annotations/storageclass.beta.kubernetes.io~1is-default-class",
    ]
    .iter()
    .any(|p| s_at(o, p) == "true")
}

fn persistent_volume_cells(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let claim = match o.pointer("/spec/claimRef") {
        Some(r) if r.is_object() => format!("{}/{}", s_at(r, "/namespace"), s_at(r, "/name")),
        _ => String::new(),
    };
    vec![
        name,
        json!(s_at(o, "/spec/capacity/storage")),
        json!(access_modes_string(arr(o, "/spec/accessModes"))),
        json!(s_at(o, "/spec/persistentVolumeReclaimPolicy")),
        json!(phase_or_terminating(o)),
        json!(claim),
        json!(storage_class_of(o)),
        json!(unset_or(o, "/spec/volumeAttributesClassName")),
        json!(s_at(o, "/status/reason")),
        age,
        json!(unset_or(o, "/spec/volumeMode")),
    ]
}

fn persistent_volume_claim_cells(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let bound = !s_at(o, "/spec/volumeName").is_empty();
    let (capacity, modes) = if bound {
        (
            s_at(o, "/status/capacity/storage").to_string(),
            access_modes_string(arr(o, "/status/accessModes")),
        )
    } else {
        (String::new(), String::new())
    };
    vec![
        name,
        json!(phase_or_terminating(o)),
        json!(s_at(o, "/spec/volumeName")),
        json!(capacity),
        json!(modes),
        json!(storage_class_of(o)),
        json!(unset_or(o, "/spec/volumeAttributesClassName")),
        age,
        json!(unset_or(o, "/spec/volumeMode")),
    ]
}

fn storage_class_cells(o: &Value, age: Value) -> Vec<Value> {
    let mut name = s_at(o, "/metadata/name").to_string();
    if is_default_storage_class(o) {
        name.push_str(" (default)");
    }
    let or = |ptr: &str, d: &str| match s_at(o, ptr) {
        "" => d.to_string(),
        v => v.to_string(),
    };
    vec![
        json!(name),
        json!(s_at(o, "/provisioner")),
        json!(or("/reclaimPolicy", "Delete")),
        json!(or("/volumeBindingMode", "Immediate")),
        json!(
            o.get("allowVolumeExpansion")
                .and_then(Value::as_bool)
                .unwrap_or(false)
        ),
        age,
    ]
}

/// Upstream's `SubjectsStrings`: users, groups and `namespace/name` service accounts, each
/// joined with ", ".
fn subjects_strings(o: &Value) -> (String, String, String) {
    let (mut users, mut groups, mut sas) = (Vec::new(), Vec::new(), Vec::new());
    for sub in arr(o, "/subjects") {
        let name = s_at(sub, "/name");
        match s_at(sub, "/kind") {
            "User" => users.push(name.to_string()),
            "Group" => groups.push(name.to_string()),
            "ServiceAccount" => match s_at(sub, "/namespace") {
                "" => sas.push(name.to_string()),
                ns => sas.push(format!("{ns}/{name}")),
            },
            _ => {}
        }
    }
    (users.join(", "), groups.join(", "), sas.join(", "))
}

/// Upstream's `extractCSRStatus`: Denied over Approved over Pending, then `,Failed` and
/// `,Issued`.
fn csr_condition(o: &Value) -> String {
    let has = |t: &str| arr(o, "/status/conditions").iter().any(|c| c["type"] == t);
    let mut out = if has("Denied") {
        "Denied"
    } else if has("Approved") {
        "Approved"
    } else {
        "Pending"
    }
    .to_string();
    if has("Failed") {
        out.push_str(",Failed");
    }
    if !s_at(o, "/status/certificate").is_empty() {
        out.push_str(",Issued");
    }
    out
}

fn s_at<'a>(o: &'a Value, ptr: &str) -> &'a str {
    o.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn i_at(o: &Value, ptr: &str) -> i64 {
    o.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

fn arr<'a>(o: &'a Value, ptr: &str) -> &'a [Value] {
    o.pointer(ptr)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".to_string()
    } else {
        s.to_string()
    }
}

fn parse_time(s: &str) -> Option<Timestamp> {
    if s.is_empty() { None } else { s.parse().ok() }
}

/// Upstream's `translateTimestampSince`: `<unknown>` for a missing time.
fn since(o: &Value, ptr: &str, now: Timestamp) -> String {
    match parse_time(s_at(o, ptr)) {
        Some(t) => human_duration(now.duration_since(t).as_secs()),
        None => "<unknown>".to_string(),
    }
}

fn age(o: &Value, now: Timestamp) -> String {
    since(o, "/metadata/creationTimestamp", now)
}

/// `k=v,k2=v2` sorted by key, or `<none>` (upstream `labels.FormatLabels`).
fn format_labels(o: &Value, ptr: &str) -> String {
    let map: BTreeMap<&str, &str> = o
        .pointer(ptr)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    if map.is_empty() {
        return "<none>".to_string();
    }
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn cells(gvk: &Gvk, o: &Value, now: Timestamp) -> (Vec<Value>, Option<Value>) {
    let name = json!(s_at(o, "/metadata/name"));
    let age = json!(age(o, now));
    let cells = match (gvk.group.as_str(), gvk.kind.as_str()) {
        ("", "Pod") => return pod_cells(o, now),
        ("", "Node") => node_cells(o, now),
        ("", "Namespace") => vec![name, json!(s_at(o, "/status/phase")), age],
        ("", "Service") => service_cells(o, now),
        ("", "Endpoints") => vec![name, json!(format_endpoints(o)), age],
        ("", "ConfigMap") => {
            let n = o.get("data").and_then(Value::as_object).map_or(0, Map::len)
                + o.get("binaryData")
                    .and_then(Value::as_object)
                    .map_or(0, Map::len);
            vec![name, json!(n), age]
        }
        ("", "Secret") => {
            let n = o.get("data").and_then(Value::as_object).map_or(0, Map::len);
            vec![name, json!(s_at(o, "/type")), json!(n), age]
        }
        ("", "ServiceAccount") => vec![name, json!(arr(o, "/secrets").len()), age],
        ("", "Event") => event_cells(o, now, false),
        ("events.k8s.io", "Event") => event_cells(o, now, true),
        ("certificates.k8s.io", "CertificateSigningRequest") => vec![
            name,
            age,
            json!(or_none(s_at(o, "/spec/signerName"))),
            json!(s_at(o, "/spec/username")),
            json!(
                match o.pointer("/spec/expirationSeconds").and_then(Value::as_i64) {
                    Some(secs) => human_duration(secs),
                    None => "<none>".to_string(),
                }
            ),
            json!(csr_condition(o)),
        ],
        ("coordination.k8s.io", "Lease") => vec![name, json!(s_at(o, "/spec/holderIdentity")), age],
        ("discovery.k8s.io", "EndpointSlice") => {
            let ports: Vec<String> = arr(o, "/ports")
                .iter()
                .map(|p| {
                    match (
                        p.get("port").and_then(Value::as_i64),
                        p.get("name").and_then(Value::as_str),
                    ) {
                        (Some(n), _) => n.to_string(),
                        (None, Some(n)) => n.to_string(),
                        _ => "*".to_string(),
                    }
                })
                .collect();
            let addrs: Vec<String> = arr(o, "/endpoints")
                .iter()
                .flat_map(|e| {
                    arr(e, "/addresses")
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                })
                .collect();
            vec![
                name,
                json!(s_at(o, "/addressType")),
                json!(list_with_more(&ports)),
                json!(list_with_more(&addrs)),
                age,
            ]
        }
        ("node.k8s.io", "RuntimeClass") => vec![name, json!(s_at(o, "/handler")), age],
        ("networking.k8s.io", "Ingress") => ingress_cells(o, name, age),
        ("networking.k8s.io", "IngressClass") => {
            let parameters = match o.pointer("/spec/parameters") {
                Some(p) if p.is_object() => {
                    let mut out = s_at(p, "/kind").to_string();
                    if let Some(g) = p.get("apiGroup").and_then(Value::as_str) {
                        out = format!("{out}.{g}");
                    }
                    format!("{out}/{}", s_at(p, "/name"))
                }
                _ => "<none>".to_string(),
            };
            vec![
                name,
                json!(s_at(o, "/spec/controller")),
                json!(parameters),
                age,
            ]
        }
        ("networking.k8s.io", "NetworkPolicy") => {
            vec![
                name,
                json!(label_selector_string(o.pointer("/spec/podSelector"))),
                age,
            ]
        }
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => {
            let method = o
                .pointer("/spec/distinguisherMethod/type")
                .and_then(Value::as_str)
                .unwrap_or("<none>");
            let missing = arr(o, "/status/conditions")
                .iter()
                .find(|c| s_at(c, "/type") == "Dangling")
                .map(|c| s_at(c, "/status"))
                .unwrap_or("?");
            vec![
                name,
                json!(s_at(o, "/spec/priorityLevelConfiguration/name")),
                json!(i_at(o, "/spec/matchingPrecedence").to_string()),
                json!(method),
                age,
                json!(missing),
            ]
        }
        ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration") => {
            let num = |ptr: &str| {
                o.pointer(ptr)
                    .and_then(Value::as_i64)
                    .map_or("<none>".to_string(), |n| n.to_string())
            };
            let q = "/spec/limited/limitResponse/queuing";
            vec![
                name,
                json!(s_at(o, "/spec/type")),
                json!(num("/spec/limited/nominalConcurrencyShares")),
                json!(num(&format!("{q}/queues"))),
                json!(num(&format!("{q}/handSize"))),
                json!(num(&format!("{q}/queueLengthLimit"))),
                age,
            ]
        }
        ("apiregistration.k8s.io", "APIService") => {
            let service = match o.pointer("/spec/service") {
                Some(svc) if svc.is_object() => {
                    format!("{}/{}", s_at(svc, "/namespace"), s_at(svc, "/name"))
                }
                _ => "Local".to_string(),
            };
            let available = arr(o, "/status/conditions")
                .iter()
                .find(|c| s_at(c, "/type") == "Available")
                .map(|c| match (s_at(c, "/status"), s_at(c, "/reason")) {
                    ("True", _) => "True".to_string(),
                    (st, "") => st.to_string(),
                    (st, reason) => format!("{st} ({reason})"),
                })
                .unwrap_or_else(|| "Unknown".to_string());
            vec![name, json!(service), json!(available), age]
        }
        ("", "PersistentVolume") => persistent_volume_cells(o, name, age),
        ("", "PersistentVolumeClaim") => persistent_volume_claim_cells(o, name, age),
        ("storage.k8s.io", "StorageClass") => storage_class_cells(o, age),
        ("rbac.authorization.k8s.io", "Role" | "ClusterRole") => {
            vec![name, json!(s_at(o, "/metadata/creationTimestamp"))]
        }
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            let role = format!("{}/{}", s_at(o, "/roleRef/kind"), s_at(o, "/roleRef/name"));
            let (users, groups, sas) = subjects_strings(o);
            vec![
                name,
                json!(role),
                age,
                json!(users),
                json!(groups),
                json!(sas),
            ]
        }
        ("scheduling.k8s.io", "PriorityClass") => vec![
            name,
            json!(i_at(o, "/value")),
            json!(
                o.get("globalDefault")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            ),
            age,
            json!(s_at(o, "/preemptionPolicy")),
        ],
        ("policy", "PodDisruptionBudget") => {
            let int_or_str = |ptr: &str| match o.pointer(ptr) {
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::String(s)) => s.clone(),
                _ => "N/A".to_string(),
            };
            vec![
                name,
                json!(int_or_str("/spec/minAvailable")),
                json!(int_or_str("/spec/maxUnavailable")),
                json!(i_at(o, "/status/disruptionsAllowed")),
                age,
            ]
        }
        ("apps", "Deployment") => {
            let desired = o
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let (containers, images) = container_cells(o);
            vec![
                name,
                json!(format!("{}/{}", i_at(o, "/status/readyReplicas"), desired)),
                json!(i_at(o, "/status/updatedReplicas")),
                json!(i_at(o, "/status/availableReplicas")),
                age,
                json!(containers),
                json!(images),
                json!(selector_string(o)),
            ]
        }
        ("apps", "ReplicaSet") | ("", "ReplicationController") => {
            let (containers, images) = container_cells(o);
            vec![
                name,
                json!(
                    o.pointer("/spec/replicas")
                        .and_then(Value::as_i64)
                        .unwrap_or(1)
                ),
                json!(i_at(o, "/status/replicas")),
                json!(i_at(o, "/status/readyReplicas")),
                age,
                json!(containers),
                json!(images),
                json!(selector_string(o)),
            ]
        }
        ("apps", "ControllerRevision") => vec![
            name,
            json!(controller_name(o)),
            json!(o.get("revision").and_then(Value::as_i64).unwrap_or(0)),
            age,
        ],
        ("apps", "StatefulSet") => {
            let desired = o
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let (containers, images) = container_cells(o);
            vec![
                name,
                json!(format!("{}/{}", i_at(o, "/status/readyReplicas"), desired)),
                age,
                json!(containers),
                json!(images),
            ]
        }
        ("apps", "DaemonSet") => {
            let (containers, images) = container_cells(o);
            vec![
                name,
                json!(i_at(o, "/status/desiredNumberScheduled")),
                json!(i_at(o, "/status/currentNumberScheduled")),
                json!(i_at(o, "/status/numberReady")),
                json!(i_at(o, "/status/updatedNumberScheduled")),
                json!(i_at(o, "/status/numberAvailable")),
                json!(format_labels(o, "/spec/template/spec/nodeSelector")),
                age,
                json!(containers),
                json!(images),
                json!(selector_string(o)),
            ]
        }
        ("batch", "Job") => job_cells(o, now),
        ("batch", "CronJob") => cronjob_cells(o, now),
        _ => vec![name, age],
    };
    (cells, None)
}

/// `<kind>.<group>/<name>` of the controlling owner (upstream's formatResourceName with
/// the kind), `<none>` without one.
fn controller_name(o: &Value) -> String {
    arr(o, "/metadata/ownerReferences")
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .map(|r| {
            let group = s_at(r, "/apiVersion")
                .rsplit_once('/')
                .map(|(g, _)| g)
                .unwrap_or("");
            let kind = s_at(r, "/kind").to_lowercase();
            let gk = if group.is_empty() {
                kind
            } else {
                format!("{kind}.{group}")
            };
            format!("{gk}/{}", s_at(r, "/name"))
        })
        .unwrap_or_else(|| "<none>".to_string())
}

fn container_cells(o: &Value) -> (String, String) {
    let cs = arr(o, "/spec/template/spec/containers");
    let names: Vec<&str> = cs.iter().map(|c| s_at(c, "/name")).collect();
    let images: Vec<&str> = cs.iter().map(|c| s_at(c, "/image")).collect();
    (names.join(","), images.join(","))
}

fn selector_string(o: &Value) -> String {
    let Some(sel) = o.pointer("/spec/selector") else {
        return String::new();
    };
    // A ReplicationController's selector is a plain label map.
    if o.get("kind").and_then(Value::as_str) == Some("ReplicationController") {
        let map: std::collections::BTreeMap<String, String> = sel
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        return crate::selector::LabelSelector::from_map(&map).to_string();
    }
    match serde_json::from_value(sel.clone())
        .map_err(|_| ())
        .and_then(|s| crate::selector::from_metav1(&s).map_err(|_| ()))
    {
        Ok(s) => s.to_string(),
        Err(()) => "<invalid>".to_string(),
    }
}

/// Upstream's `metav1.FormatLabelSelector`: `<none>` for an empty selector.
fn label_selector_string(sel: Option<&Value>) -> String {
    let Some(sel) = sel.filter(|v| !v.is_null()) else {
        return "<none>".to_string();
    };
    match serde_json::from_value(sel.clone())
        .map_err(|_| ())
        .and_then(|s| crate::selector::from_metav1(&s).map_err(|_| ()))
    {
        Ok(s) => or_none(&s.to_string()),
        Err(()) => "<error>".to_string(),
    }
}

/// Upstream's `printIngress`: hosts (`*` when a rule has none), the load balancer's
/// addresses, and `80, 443` once TLS is configured.
fn ingress_cells(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let class = o
        .pointer("/spec/ingressClassName")
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    let hosts: Vec<String> = arr(o, "/spec/rules")
        .iter()
        .map(|r| match s_at(r, "/host") {
            "" => "*".to_string(),
            h => h.to_string(),
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "*".to_string()
    } else {
        list_with_more(&hosts)
    };
    let addrs: Vec<&str> = arr(o, "/status/loadBalancer/ingress")
        .iter()
        .filter_map(|i| {
            [s_at(i, "/ip"), s_at(i, "/hostname")]
                .into_iter()
                .find(|a| !a.is_empty())
        })
        .collect();
    let ports = if arr(o, "/spec/tls").is_empty() {
        "80"
    } else {
        "80, 443"
    };
    vec![
        name,
        json!(class),
        json!(hosts),
        json!(addrs.join(",")),
        json!(ports),
        age,
    ]
}

fn list_with_more(list: &[String]) -> String {
    const MAX: usize = 3;
    if list.len() > MAX {
        return format!("{} + {} more...", list[..MAX].join(","), list.len() - MAX);
    }
    if list.is_empty() {
        "<unset>".to_string()
    } else {
        list.join(",")
    }
}

fn pod_cells(o: &Value, now: Timestamp) -> (Vec<Value>, Option<Value>) {
    let spec_init = arr(o, "/spec/initContainers");
    let restartable = |name: &str| {
        spec_init
            .iter()
            .any(|c| s_at(c, "/name") == name && s_at(c, "/restartPolicy") == "Always")
    };
    let total = arr(o, "/spec/containers").len()
        + spec_init
            .iter()
            .filter(|c| s_at(c, "/restartPolicy") == "Always")
            .count();
    let mut ready = 0usize;
    let mut restarts = 0i64;
    let mut sidecar_restarts = 0i64;
    let mut last_restart: Option<Timestamp> = None;
    let mut last_sidecar_restart: Option<Timestamp> = None;
    let phase = s_at(o, "/status/phase");
    let mut reason = phase.to_string();
    if !s_at(o, "/status/reason").is_empty() {
        reason = s_at(o, "/status/reason").to_string();
    }
    let conditions = arr(o, "/status/conditions");
    if conditions
        .iter()
        .any(|c| s_at(c, "/type") == "PodScheduled" && s_at(c, "/reason") == "SchedulingGated")
    {
        reason = "SchedulingGated".to_string();
    }
    let later = |cur: Option<Timestamp>, t: Option<Timestamp>| match (cur, t) {
        (Some(c), Some(t)) if t > c => Some(t),
        (None, t) => t,
        (c, _) => c,
    };
    let mut initializing = false;
    let init_statuses = arr(o, "/status/initContainerStatuses");
    for (i, c) in init_statuses.iter().enumerate() {
        let rc = i_at(c, "/restartCount");
        restarts += rc;
        let finished = parse_time(s_at(c, "/lastState/terminated/finishedAt"));
        last_restart = later(last_restart, finished);
        let cname = s_at(c, "/name");
        if restartable(cname) {
            sidecar_restarts += rc;
            last_sidecar_restart = later(last_sidecar_restart, finished);
        }
        let terminated = c.pointer("/state/terminated");
        let waiting_reason = s_at(c, "/state/waiting/reason");
        if terminated.is_some() && i_at(c, "/state/terminated/exitCode") == 0 {
            continue;
        }
        if restartable(cname) && c.get("started").and_then(Value::as_bool) == Some(true) {
            if c.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        if terminated.is_some() {
            let r = s_at(c, "/state/terminated/reason");
            reason = if !r.is_empty() {
                format!("Init:{r}")
            } else if i_at(c, "/state/terminated/signal") != 0 {
                format!("Init:Signal:{}", i_at(c, "/state/terminated/signal"))
            } else {
                format!("Init:ExitCode:{}", i_at(c, "/state/terminated/exitCode"))
            };
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            reason = format!("Init:{waiting_reason}");
        } else {
            reason = format!("Init:{i}/{}", spec_init.len());
        }
        initializing = true;
        break;
    }
    let initialized = conditions
        .iter()
        .any(|c| s_at(c, "/type") == "Initialized" && s_at(c, "/status") == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for c in arr(o, "/status/containerStatuses").iter().rev() {
            restarts += i_at(c, "/restartCount");
            last_restart = later(
                last_restart,
                parse_time(s_at(c, "/lastState/terminated/finishedAt")),
            );
            let waiting = s_at(c, "/state/waiting/reason");
            let term = c.pointer("/state/terminated");
            let term_reason = s_at(c, "/state/terminated/reason");
            if !waiting.is_empty() {
                reason = waiting.to_string();
            } else if term.is_some() && !term_reason.is_empty() {
                reason = term_reason.to_string();
            } else if term.is_some() {
                let sig = i_at(c, "/state/terminated/signal");
                reason = if sig != 0 {
                    format!("Signal:{sig}")
                } else {
                    format!("ExitCode:{}", i_at(c, "/state/terminated/exitCode"))
                };
            } else if c.get("ready").and_then(Value::as_bool) == Some(true)
                && c.pointer("/state/running").is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = conditions
                .iter()
                .any(|c| s_at(c, "/type") == "Ready" && s_at(c, "/status") == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.to_string();
        }
    }
    let deleting = o
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    if deleting && s_at(o, "/status/reason") == "NodeLost" {
        reason = "Unknown".to_string();
    } else if deleting && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".to_string();
    }
    let restarts_str = match last_restart {
        Some(t) if restarts != 0 => format!(
            "{restarts} ({} ago)",
            human_duration(now.duration_since(t).as_secs())
        ),
        _ => restarts.to_string(),
    };
    let pod_ip = arr(o, "/status/podIPs")
        .first()
        .map(|p| s_at(p, "/ip"))
        .unwrap_or("");
    let pod_ip = if pod_ip.is_empty() {
        s_at(o, "/status/podIP")
    } else {
        pod_ip
    };
    let gates = arr(o, "/spec/readinessGates");
    let gates_str = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let true_count = gates
            .iter()
            .filter(|g| {
                let t = s_at(g, "/conditionType");
                conditions
                    .iter()
                    .find(|c| s_at(c, "/type") == t)
                    .is_some_and(|c| s_at(c, "/status") == "True")
            })
            .count();
        format!("{true_count}/{}", gates.len())
    };
    let cells = vec![
        json!(s_at(o, "/metadata/name")),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts_str),
        json!(age(o, now)),
        json!(or_none(pod_ip)),
        json!(or_none(s_at(o, "/spec/nodeName"))),
        json!(or_none(s_at(o, "/status/nominatedNodeName"))),
        json!(gates_str),
    ];
    let conditions = match phase {
        "Succeeded" => Some(
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}]),
        ),
        "Failed" => Some(
            json!([{"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}]),
        ),
        _ => None,
    };
    (cells, conditions)
}

fn node_cells(o: &Value, now: Timestamp) -> Vec<Value> {
    let mut status: Vec<String> = Vec::new();
    if let Some(c) = arr(o, "/status/conditions")
        .iter()
        .rfind(|c| s_at(c, "/type") == "Ready")
    {
        status.push(if s_at(c, "/status") == "True" {
            "Ready".into()
        } else {
            "NotReady".into()
        });
    }
    if status.is_empty() {
        status.push("Unknown".into());
    }
    if o.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled".into());
    }
    let mut roles: Vec<String> = Vec::new();
    if let Some(labels) = o.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.push(role.to_string());
                }
            } else if k == "kubernetes.io/role" && v.as_str().is_some_and(|v| !v.is_empty()) {
                roles.push(v.as_str().unwrap_or("").to_string());
            }
        }
    }
    roles.sort();
    roles.dedup();
    let address = |t: &str| {
        arr(o, "/status/addresses")
            .iter()
            .find(|a| s_at(a, "/type") == t)
            .map_or("<none>".to_string(), |a| s_at(a, "/address").to_string())
    };
    let unknown = |ptr: &str| {
        let v = s_at(o, ptr);
        if v.is_empty() {
            "<unknown>".to_string()
        } else {
            v.to_string()
        }
    };
    vec![
        json!(s_at(o, "/metadata/name")),
        json!(status.join(",")),
        json!(if roles.is_empty() {
            "<none>".to_string()
        } else {
            roles.join(",")
        }),
        json!(age(o, now)),
        json!(s_at(o, "/status/nodeInfo/kubeletVersion")),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(unknown("/status/nodeInfo/osImage")),
        json!(unknown("/status/nodeInfo/kernelVersion")),
        json!(unknown("/status/nodeInfo/containerRuntimeVersion")),
    ]
}

fn service_cells(o: &Value, now: Timestamp) -> Vec<Value> {
    let ty = s_at(o, "/spec/type");
    let cluster_ip = arr(o, "/spec/clusterIPs")
        .first()
        .and_then(Value::as_str)
        .unwrap_or("");
    let cluster_ip = if cluster_ip.is_empty() {
        s_at(o, "/spec/clusterIP")
    } else {
        cluster_ip
    };
    let cluster_ip = if cluster_ip.is_empty() {
        "<none>"
    } else {
        cluster_ip
    };
    let external: Vec<String> = arr(o, "/spec/externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    let lb: Vec<String> = arr(o, "/status/loadBalancer/ingress")
        .iter()
        .map(|i| {
            if s_at(i, "/ip").is_empty() {
                s_at(i, "/hostname").to_string()
            } else {
                s_at(i, "/ip").to_string()
            }
        })
        .filter(|s| !s.is_empty())
        .collect();
    let external_ip = match ty {
        "ClusterIP" | "NodePort" => {
            if external.is_empty() {
                "<none>".to_string()
            } else {
                external.join(",")
            }
        }
        "LoadBalancer" => {
            let mut lb_str = lb.join(",");
            // Not wide: upstream truncates long ingress lists (the server prints wide cells,
            // but the LB column is not a wide column, so the short form is what kubectl shows).
            if lb_str.len() > 16 {
                let cut = (0..=13)
                    .rev()
                    .find(|&i| lb_str.is_char_boundary(i))
                    .unwrap_or(0);
                lb_str = format!("{}...", &lb_str[..cut]);
            }
            if !external.is_empty() {
                let mut all: Vec<String> = if lb_str.is_empty() {
                    Vec::new()
                } else {
                    lb_str.split(',').map(str::to_string).collect()
                };
                all.extend(external);
                all.join(",")
            } else if !lb_str.is_empty() {
                lb_str
            } else {
                "<pending>".to_string()
            }
        }
        "ExternalName" => s_at(o, "/spec/externalName").to_string(),
        _ => "<unknown>".to_string(),
    };
    let ports: Vec<String> = arr(o, "/spec/ports")
        .iter()
        .map(|p| {
            let port = i_at(p, "/port");
            let proto = s_at(p, "/protocol");
            match i_at(p, "/nodePort") {
                n if n > 0 => format!("{port}:{n}/{proto}"),
                _ => format!("{port}/{proto}"),
            }
        })
        .collect();
    vec![
        json!(s_at(o, "/metadata/name")),
        json!(ty),
        json!(cluster_ip),
        json!(external_ip),
        json!(if ports.is_empty() {
            "<none>".to_string()
        } else {
            ports.join(",")
        }),
        json!(age(o, now)),
        json!(format_labels(o, "/spec/selector")),
    ]
}

fn format_endpoints(o: &Value) -> String {
    let subsets = arr(o, "/subsets");
    if subsets.is_empty() {
        return "<none>".to_string();
    }
    const MAX: usize = 3;
    let mut list: Vec<String> = Vec::new();
    let mut count = 0;
    let mut more = false;
    for ss in subsets {
        let addrs = arr(ss, "/addresses");
        let ports = arr(ss, "/ports");
        if ports.is_empty() {
            count += addrs.len();
            for a in addrs {
                if list.len() == MAX {
                    more = true;
                    break;
                }
                list.push(s_at(a, "/ip").to_string());
            }
            continue;
        }
        for p in ports {
            count += addrs.len();
            for a in addrs {
                if list.len() == MAX {
                    more = true;
                    break;
                }
                let ip = s_at(a, "/ip");
                let port = i_at(p, "/port");
                list.push(if ip.contains(':') {
                    format!("[{ip}]:{port}")
                } else {
                    format!("{ip}:{port}")
                });
            }
        }
    }
    let ret = list.join(",");
    if more {
        format!("{ret} + {} more...", count - MAX)
    } else {
        ret
    }
}

fn event_cells(o: &Value, now: Timestamp, events_group: bool) -> Vec<Value> {
    // events.k8s.io/v1 names the core fields differently.
    let (first_p, last_p, count_p, involved, message_p, source_p) = if events_group {
        (
            "/deprecatedFirstTimestamp",
            "/deprecatedLastTimestamp",
            "/deprecatedCount",
            "/regarding",
            "/note",
            "/deprecatedSource",
        )
    } else {
        (
            "/firstTimestamp",
            "/lastTimestamp",
            "/count",
            "/involvedObject",
            "/message",
            "/source",
        )
    };
    let mut first = since(o, first_p, now);
    if parse_time(s_at(o, first_p)).is_none() {
        first = since(o, "/eventTime", now);
    }
    let mut last = since(o, last_p, now);
    if parse_time(s_at(o, last_p)).is_none() {
        last = first.clone();
    }
    let mut count = i_at(o, count_p);
    if o.get("series").is_some_and(|s| !s.is_null()) {
        last = since(o, "/series/lastObservedTime", now);
        count = i_at(o, "/series/count");
    } else if count == 0 {
        count = 1;
    }
    let kind = s_at(o, &format!("{involved}/kind")).to_lowercase();
    let iname = s_at(o, &format!("{involved}/name"));
    let target = if iname.is_empty() {
        kind
    } else {
        format!("{kind}/{iname}")
    };
    let first_non_empty = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            a.to_string()
        }
    };
    let component = first_non_empty(
        s_at(o, &format!("{source_p}/component")),
        s_at(o, "/reportingController"),
    );
    let instance = first_non_empty(
        s_at(o, &format!("{source_p}/host")),
        s_at(o, "/reportingInstance"),
    );
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last),
        json!(s_at(o, "/type")),
        json!(s_at(o, "/reason")),
        json!(target),
        json!(s_at(o, &format!("{involved}/fieldPath"))),
        json!(source),
        json!(s_at(o, message_p).trim()),
        json!(first),
        json!(count),
        json!(s_at(o, "/metadata/name")),
    ]
}

/// Upstream's `duration.HumanDuration` for a number of seconds.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".to_string();
    }
    if secs < 0 {
        return "0s".to_string();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2024-01-01T12:00:00Z"
            .parse()
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn row(kind: &str, group: &str, obj: Value) -> Vec<Value> {
        let t = table(&Gvk::new(group, "v1", kind), &[obj], now());
        t["rows"][0]["cells"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn names(kind: &str, group: &str) -> Vec<(String, u64)> {
        columns(&Gvk::new(group, "v1", kind))
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap_or("").to_uppercase(),
                    c["priority"].as_u64().unwrap_or(9),
                )
            })
            .collect()
    }

    #[test]
    fn storage_tables_match_kubectl() {
        let zero: Vec<String> = names("PersistentVolume", "")
            .into_iter()
            .filter(|(_, p)| *p == 0)
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            zero.join(" "),
            "NAME CAPACITY ACCESS MODES RECLAIM POLICY STATUS CLAIM STORAGECLASS VOLUMEATTRIBUTESCLASS REASON AGE"
        );
        let pvc: Vec<String> = names("PersistentVolumeClaim", "")
            .into_iter()
            .filter(|(_, p)| *p == 0)
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            pvc.join(" "),
            "NAME STATUS VOLUME CAPACITY ACCESS MODES STORAGECLASS VOLUMEATTRIBUTESCLASS AGE"
        );
        let sc: Vec<String> = names("StorageClass", "storage.k8s.io")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            sc.join(" "),
            "NAME PROVISIONER RECLAIMPOLICY VOLUMEBINDINGMODE ALLOWVOLUMEEXPANSION AGE"
        );
        let created = "2024-01-01T11:00:00Z";
        let pv = json!({"metadata": {"name": "pvc-1", "creationTimestamp": created},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "local-path",
                "claimRef": {"namespace": "default", "name": "data"}, "volumeMode": "Filesystem"},
            "status": {"phase": "Bound"}});
        assert_eq!(
            row("PersistentVolume", "", pv),
            vec![
                json!("pvc-1"),
                json!("1Gi"),
                json!("RWO,RWX"),
                json!("Delete"),
                json!("Bound"),
                json!("default/data"),
                json!("local-path"),
                json!("<unset>"),
                json!(""),
                json!("60m"),
                json!("Filesystem"),
            ]
        );
        let pending = json!({"metadata": {"name": "data", "creationTimestamp": created},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "local-path"},
            "status": {"phase": "Pending"}});
        assert_eq!(
            row("PersistentVolumeClaim", "", pending),
            vec![
                json!("data"),
                json!("Pending"),
                json!(""),
                json!(""),
                json!(""),
                json!("local-path"),
                json!("<unset>"),
                json!("60m"),
                json!("<unset>"),
            ]
        );
        let bound = json!({"metadata": {"name": "data", "creationTimestamp": created,
                "deletionTimestamp": created},
            "spec": {"volumeName": "pvc-1", "storageClassName": "local-path", "volumeMode": "Filesystem"},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}});
        assert_eq!(
            row("PersistentVolumeClaim", "", bound)[..5],
            [
                json!("data"),
                json!("Terminating"),
                json!("pvc-1"),
                json!("1Gi"),
                json!("RWO")
            ]
        );
        let class = json!({"metadata": {"name": "local-path", "creationTimestamp": created,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer"});
        assert_eq!(
            row("StorageClass", "storage.k8s.io", class),
            vec![
                json!("local-path (default)"),
                json!("rancher.io/local-path"),
                json!("Delete"),
                json!("WaitForFirstConsumer"),
                json!(false),
                json!("60m"),
            ]
        );
    }

    #[test]
    fn controller_revision_names_its_controller_and_revision() {
        let cr = json!({"metadata": {"name": "web-5d4b9c8f7", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "1"},
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "web", "uid": "2", "controller": true}]},
            "data": {}, "revision": 3});
        assert_eq!(
            row("ControllerRevision", "apps", cr),
            vec![
                json!("web-5d4b9c8f7"),
                json!("daemonset.apps/web"),
                json!(3),
                json!("<unknown>")
            ]
        );
        let orphan = json!({"metadata": {"name": "o"}, "revision": 1});
        assert_eq!(
            row("ControllerRevision", "apps", orphan)[1],
            json!("<none>")
        );
        assert_eq!(
            names("ControllerRevision", "apps")
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            vec!["NAME", "CONTROLLER", "REVISION", "AGE"]
        );
    }

    #[test]
    fn human_durations_like_upstream() {
        let cases = [
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (182, "3m2s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60 * 5, "3h5m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (51 * 3600, "2d3h"),
            (8 * 86400, "8d"),
            (800 * 86400, "2y70d"),
            (10 * 365 * 86400, "10y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn pod_columns_and_statuses() {
        assert_eq!(
            names("Pod", ""),
            vec![
                ("NAME".into(), 0),
                ("READY".into(), 0),
                ("STATUS".into(), 0),
                ("RESTARTS".into(), 0),
                ("AGE".into(), 0),
                ("IP".into(), 1),
                ("NODE".into(), 1),
                ("NOMINATED NODE".into(), 1),
                ("READINESS GATES".into(), 1)
            ]
        );
        let running = json!({"metadata": {"name": "web", "creationTimestamp": "2024-01-01T11:55:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "nodeName": "n1"},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.1.0.4"}], "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 3, "state": {"running": {}},
                 "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2024-01-01T11:59:35Z"}}},
                {"name": "b", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        assert_eq!(
            row("Pod", "", running),
            vec![
                json!("web"),
                json!("1/2"),
                json!("CrashLoopBackOff"),
                json!("3 (25s ago)"),
                json!("5m"),
                json!("10.1.0.4"),
                json!("n1"),
                json!("<none>"),
                json!("<none>")
            ]
        );
        let init = json!({"metadata": {"name": "p"}, "spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [{"name": "i", "restartCount": 0, "state": {"running": {}}}],
                       "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "PodInitializing"}}}]}});
        let cells = row("Pod", "", init);
        assert_eq!(
            (cells[1].clone(), cells[2].clone(), cells[4].clone()),
            (json!("0/1"), json!("Init:0/1"), json!("<unknown>"))
        );
        let pulling = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "ErrImagePull"}}}]}});
        assert_eq!(row("Pod", "", pulling)[2], json!("ErrImagePull"));
        let done = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Succeeded", "containerStatuses": [{"name": "c", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
        let t = table(&Gvk::new("", "v1", "Pod"), &[done], now());
        assert_eq!(t["rows"][0]["cells"][2], json!("Completed"));
        assert_eq!(t["rows"][0]["conditions"][0]["reason"], json!("Succeeded"));
        let deleting = json!({"metadata": {"name": "p", "deletionTimestamp": "2024-01-01T11:59:00Z"},
            "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}});
        assert_eq!(row("Pod", "", deleting)[2], json!("Terminating"));
        let crashed = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"terminated": {"exitCode": 137}}}]}});
        assert_eq!(row("Pod", "", crashed)[2], json!("ExitCode:137"));
    }

    /// Cases of upstream's TestPrintPod: (status, ready, reason, restarts).
    #[test]
    fn upstream_print_pod_cases() {
        let two = json!([{"name": "a"}, {"name": "b"}]);
        let run = json!({"running": {}});
        let pod = |status: Value| json!({"metadata": {"name": "p"}, "spec": {"containers": two.clone()}, "status": status});
        let cells = |v: Value| {
            let c = row("Pod", "", v);
            (c[1].clone(), c[2].clone(), c[3].clone())
        };
        assert_eq!(
            cells(pod(json!({"phase": "podPhase", "containerStatuses": [
                {"ready": true, "restartCount": 3, "state": run}, {"restartCount": 3}]}))),
            (json!("1/2"), json!("podPhase"), json!("6"))
        );
        assert_eq!(
            cells(pod(json!({"phase": "podPhase", "containerStatuses": [
                {"ready": true, "restartCount": 3, "state": run},
                {"restartCount": 3, "state": {"waiting": {"reason": "ContainerWaitingReason"}}}]}))),
            (json!("1/2"), json!("ContainerWaitingReason"), json!("6"))
        );
        assert_eq!(
            cells(pod(json!({"phase": "podPhase", "containerStatuses": [
                {"restartCount": 3, "state": {"waiting": {"reason": "ContainerWaitingReason"}}},
                {"restartCount": 3, "state": {"terminated": {"reason": "ContainerTerminatedReason"}}}]}))),
            (json!("0/2"), json!("ContainerWaitingReason"), json!("6"))
        );
        assert_eq!(
            cells(pod(json!({"phase": "podPhase", "containerStatuses": [
                {"ready": true, "restartCount": 3}, {"ready": true, "restartCount": 3}]}))),
            (json!("0/2"), json!("podPhase"), json!("6"))
        );
        assert_eq!(
            cells(pod(
                json!({"phase": "podPhase", "reason": "podReason", "containerStatuses": [
                {"ready": true, "restartCount": 3}, {"ready": true, "restartCount": 3}]})
            )),
            (json!("0/2"), json!("podReason"), json!("6"))
        );
        let completed_and_running = |conditions: Value| {
            pod(
                json!({"phase": "Running", "conditions": conditions, "containerStatuses": [
                {"ready": true, "restartCount": 3, "state": {"terminated": {"reason": "Completed", "exitCode": 0}}},
                {"ready": true, "restartCount": 3, "state": run}]}),
            )
        };
        assert_eq!(
            cells(completed_and_running(json!([]))),
            (json!("1/2"), json!("NotReady"), json!("6"))
        );
        assert_eq!(
            cells(completed_and_running(
                json!([{"type": "Ready", "status": "True"}])
            )),
            (json!("1/2"), json!("Running"), json!("6"))
        );
        let init_restarting = json!({"metadata": {"name": "p"},
            "spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "c"}]},
            "status": {"phase": "Pending",
                "initContainerStatuses": [{"name": "i", "restartCount": 3, "state": run,
                    "lastState": {"terminated": {"finishedAt": "2024-01-01T11:59:50Z"}}}],
                "containerStatuses": [{"name": "c", "restartCount": 0, "state": {"waiting": {}}}]}});
        assert_eq!(
            cells(init_restarting),
            (json!("0/1"), json!("Init:0/1"), json!("3 (10s ago)"))
        );
    }

    #[test]
    fn init_and_sidecar_pods() {
        let pod = |init_status: Value| {
            json!({"metadata": {"name": "p"},
                   "spec": {"initContainers": [{"name": "a"}, {"name": "b"}], "containers": [{"name": "c"}]},
                   "status": {"phase": "Pending", "initContainerStatuses": [init_status],
                              "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "PodInitializing"}}}]}})
        };
        let status = |v: Value| row("Pod", "", v)[2].clone();
        assert_eq!(
            status(pod(
                json!({"name": "a", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}})
            )),
            json!("Init:Error")
        );
        assert_eq!(
            status(pod(
                json!({"name": "a", "state": {"waiting": {"reason": "CrashLoopBackOff"}}})
            )),
            json!("Init:CrashLoopBackOff")
        );
        assert_eq!(
            status(pod(
                json!({"name": "a", "state": {"terminated": {"exitCode": 3}}})
            )),
            json!("Init:ExitCode:3")
        );
        assert_eq!(
            status(pod(
                json!({"name": "a", "state": {"terminated": {"exitCode": 0, "signal": 9}}})
            )),
            json!("PodInitializing")
        );
        let sidecar = json!({"metadata": {"name": "p"},
            "spec": {"initContainers": [{"name": "proxy", "restartPolicy": "Always"}], "containers": [{"name": "app"}]},
            "status": {"phase": "Running",
                "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
                "initContainerStatuses": [{"name": "proxy", "started": true, "ready": true, "restartCount": 2, "state": {"running": {}}}],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "state": {"running": {}}}]}});
        let cells = row("Pod", "", sidecar);
        assert_eq!(
            (cells[1].clone(), cells[2].clone(), cells[3].clone()),
            (json!("2/2"), json!("Running"), json!("2"))
        );
    }

    #[test]
    fn node_rows() {
        assert_eq!(
            names("Node", "")
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            vec![
                "NAME",
                "STATUS",
                "ROLES",
                "AGE",
                "VERSION",
                "INTERNAL-IP",
                "EXTERNAL-IP",
                "OS-IMAGE",
                "KERNEL-VERSION",
                "CONTAINER-RUNTIME"
            ]
        );
        let node = json!({"metadata": {"name": "n1", "creationTimestamp": "2023-12-30T09:00:00Z",
                "labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/hostname": "n1"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}],
                       "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Debian GNU/Linux 12 (bookworm)",
                                    "kernelVersion": "6.1.0", "containerRuntimeVersion": "nodus://0.1.0"}}});
        assert_eq!(
            row("Node", "", node),
            vec![
                json!("n1"),
                json!("Ready,SchedulingDisabled"),
                json!("control-plane"),
                json!("2d3h"),
                json!("v1.33.0"),
                json!("10.0.0.2"),
                json!("<none>"),
                json!("Debian GNU/Linux 12 (bookworm)"),
                json!("6.1.0"),
                json!("nodus://0.1.0")
            ]
        );
        let bare = row(
            "Node",
            "",
            json!({"metadata": {"name": "n2"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
        );
        assert_eq!(
            (bare[1].clone(), bare[2].clone(), bare[7].clone()),
            (json!("NotReady"), json!("<none>"), json!("<unknown>"))
        );
        assert_eq!(
            row("Node", "", json!({"metadata": {"name": "n3"}}))[1],
            json!("Unknown")
        );
    }

    #[test]
    fn service_and_friends() {
        let svc = json!({"metadata": {"name": "kubernetes"}, "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1",
            "clusterIPs": ["10.96.0.1"], "ports": [{"port": 443, "protocol": "TCP"}], "selector": {"b": "2", "a": "1"}}});
        assert_eq!(
            row("Service", "", svc),
            vec![
                json!("kubernetes"),
                json!("ClusterIP"),
                json!("10.96.0.1"),
                json!("<none>"),
                json!("443/TCP"),
                json!("<unknown>"),
                json!("a=1,b=2")
            ]
        );
        let np = json!({"metadata": {"name": "np"}, "spec": {"type": "NodePort", "clusterIPs": ["10.96.0.9"],
            "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}});
        assert_eq!(row("Service", "", np)[4], json!("80:30080/TCP"));
        let long = json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"hostname": "ééééééé.example.com"}]}}});
        assert_eq!(row("Service", "", long)[3], json!("éééééé..."));
        let lb = json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.9"]}});
        assert_eq!(row("Service", "", lb)[3], json!("<pending>"));
        let ep = json!({"metadata": {"name": "e"}, "subsets": [{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}, {"ip": "10.0.0.3"}, {"ip": "10.0.0.4"}],
            "ports": [{"port": 80}]}]});
        assert_eq!(
            row("Endpoints", "", ep)[1],
            json!("10.0.0.1:80,10.0.0.2:80,10.0.0.3:80 + 1 more...")
        );
        assert_eq!(
            row("Endpoints", "", json!({"metadata": {"name": "e"}}))[1],
            json!("<none>")
        );
        assert_eq!(
            row(
                "ConfigMap",
                "",
                json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}})
            )[1],
            json!(2)
        );
        assert_eq!(
            row(
                "Secret",
                "",
                json!({"metadata": {"name": "s"}, "type": "Opaque", "data": {"a": "MQ=="}})
            ),
            vec![json!("s"), json!("Opaque"), json!(1), json!("<unknown>")]
        );
        let lease = json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1"}});
        assert_eq!(row("Lease", "coordination.k8s.io", lease)[1], json!("n1"));
        let slice = json!({"metadata": {"name": "s"}, "addressType": "IPv4", "ports": [{"port": 80, "name": "http"}],
            "endpoints": [{"addresses": ["10.0.0.1"]}]});
        assert_eq!(
            row("EndpointSlice", "discovery.k8s.io", slice)[1..4].to_vec(),
            vec![json!("IPv4"), json!("80"), json!("10.0.0.1")]
        );
        assert_eq!(
            row(
                "EndpointSlice",
                "discovery.k8s.io",
                json!({"metadata": {"name": "s"}})
            )[2],
            json!("<unset>")
        );
        let pdb = json!({"metadata": {"name": "p"}, "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}});
        assert_eq!(
            row("PodDisruptionBudget", "policy", pdb)[1..4].to_vec(),
            vec![json!("50%"), json!("N/A"), json!(1)]
        );
    }

    #[test]
    fn column_types_follow_upstream() {
        let types = |kind: &str, group: &str| -> Vec<String> {
            columns(&Gvk::new(group, "v1", kind))
                .iter()
                .map(|c| c["type"].as_str().unwrap_or("").to_string())
                .collect()
        };
        assert_eq!(types("ConfigMap", ""), vec!["string", "string", "string"]);
        assert_eq!(
            types("ServiceAccount", ""),
            vec!["string", "string", "string"]
        );
        assert_eq!(
            types("Deployment", "apps")[..5].to_vec(),
            vec!["string", "string", "string", "string", "string"]
        );
        assert_eq!(
            types("ReplicaSet", "apps")[1..4].to_vec(),
            vec!["integer", "integer", "integer"]
        );
        assert_eq!(
            types("PriorityClass", "scheduling.k8s.io")[1..3].to_vec(),
            vec!["integer", "boolean"]
        );
        assert_eq!(types("PodDisruptionBudget", "policy")[3], "integer");
    }

    #[test]
    fn jobs_and_cronjobs() {
        assert_eq!(
            names("Job", "batch"),
            [
                ("NAME", 0),
                ("STATUS", 0),
                ("COMPLETIONS", 0),
                ("DURATION", 0),
                ("AGE", 0),
                ("CONTAINERS", 1),
                ("IMAGES", 1),
                ("SELECTOR", 1)
            ]
            .map(|(n, p)| (n.to_string(), p))
        );
        let j = json!({"metadata": {"name": "pi", "creationTimestamp": "2024-01-01T11:58:00Z"},
            "spec": {"completions": 4, "parallelism": 2,
                "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u"}},
                "template": {"spec": {"containers": [{"name": "pi", "image": "perl"}]}}},
            "status": {"succeeded": 4, "startTime": "2024-01-01T11:58:00Z", "completionTime": "2024-01-01T11:58:42Z",
                "conditions": [{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]}});
        assert_eq!(
            row("Job", "batch", j),
            vec![
                json!("pi"),
                json!("Complete"),
                json!("4/4"),
                json!("42s"),
                json!("2m"),
                json!("pi"),
                json!("perl"),
                json!("batch.kubernetes.io/controller-uid=u")
            ]
        );
        let running = json!({"metadata": {"name": "w"}, "spec": {"parallelism": 3},
            "status": {"succeeded": 1, "startTime": "2024-01-01T11:59:50Z"}});
        let cells = row("Job", "batch", running);
        assert_eq!(
            cells[1..4],
            [json!("Running"), json!("1/1 of 3"), json!("10s")]
        );
        assert_eq!(
            names("CronJob", "batch")
                .iter()
                .filter(|(_, p)| *p == 0)
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            vec![
                "NAME",
                "SCHEDULE",
                "TIMEZONE",
                "SUSPEND",
                "ACTIVE",
                "LAST SCHEDULE",
                "AGE"
            ]
        );
        let cj = json!({"metadata": {"name": "c", "creationTimestamp": "2024-01-01T11:00:00Z"},
            "spec": {"schedule": "* * * * *", "suspend": false,
                "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}},
            "status": {"active": [{"name": "c-1"}], "lastScheduleTime": "2024-01-01T11:59:00Z"}});
        assert_eq!(
            row("CronJob", "batch", cj),
            vec![
                json!("c"),
                json!("* * * * *"),
                json!("<none>"),
                json!("False"),
                json!(1),
                json!("60s"),
                json!("60m"),
                json!("c"),
                json!("busybox"),
                json!("<none>")
            ]
        );
    }

    #[test]
    fn workloads_and_events() {
        let d = json!({"metadata": {"name": "web"}, "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1"}, {"name": "side", "image": "busybox"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
        assert_eq!(
            row("Deployment", "apps", d),
            vec![
                json!("web"),
                json!("2/3"),
                json!(3),
                json!(2),
                json!("<unknown>"),
                json!("nginx,side"),
                json!("nginx:1,busybox"),
                json!("app=web")
            ]
        );
        assert_eq!(
            names("DaemonSet", "apps")
                .iter()
                .filter(|(_, p)| *p == 0)
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            vec![
                "NAME",
                "DESIRED",
                "CURRENT",
                "READY",
                "UP-TO-DATE",
                "AVAILABLE",
                "NODE SELECTOR",
                "AGE"
            ]
        );
        let ev = json!({"metadata": {"name": "p.1"}, "type": "Normal", "reason": "Pulled", "message": " Pulled image \n",
            "involvedObject": {"kind": "Pod", "name": "p", "fieldPath": "spec.containers{c}"},
            "source": {"component": "kubelet", "host": "n1"}, "count": 2,
            "firstTimestamp": "2024-01-01T11:00:00Z", "lastTimestamp": "2024-01-01T11:59:00Z"});
        assert_eq!(
            row("Event", "", ev),
            vec![
                json!("60s"),
                json!("Normal"),
                json!("Pulled"),
                json!("pod/p"),
                json!("spec.containers{c}"),
                json!("kubelet, n1"),
                json!("Pulled image"),
                json!("60m"),
                json!(2),
                json!("p.1")
            ]
        );
        let other = table(
            &Gvk::new("example.com", "v1", "Widget"),
            &[json!({"metadata": {"name": "w"}})],
            now(),
        );
        assert_eq!(other["columnDefinitions"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            other["rows"][0]["object"]["kind"],
            json!("PartialObjectMetadata")
        );
    }
}
