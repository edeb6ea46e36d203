//! Component schemas: the k8s-openapi types' JSON schemas (already named as upstream names
//! them, e.g. `io.k8s.api.core.v1.Pod`), reshaped into upstream's OpenAPI v3 form with the
//! extensions kubectl reads: `x-kubernetes-group-version-kind` on every kind and list kind,
//! and `x-kubernetes-patch-strategy`/`x-kubernetes-patch-merge-key`, which client-side
//! `kubectl apply` uses to compute strategic merge patches.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

/// Prefix of a reference to a component schema in an OpenAPI v3 document.
pub(crate) const REF_PREFIX: &str = "#/components/schemas/";

/// A kind with a schema: its identity and the schema names of the kind and its list.
#[derive(Clone, Debug)]
pub(crate) struct KindSchema {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub name: String,
    /// `None` for kinds that are never listed (Binding, Eviction, Scale, TokenRequest).
    pub list_name: Option<String>,
}

/// Adds `T`'s schema (and everything it references) to the generator; returns its name.
fn add<T: JsonSchema>(generator: &mut SchemaGenerator) -> String {
    generator.subschema_for::<T>();
    T::schema_name().into_owned()
}

macro_rules! kind_table {
    ($( $g:literal, $v:literal, $k:literal => $ty:ty, $listed:literal; )*) => {
        /// Every kind nodus knows a k8s-openapi type for; a catalogue kind outside this
        /// table has no schema (the unit tests catch that).
        const KNOWN_KINDS: &[(&str, &str, &str)] = &[$( ($g, $v, $k), )*];

        fn register(generator: &mut SchemaGenerator, group: &str, version: &str, kind: &str)
            -> Option<(String, bool)> {
            match (group, version, kind) {
                $( ($g, $v, $k) => Some((add::<$ty>(generator), $listed)), )*
                _ => None,
            }
        }
    };
}

kind_table! {
    "", "v1", "Binding" => api::core::v1::Binding, false;
    "apiregistration.k8s.io", "v1", "APIService" => k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService, true;
    "apiextensions.k8s.io", "v1", "CustomResourceDefinition" => k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition, true;
    "", "v1", "ComponentStatus" => api::core::v1::ComponentStatus, true;
    "", "v1", "ConfigMap" => api::core::v1::ConfigMap, true;
    "", "v1", "Endpoints" => api::core::v1::Endpoints, true;
    "", "v1", "Event" => api::core::v1::Event, true;
    "", "v1", "LimitRange" => api::core::v1::LimitRange, true;
    "", "v1", "Namespace" => api::core::v1::Namespace, true;
    "", "v1", "Node" => api::core::v1::Node, true;
    "", "v1", "PersistentVolume" => api::core::v1::PersistentVolume, true;
    "", "v1", "PersistentVolumeClaim" => api::core::v1::PersistentVolumeClaim, true;
    "", "v1", "Pod" => api::core::v1::Pod, true;
    "", "v1", "PodTemplate" => api::core::v1::PodTemplate, true;
    "", "v1", "ReplicationController" => api::core::v1::ReplicationController, true;
    "", "v1", "ResourceQuota" => api::core::v1::ResourceQuota, true;
    "", "v1", "Secret" => api::core::v1::Secret, true;
    "", "v1", "Service" => api::core::v1::Service, true;
    "", "v1", "ServiceAccount" => api::core::v1::ServiceAccount, true;
    "apps", "v1", "ControllerRevision" => api::apps::v1::ControllerRevision, true;
    "apps", "v1", "DaemonSet" => api::apps::v1::DaemonSet, true;
    "apps", "v1", "Deployment" => api::apps::v1::Deployment, true;
    "apps", "v1", "ReplicaSet" => api::apps::v1::ReplicaSet, true;
    "apps", "v1", "StatefulSet" => api::apps::v1::StatefulSet, true;
    "authentication.k8s.io", "v1", "SelfSubjectReview" => api::authentication::v1::SelfSubjectReview, false;
    "authentication.k8s.io", "v1", "TokenRequest" => api::authentication::v1::TokenRequest, false;
    "authentication.k8s.io", "v1", "TokenReview" => api::authentication::v1::TokenReview, false;
    "authorization.k8s.io", "v1", "LocalSubjectAccessReview" => api::authorization::v1::LocalSubjectAccessReview, false;
    "authorization.k8s.io", "v1", "SelfSubjectAccessReview" => api::authorization::v1::SelfSubjectAccessReview, false;
    "authorization.k8s.io", "v1", "SelfSubjectRulesReview" => api::authorization::v1::SelfSubjectRulesReview, false;
    "authorization.k8s.io", "v1", "SubjectAccessReview" => api::authorization::v1::SubjectAccessReview, false;
    "autoscaling", "v1", "Scale" => api::autoscaling::v1::Scale, false;
    "autoscaling", "v2", "HorizontalPodAutoscaler" => api::autoscaling::v2::HorizontalPodAutoscaler, true;
    "batch", "v1", "CronJob" => api::batch::v1::CronJob, true;
    "batch", "v1", "Job" => api::batch::v1::Job, true;
    "certificates.k8s.io", "v1", "CertificateSigningRequest" => api::certificates::v1::CertificateSigningRequest, true;
    "coordination.k8s.io", "v1", "Lease" => api::coordination::v1::Lease, true;
    "discovery.k8s.io", "v1", "EndpointSlice" => api::discovery::v1::EndpointSlice, true;
    "events.k8s.io", "v1", "Event" => api::events::v1::Event, true;
    "flowcontrol.apiserver.k8s.io", "v1", "FlowSchema" => api::flowcontrol::v1::FlowSchema, true;
    "flowcontrol.apiserver.k8s.io", "v1", "PriorityLevelConfiguration" => api::flowcontrol::v1::PriorityLevelConfiguration, true;
    "networking.k8s.io", "v1", "Ingress" => api::networking::v1::Ingress, true;
    "networking.k8s.io", "v1", "IngressClass" => api::networking::v1::IngressClass, true;
    "networking.k8s.io", "v1", "NetworkPolicy" => api::networking::v1::NetworkPolicy, true;
    "node.k8s.io", "v1", "RuntimeClass" => api::node::v1::RuntimeClass, true;
    "policy", "v1", "Eviction" => api::policy::v1::Eviction, false;
    "policy", "v1", "PodDisruptionBudget" => api::policy::v1::PodDisruptionBudget, true;
    "rbac.authorization.k8s.io", "v1", "ClusterRole" => api::rbac::v1::ClusterRole, true;
    "rbac.authorization.k8s.io", "v1", "ClusterRoleBinding" => api::rbac::v1::ClusterRoleBinding, true;
    "rbac.authorization.k8s.io", "v1", "Role" => api::rbac::v1::Role, true;
    "rbac.authorization.k8s.io", "v1", "RoleBinding" => api::rbac::v1::RoleBinding, true;
    "scheduling.k8s.io", "v1", "PriorityClass" => api::scheduling::v1::PriorityClass, true;
    "storage.k8s.io", "v1", "CSIDriver" => api::storage::v1::CSIDriver, true;
    "storage.k8s.io", "v1", "CSINode" => api::storage::v1::CSINode, true;
    "storage.k8s.io", "v1", "StorageClass" => api::storage::v1::StorageClass, true;
    "storage.k8s.io", "v1", "VolumeAttachment" => api::storage::v1::VolumeAttachment, true;
}

/// Fields whose Go struct tags carry `patchStrategy`/`patchMergeKey` upstream:
/// (schema, property, strategy, merge key).
const PATCH_STRATEGIES: &[(&str, &str, &str, Option<&str>)] = &[
    (
        "io.k8s.api.core.v1.PodSpec",
        "containers",
        "merge",
        Some("name"),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "initContainers",
        "merge",
        Some("name"),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "ephemeralContainers",
        "merge",
        Some("name"),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "volumes",
        "merge,retainKeys",
        Some("name"),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "imagePullSecrets",
        "merge",
        Some("name"),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "hostAliases",
        "merge",
        Some("ip"),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "topologySpreadConstraints",
        "merge",
        Some("topologyKey"),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "resourceClaims",
        "merge,retainKeys",
        Some("name"),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "schedulingGates",
        "merge",
        Some("name"),
    ),
    (
        "io.k8s.api.core.v1.Container",
        "ports",
        "merge",
        Some("containerPort"),
    ),
    ("io.k8s.api.core.v1.Container", "env", "merge", Some("name")),
    (
        "io.k8s.api.core.v1.Container",
        "volumeMounts",
        "merge",
        Some("mountPath"),
    ),
    (
        "io.k8s.api.core.v1.Container",
        "volumeDevices",
        "merge",
        Some("devicePath"),
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "ports",
        "merge",
        Some("containerPort"),
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "env",
        "merge",
        Some("name"),
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "volumeMounts",
        "merge",
        Some("mountPath"),
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "volumeDevices",
        "merge",
        Some("devicePath"),
    ),
    (
        "io.k8s.api.core.v1.PodStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.core.v1.PodStatus",
        "podIPs",
        "merge",
        Some("ip"),
    ),
    (
        "io.k8s.api.core.v1.PodStatus",
        "hostIPs",
        "merge",
        Some("ip"),
    ),
    (
        "io.k8s.api.core.v1.PodStatus",
        "resourceClaimStatuses",
        "merge,retainKeys",
        Some("name"),
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "finalizers",
        "merge",
        None,
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "ownerReferences",
        "merge",
        Some("uid"),
    ),
    (
        "io.k8s.api.core.v1.ServiceSpec",
        "ports",
        "merge",
        Some("port"),
    ),
    (
        "io.k8s.api.core.v1.ServiceStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.core.v1.ServiceAccount",
        "secrets",
        "merge",
        Some("name"),
    ),
    ("io.k8s.api.core.v1.NodeSpec", "podCIDRs", "merge", None),
    (
        "io.k8s.api.core.v1.NodeStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.core.v1.NodeStatus",
        "addresses",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.core.v1.NamespaceStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.core.v1.PersistentVolumeClaimStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.core.v1.ReplicationControllerStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.apps.v1.DeploymentSpec",
        "strategy",
        "retainKeys",
        None,
    ),
    (
        "io.k8s.api.apps.v1.DeploymentStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.apps.v1.ReplicaSetStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.apps.v1.DaemonSetStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.apps.v1.StatefulSetStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.batch.v1.JobStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
    (
        "io.k8s.api.policy.v1.PodDisruptionBudgetStatus",
        "conditions",
        "merge",
        Some("type"),
    ),
];

/// All component schemas, the kinds they describe, and which schemas each schema refers to.
pub(crate) struct Components {
    pub schemas: BTreeMap<String, Value>,
    pub kinds: Vec<KindSchema>,
}

/// Meta types the operations of every group-version refer to.
pub(crate) const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
pub(crate) const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
pub(crate) const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
pub(crate) const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";
pub(crate) const INT_OR_STRING: &str = "io.k8s.apimachinery.pkg.util.intstr.IntOrString";
pub(crate) const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";

/// Generates every known kind's schema once.
pub(crate) fn components() -> Components {
    let mut generator = SchemaGenerator::new(SchemaSettings::openapi3());
    let mut kinds = Vec::new();
    for (group, version, kind) in KNOWN_KINDS {
        if let Some((name, listed)) = register(&mut generator, group, version, kind) {
            kinds.push(KindSchema {
                group,
                version,
                kind,
                list_name: listed.then(|| format!("{name}List")),
                name,
            });
        }
    }
    add::<meta::Status>(&mut generator);
    add::<meta::DeleteOptions>(&mut generator);
    add::<meta::Patch>(&mut generator);
    add::<meta::WatchEvent<serde_json::Value>>(&mut generator);
    add::<meta::ListMeta>(&mut generator);
    let mut schemas: BTreeMap<String, Value> = generator
        .take_definitions(true)
        .into_iter()
        .collect::<BTreeMap<_, _>>();
    for k in &kinds {
        if let Some(list) = &k.list_name {
            schemas.insert(list.clone(), list_schema(k));
        }
    }
    reshape(&mut schemas, &kinds);
    Components { schemas, kinds }
}

fn reference(name: &str) -> Value {
    json!({"$ref": format!("{REF_PREFIX}{name}")})
}

fn gvk(k: &KindSchema) -> Value {
    json!({"group": k.group, "kind": k.kind, "version": k.version})
}

/// k8s-openapi has no schema for its generic `List<T>`; upstream's `<Kind>List` has this shape.
fn list_schema(k: &KindSchema) -> Value {
    json!({
        "description": format!("{}List is a list of {} objects.", k.kind, k.kind),
        "type": "object",
        "properties": {
            "apiVersion": {
                "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources",
                "type": "string",
            },
            "items": {
                "description": format!("List of {} objects.", k.kind),
                "type": "array",
                "items": {"allOf": [reference(&k.name)], "default": {}},
            },
            "kind": {
                "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
                "type": "string",
            },
            "metadata": {
                "allOf": [reference(LIST_META)],
                "default": {},
                "description": "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
            },
        },
        "required": ["items"],
    })
}

/// Brings the generated schemas to upstream's shape.
fn reshape(schemas: &mut BTreeMap<String, Value>, kinds: &[KindSchema]) {
    for k in kinds {
        if let Some(Value::Object(s)) = schemas.get_mut(&k.name) {
            s.insert("x-kubernetes-group-version-kind".into(), json!([gvk(k)]));
        }
        if let Some(list) = &k.list_name
            && let Some(Value::Object(s)) = schemas.get_mut(list)
        {
            let list_gvk =
                json!({"group": k.group, "kind": format!("{}List", k.kind), "version": k.version});
            s.insert("x-kubernetes-group-version-kind".into(), json!([list_gvk]));
        }
    }
    for (name, s) in schemas.iter_mut() {
        // core/v1 Event is the one kind whose Go struct requires metadata upstream.
        relax_required(s, name != "io.k8s.api.core.v1.Event");
    }
    // Upstream's v3 documents give these two scalars no `type` but a oneOf; `kubectl explain`
    // then names them (`<IntOrString>`, `<Quantity>`) instead of printing `<string>`.
    if let Some(Value::Object(s)) = schemas.get_mut(INT_OR_STRING) {
        s.remove("x-kubernetes-int-or-string");
        s.remove("type");
        s.insert("format".into(), json!("int-or-string"));
        s.insert(
            "oneOf".into(),
            json!([{"type": "integer"}, {"type": "string"}]),
        );
    }
    if let Some(Value::Object(s)) = schemas.get_mut(QUANTITY) {
        s.remove("type");
        s.remove("x-kubernetes-int-or-string");
        s.insert(
            "oneOf".into(),
            json!([{"type": "string"}, {"type": "number"}]),
        );
    }
    for (schema, property, strategy, key) in PATCH_STRATEGIES {
        let Some(Value::Object(s)) = schemas.get_mut(*schema) else {
            continue;
        };
        let Some(Value::Object(p)) = s.get_mut("properties").and_then(|p| p.get_mut(*property))
        else {
            continue;
        };
        p.insert("x-kubernetes-patch-strategy".into(), json!(strategy));
        if let Some(key) = key {
            p.insert("x-kubernetes-patch-merge-key".into(), json!(key));
        }
    }
}

/// k8s-openapi marks fields required whenever its Rust field is not an `Option`; upstream
/// requires `metadata` almost nowhere, nor the `name` of a local object reference (it
/// defaults to ""). `kubectl explain` prints `-required-` from this list.
fn relax_required(schema: &mut Value, drop_metadata: bool) {
    let Value::Object(s) = schema else {
        return;
    };
    let referent_name = s
        .get("properties")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.get("description"))
        .and_then(Value::as_str)
        .is_some_and(|d| d.starts_with("Name of the referent."));
    if let Some(Value::Array(required)) = s.get_mut("required") {
        let dropped =
            |r: &Value| (drop_metadata && r == "metadata") || (referent_name && r == "name");
        required.retain(|r| !dropped(r));
        if required.is_empty() {
            s.remove("required");
        }
    }
}

/// Names of the component schemas `value` refers to directly.
fn direct_refs(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref")
                && let Some(name) = r.strip_prefix(REF_PREFIX)
            {
                out.insert(name.to_string());
            }
            m.values().for_each(|v| direct_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| direct_refs(v, out)),
        _ => {}
    }
}

/// The schemas reachable from `roots`, each with its own definition.
pub(crate) fn closure(
    schemas: &BTreeMap<String, Value>,
    roots: impl IntoIterator<Item = String>,
) -> Map<String, Value> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut pending: Vec<String> = roots.into_iter().collect();
    while let Some(name) = pending.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        if let Some(schema) = schemas.get(&name) {
            let mut refs = BTreeSet::new();
            direct_refs(schema, &mut refs);
            pending.extend(refs.into_iter().filter(|r| !seen.contains(r)));
        }
    }
    seen.into_iter()
        .filter_map(|n| schemas.get(&n).map(|s| (n, s.clone())))
        .collect()
}

/// Every `$ref` under `value` that does not name one of `schemas` (for tests).
#[cfg(test)]
pub(crate) fn dangling_refs(value: &Value, schemas: &Map<String, Value>) -> Vec<String> {
    let mut refs = BTreeSet::new();
    direct_refs(value, &mut refs);
    refs.into_iter()
        .filter(|r| !schemas.contains_key(r))
        .collect()
}
