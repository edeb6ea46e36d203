//! Scalar fields that upstream's Go types declare as pointers (`*int32`, `*bool`, `*string`,
//! …), for the catalogue's types and the bodies sent to them. Go's protobuf encoding writes a
//! pointer only when it is set, so a zero read for one of these is a real value that JSON
//! must carry (`replicas: 0`, `runAsUser: 0`, `optional: false`). The proto schemas cannot
//! say this, hence the table; a field missing here only loses an explicit zero.

macro_rules! fields {
    ($($pkg:literal $msg:literal: [$($f:literal),* $(,)?];)*) => {
        &[$($((concat!($pkg, ".", $msg), $f),)*)*]
    };
}

pub(super) static POINTERS: &[(&str, &str)] = fields! {
    "k8s.io.apimachinery.pkg.apis.meta.v1" "ObjectMeta": ["deletionGracePeriodSeconds"];
    "k8s.io.apimachinery.pkg.apis.meta.v1" "OwnerReference": ["controller", "blockOwnerDeletion"];
    "k8s.io.apimachinery.pkg.apis.meta.v1" "ListMeta": ["remainingItemCount"];
    "k8s.io.apimachinery.pkg.apis.meta.v1" "DeleteOptions": [
        "gracePeriodSeconds", "orphanDependents", "propagationPolicy",
        "ignoreStoreReadErrorWithClusterBreakingPotential",
    ];
    "k8s.io.apimachinery.pkg.apis.meta.v1" "Preconditions": ["uid", "resourceVersion"];
    "k8s.io.apimachinery.pkg.apis.meta.v1" "ListOptions": ["timeoutSeconds", "sendInitialEvents"];
    "k8s.io.apimachinery.pkg.apis.meta.v1" "PatchOptions": ["force"];

    "k8s.io.api.core.v1" "PodSpec": [
        "terminationGracePeriodSeconds", "activeDeadlineSeconds",
        "automountServiceAccountToken", "shareProcessNamespace", "priority",
        "enableServiceLinks", "setHostnameAsFQDN", "hostUsers", "runtimeClassName",
        "preemptionPolicy", "hostnameOverride",
    ];
    "k8s.io.api.core.v1" "Container": ["restartPolicy"];
    "k8s.io.api.core.v1" "EphemeralContainerCommon": ["restartPolicy"];
    "k8s.io.api.core.v1" "ContainerStatus": ["started", "stopSignal"];
    "k8s.io.api.core.v1" "Lifecycle": ["stopSignal"];
    "k8s.io.api.core.v1" "ReplicationControllerSpec": ["replicas"];
    "k8s.io.api.core.v1" "LocalVolumeSource": ["fsType"];
    "k8s.io.api.core.v1" "PersistentVolumeSpec": ["volumeAttributesClassName"];
    "k8s.io.api.core.v1" "PersistentVolumeClaimStatus": ["currentVolumeAttributesClassName"];
    "k8s.io.api.core.v1" "PodCertificateProjection": ["maxExpirationSeconds"];
    "k8s.io.api.core.v1" "PodLogOptions": ["sinceSeconds", "tailLines", "limitBytes", "stream"];
    "k8s.io.api.core.v1" "NodeSwapStatus": ["capacity"];
    "k8s.io.api.core.v1" "SecurityContext": [
        "privileged", "runAsUser", "runAsGroup", "runAsNonRoot", "readOnlyRootFilesystem",
        "allowPrivilegeEscalation", "procMount",
    ];
    "k8s.io.api.core.v1" "PodSecurityContext": [
        "runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "fsGroupChangePolicy",
        "supplementalGroupsPolicy", "seLinuxChangePolicy",
    ];
    "k8s.io.api.core.v1" "WindowsSecurityContextOptions": [
        "gmsaCredentialSpecName", "gmsaCredentialSpec", "runAsUserName", "hostProcess",
    ];
    "k8s.io.api.core.v1" "SeccompProfile": ["localhostProfile"];
    "k8s.io.api.core.v1" "AppArmorProfile": ["localhostProfile"];
    "k8s.io.api.core.v1" "Probe": ["terminationGracePeriodSeconds"];
    "k8s.io.api.core.v1" "GRPCAction": ["service"];
    "k8s.io.api.core.v1" "ConfigMapKeySelector": ["optional"];
    "k8s.io.api.core.v1" "SecretKeySelector": ["optional"];
    "k8s.io.api.core.v1" "ConfigMapEnvSource": ["optional"];
    "k8s.io.api.core.v1" "SecretEnvSource": ["optional"];
    "k8s.io.api.core.v1" "FileKeySelector": ["optional"];
    "k8s.io.api.core.v1" "ConfigMapVolumeSource": ["defaultMode", "optional"];
    "k8s.io.api.core.v1" "SecretVolumeSource": ["defaultMode", "optional"];
    "k8s.io.api.core.v1" "KeyToPath": ["mode"];
    "k8s.io.api.core.v1" "DownwardAPIVolumeSource": ["defaultMode"];
    "k8s.io.api.core.v1" "DownwardAPIVolumeFile": ["mode"];
    "k8s.io.api.core.v1" "ProjectedVolumeSource": ["defaultMode"];
    "k8s.io.api.core.v1" "ConfigMapProjection": ["optional"];
    "k8s.io.api.core.v1" "SecretProjection": ["optional"];
    "k8s.io.api.core.v1" "ServiceAccountTokenProjection": ["expirationSeconds"];
    "k8s.io.api.core.v1" "ClusterTrustBundleProjection": ["name", "signerName", "optional"];
    "k8s.io.api.core.v1" "HostPathVolumeSource": ["type"];
    "k8s.io.api.core.v1" "CSIVolumeSource": ["readOnly", "fsType"];
    "k8s.io.api.core.v1" "VolumeMount": ["mountPropagation", "recursiveReadOnly"];
    "k8s.io.api.core.v1" "VolumeMountStatus": ["recursiveReadOnly"];
    "k8s.io.api.core.v1" "PersistentVolumeClaimSpec": [
        "storageClassName", "volumeMode", "volumeAttributesClassName",
    ];
    "k8s.io.api.core.v1" "PersistentVolumeSpec": ["volumeMode", "volumeAttributesClassName"];
    "k8s.io.api.core.v1" "LocalVolumeSource": ["fsType"];
    "k8s.io.api.core.v1" "TypedLocalObjectReference": ["apiGroup"];
    "k8s.io.api.core.v1" "TypedObjectReference": ["apiGroup", "namespace"];
    "k8s.io.api.core.v1" "Toleration": ["tolerationSeconds"];
    "k8s.io.api.core.v1" "TopologySpreadConstraint": [
        "minDomains", "nodeAffinityPolicy", "nodeTaintsPolicy",
    ];
    "k8s.io.api.core.v1" "PodDNSConfigOption": ["value"];
    "k8s.io.api.core.v1" "PodResourceClaim": ["resourceClaimName", "resourceClaimTemplateName"];
    "k8s.io.api.core.v1" "PodResourceClaimStatus": ["resourceClaimName"];
    "k8s.io.api.core.v1" "ServiceSpec": [
        "allocateLoadBalancerNodePorts", "loadBalancerClass", "internalTrafficPolicy",
        "ipFamilyPolicy", "trafficDistribution",
    ];
    "k8s.io.api.core.v1" "ServicePort": ["appProtocol"];
    "k8s.io.api.core.v1" "ClientIPConfig": ["timeoutSeconds"];
    "k8s.io.api.core.v1" "LoadBalancerIngress": ["ipMode"];
    "k8s.io.api.core.v1" "PortStatus": ["error"];
    "k8s.io.api.core.v1" "ServiceAccount": ["automountServiceAccountToken"];
    "k8s.io.api.core.v1" "ConfigMap": ["immutable"];
    "k8s.io.api.core.v1" "Secret": ["immutable"];
    "k8s.io.api.core.v1" "EndpointAddress": ["nodeName"];
    "k8s.io.api.core.v1" "EndpointPort": ["appProtocol"];
    "k8s.io.api.core.v1" "NodeRuntimeHandlerFeatures": ["recursiveReadOnlyMounts", "userNamespaces"];
    "k8s.io.api.core.v1" "NodeFeatures": ["supplementalGroupsPolicy"];

    "k8s.io.api.apps.v1" "DeploymentSpec": [
        "replicas", "revisionHistoryLimit", "progressDeadlineSeconds",
    ];
    "k8s.io.api.apps.v1" "DeploymentStatus": ["collisionCount", "terminatingReplicas"];
    "k8s.io.api.apps.v1" "ReplicaSetSpec": ["replicas"];
    "k8s.io.api.apps.v1" "ReplicaSetStatus": ["terminatingReplicas"];
    "k8s.io.api.apps.v1" "DaemonSetSpec": ["revisionHistoryLimit"];
    "k8s.io.api.apps.v1" "DaemonSetStatus": ["collisionCount"];
    "k8s.io.api.apps.v1" "StatefulSetSpec": ["replicas", "revisionHistoryLimit"];
    "k8s.io.api.apps.v1" "StatefulSetStatus": ["collisionCount"];
    "k8s.io.api.apps.v1" "RollingUpdateStatefulSetStrategy": ["partition"];

    "k8s.io.api.autoscaling.v1" "HorizontalPodAutoscalerSpec": [
        "minReplicas", "targetCPUUtilizationPercentage",
    ];
    "k8s.io.api.autoscaling.v1" "HorizontalPodAutoscalerStatus": [
        "observedGeneration", "currentCPUUtilizationPercentage",
    ];

    "k8s.io.api.certificates.v1" "CertificateSigningRequestSpec": ["expirationSeconds"];

    "k8s.io.api.coordination.v1" "LeaseSpec": [
        "holderIdentity", "leaseDurationSeconds", "leaseTransitions", "strategy",
        "preferredHolder",
    ];

    "k8s.io.api.discovery.v1" "Endpoint": ["hostname", "nodeName", "zone"];
    "k8s.io.api.discovery.v1" "EndpointConditions": ["ready", "serving", "terminating"];
    "k8s.io.api.discovery.v1" "EndpointPort": ["name", "protocol", "port", "appProtocol"];

    "k8s.io.api.networking.v1" "IngressSpec": ["ingressClassName"];
    "k8s.io.api.networking.v1" "HTTPIngressPath": ["pathType"];
    "k8s.io.api.networking.v1" "IngressClassParametersReference": [
        "apiGroup", "scope", "namespace",
    ];
    "k8s.io.api.networking.v1" "IngressPortStatus": ["error"];
    "k8s.io.api.networking.v1" "NetworkPolicyPort": ["protocol", "endPort"];

    "k8s.io.api.policy.v1" "PodDisruptionBudgetSpec": ["unhealthyPodEvictionPolicy"];

    "k8s.io.api.scheduling.v1" "PriorityClass": ["preemptionPolicy"];

    "k8s.io.api.authentication.v1" "TokenRequestSpec": ["expirationSeconds"];

    "k8s.io.api.batch.v1" "JobSpec": [
        "parallelism", "completions", "activeDeadlineSeconds", "backoffLimit",
        "backoffLimitPerIndex", "maxFailedIndexes", "manualSelector", "ttlSecondsAfterFinished",
        "completionMode", "suspend", "podReplacementPolicy", "managedBy",
    ];
    "k8s.io.api.batch.v1" "JobStatus": ["terminating", "failedIndexes", "ready"];
    "k8s.io.api.batch.v1" "PodFailurePolicyOnExitCodesRequirement": ["containerName"];
    "k8s.io.api.batch.v1" "SuccessPolicyRule": ["succeededIndexes", "succeededCount"];
    "k8s.io.api.batch.v1" "CronJobSpec": [
        "timeZone", "startingDeadlineSeconds", "suspend", "successfulJobsHistoryLimit",
        "failedJobsHistoryLimit",
    ];

    "k8s.io.api.storage.v1" "CSIDriverSpec": [
        "attachRequired", "podInfoOnMount", "storageCapacity", "fsGroupPolicy",
        "requiresRepublish", "seLinuxMount", "nodeAllocatableUpdatePeriodSeconds",
        "serviceAccountTokenInSecrets",
    ];
    "k8s.io.api.storage.v1" "StorageClass": [
        "reclaimPolicy", "allowVolumeExpansion", "volumeBindingMode",
    ];
    "k8s.io.api.storage.v1" "TokenRequest": ["expirationSeconds"];
    "k8s.io.api.storage.v1" "VolumeAttachmentSource": ["persistentVolumeName"];
    "k8s.io.api.storage.v1" "VolumeError": ["errorCode"];
    "k8s.io.api.storage.v1" "VolumeNodeResources": ["count"];
};
