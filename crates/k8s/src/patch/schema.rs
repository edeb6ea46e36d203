//! The patch strategies upstream declares (`patchStrategy`/`patchMergeKey` struct tags) on the
//! paths of the catalogue kinds. Fields not listed are maps that merge or lists that are
//! replaced, which is upstream's default.

/// A node of the type graph: the Go type whose fields are being merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Root(&'static str),
    ObjectMeta,
    PodTemplateSpec,
    PodSpec,
    Container,
    PodStatus,
    ServiceSpec,
    NodeSpec,
    NodeStatus,
    WorkloadSpec,
    CronJobSpec,
    JobTemplateSpec,
    ConditionsStatus,
    /// A type with no merge-keyed lists below it.
    Plain,
}

/// What upstream declares for one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldMeta {
    /// The type of the field (or of a list's elements).
    pub ty: Ty,
    /// `patchStrategy:"merge"` on a list.
    pub merge: bool,
    /// `patchMergeKey` of a list of objects.
    pub key: Option<&'static str>,
}

const fn plain() -> FieldMeta {
    FieldMeta {
        ty: Ty::Plain,
        merge: false,
        key: None,
    }
}

const fn obj(ty: Ty) -> FieldMeta {
    FieldMeta {
        ty,
        merge: false,
        key: None,
    }
}

const fn keyed(ty: Ty, key: &'static str) -> FieldMeta {
    FieldMeta {
        ty,
        merge: true,
        key: Some(key),
    }
}

const fn set() -> FieldMeta {
    FieldMeta {
        ty: Ty::Plain,
        merge: true,
        key: None,
    }
}

/// The type name upstream prints in errors.
pub fn type_name(ty: Ty) -> &'static str {
    match ty {
        Ty::Root(kind) => kind,
        Ty::ObjectMeta => "ObjectMeta",
        Ty::PodTemplateSpec => "PodTemplateSpec",
        Ty::PodSpec => "PodSpec",
        Ty::Container => "Container",
        Ty::PodStatus => "PodStatus",
        Ty::ServiceSpec => "ServiceSpec",
        Ty::NodeSpec => "NodeSpec",
        Ty::NodeStatus => "NodeStatus",
        Ty::WorkloadSpec => "Spec",
        Ty::CronJobSpec => "CronJobSpec",
        Ty::JobTemplateSpec => "JobTemplateSpec",
        Ty::ConditionsStatus => "Status",
        Ty::Plain => "",
    }
}

/// Patch metadata of `field` inside a value of type `ty`.
pub fn lookup(ty: Ty, field: &str) -> FieldMeta {
    match (ty, field) {
        (Ty::Root(_), "metadata") | (Ty::PodTemplateSpec, "metadata") => obj(Ty::ObjectMeta),
        (Ty::Root("Pod"), "spec") | (Ty::PodTemplateSpec, "spec") => obj(Ty::PodSpec),
        (Ty::Root("Pod"), "status") => obj(Ty::PodStatus),
        (Ty::Root("Service"), "spec") => obj(Ty::ServiceSpec),
        (Ty::Root("Node"), "spec") => obj(Ty::NodeSpec),
        (Ty::Root("Node"), "status") => obj(Ty::NodeStatus),
        (Ty::Root("ServiceAccount"), "secrets") => keyed(Ty::Plain, "name"),
        (Ty::Root("Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet" | "Job"), "spec") => {
            obj(Ty::WorkloadSpec)
        }
        (Ty::Root("CronJob"), "spec") => obj(Ty::CronJobSpec),
        (Ty::CronJobSpec, "jobTemplate") => obj(Ty::JobTemplateSpec),
        (Ty::JobTemplateSpec, "metadata") => obj(Ty::ObjectMeta),
        (Ty::JobTemplateSpec, "spec") => obj(Ty::WorkloadSpec),
        (
            Ty::Root(
                "Deployment"
                | "ReplicaSet"
                | "DaemonSet"
                | "Job"
                | "StatefulSet"
                | "Namespace"
                | "Service"
                | "PodDisruptionBudget",
            ),
            "status",
        ) => obj(Ty::ConditionsStatus),
        (Ty::WorkloadSpec, "template") => obj(Ty::PodTemplateSpec),
        (Ty::ObjectMeta, "finalizers") => set(),
        (Ty::ObjectMeta, "ownerReferences") => keyed(Ty::Plain, "uid"),
        (Ty::PodSpec, "containers" | "initContainers" | "ephemeralContainers") => {
            keyed(Ty::Container, "name")
        }
        (Ty::PodSpec, "volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates") => {
            keyed(Ty::Plain, "name")
        }
        (Ty::PodSpec, "hostAliases") => keyed(Ty::Plain, "ip"),
        (Ty::PodSpec, "topologySpreadConstraints") => keyed(Ty::Plain, "topologyKey"),
        (Ty::Container, "ports") => keyed(Ty::Plain, "containerPort"),
        (Ty::Container, "env") => keyed(Ty::Plain, "name"),
        (Ty::Container, "volumeMounts") => keyed(Ty::Plain, "mountPath"),
        (Ty::Container, "volumeDevices") => keyed(Ty::Plain, "devicePath"),
        (Ty::PodStatus, "conditions") => keyed(Ty::Plain, "type"),
        (Ty::PodStatus, "podIPs" | "hostIPs") => keyed(Ty::Plain, "ip"),
        (Ty::PodStatus, "resourceClaimStatuses") => keyed(Ty::Plain, "name"),
        (Ty::ServiceSpec, "ports") => keyed(Ty::Plain, "port"),
        (Ty::NodeSpec, "podCIDRs") => set(),
        (Ty::NodeStatus, "conditions" | "addresses") => keyed(Ty::Plain, "type"),
        (Ty::ConditionsStatus, "conditions") => keyed(Ty::Plain, "type"),
        _ => plain(),
    }
}
