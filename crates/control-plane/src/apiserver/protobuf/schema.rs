//! The compiled Kubernetes message schemas, the kind → message lookup, and the per-field
//! facts about upstream's Go types (inline embedding, required and pointer fields) that
//! decide which zero values the JSON form keeps.

use std::collections::HashSet;
use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, FieldDescriptor, MessageDescriptor};

use super::ProtobufError;
use super::{hints, pointers};

static DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/k8s_descriptor.bin"));

const META_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";

fn pool() -> Result<&'static DescriptorPool, ProtobufError> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(DESCRIPTORS).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| ProtobufError::field("", format!("protobuf schemas unusable: {e}")))
}

/// A message by its full proto name.
pub(super) fn message(full_name: &str) -> Result<MessageDescriptor, ProtobufError> {
    pool()?
        .get_message_by_name(full_name)
        .ok_or_else(|| ProtobufError::field("", format!("no protobuf schema for {full_name}")))
}

/// The message of an API kind. Kinds of meta/v1 (DeleteOptions, Status, …) are registered
/// in every group-version upstream, so they are found under any apiVersion.
pub(super) fn kind(api_version: &str, kind: &str) -> Result<MessageDescriptor, ProtobufError> {
    let unknown = || ProtobufError::UnknownKind {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
    };
    let package = package(api_version).ok_or_else(unknown)?;
    let pool = pool()?;
    pool.get_message_by_name(&format!("{package}.{kind}"))
        .or_else(|| pool.get_message_by_name(&format!("{META_V1}.{kind}")))
        .filter(is_top_level_kind)
        .ok_or_else(unknown)
}

/// Only objects (messages with `metadata`) and the meta/v1 option kinds travel as bodies;
/// a nested type such as `PodSpec` is no kind.
fn is_top_level_kind(m: &MessageDescriptor) -> bool {
    m.get_field_by_name("metadata").is_some() || m.package_name() == META_V1
}

/// The proto package of an apiVersion: `v1` is core, `apps/v1` apps, `coordination.k8s.io/v1`
/// coordination, `meta.k8s.io/v1` apimachinery's meta.
fn package(api_version: &str) -> Option<String> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    if version.is_empty() || version.contains('/') {
        return None;
    }
    let group = group.strip_suffix(".k8s.io").unwrap_or(group);
    Some(match group {
        "" | "core" => format!("k8s.io.api.core.{version}"),
        "meta" => format!("k8s.io.apimachinery.pkg.apis.meta.{version}"),
        "rbac.authorization" => format!("k8s.io.api.rbac.{version}"),
        g if g.contains('.') => return None,
        g => format!("k8s.io.api.{g}.{version}"),
    })
}

fn key(field: &FieldDescriptor) -> (String, String) {
    (
        field.parent_message().full_name().to_string(),
        field.name().to_string(),
    )
}

fn set(entries: &'static [(&'static str, &'static str)]) -> HashSet<(String, String)> {
    entries
        .iter()
        .map(|(m, f)| (m.to_string(), f.to_string()))
        .collect()
}

/// A Go struct embedded with `json:",inline"`: its fields belong to the outer JSON object.
pub(super) fn is_inline(field: &FieldDescriptor) -> bool {
    static INLINE: OnceLock<HashSet<(String, String)>> = OnceLock::new();
    INLINE
        .get_or_init(|| set(hints::INLINE))
        .contains(&key(field))
}

/// Whether a zero scalar (0, false, "") read from the wire appears in the JSON form.
/// Go writes every non-pointer field, zero or not, so a zero on the wire usually means
/// "unset" and upstream's JSON omits it (`omitempty`). Pointer fields are written only when
/// set, so their zero is a real value (`replicas: 0`, `runAsUser: 0`,
/// `automountServiceAccountToken: false`); required fields have no `omitempty`.
pub(super) fn keeps_zero(field: &FieldDescriptor) -> bool {
    static KEEP: OnceLock<HashSet<(String, String)>> = OnceLock::new();
    KEEP.get_or_init(|| {
        let mut keep = set(hints::REQUIRED);
        keep.extend(set(pointers::POINTERS));
        keep
    })
    .contains(&key(field))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalogue_kind_has_a_message() {
        // apiextensions-apiserver's protos are not vendored: CRDs travel as JSON only. Nor
        // are flowcontrol's and kube-aggregator's yet (generate.py's PACKAGES): their kinds
        // answer protobuf requests in JSON, which client-go accepts.
        const JSON_ONLY: [&str; 3] = [
            "apiextensions.k8s.io",
            "flowcontrol.apiserver.k8s.io",
            "apiregistration.k8s.io",
        ];
        for r in nodus_k8s::catalog::all()
            .iter()
            .filter(|r| !JSON_ONLY.contains(&r.group))
        {
            let api_version = if r.group.is_empty() {
                r.version.to_string()
            } else {
                format!("{}/{}", r.group, r.version)
            };
            let m = kind(&api_version, r.kind);
            assert!(m.is_ok(), "{api_version} {}: {:?}", r.kind, m.err());
        }
    }

    #[test]
    fn subresource_and_option_kinds_resolve() {
        for (av, k) in [
            ("autoscaling/v1", "Scale"),
            ("policy/v1", "Eviction"),
            ("v1", "DeleteOptions"),
            ("meta.k8s.io/v1", "DeleteOptions"),
            ("authentication.k8s.io/v1", "TokenRequest"),
        ] {
            assert!(kind(av, k).is_ok(), "{av} {k}");
        }
        assert!(matches!(
            kind("v1", "PodSpec"),
            Err(ProtobufError::UnknownKind { .. })
        ));
        assert!(matches!(
            kind("example.com/v1", "Widget"),
            Err(ProtobufError::UnknownKind { .. })
        ));
    }

    #[test]
    fn hint_entries_name_real_fields() {
        for (m, f) in hints::INLINE
            .iter()
            .chain(hints::REQUIRED)
            .chain(pointers::POINTERS)
        {
            let desc = message(m).unwrap_or_else(|e| panic!("{m}: {e}"));
            assert!(desc.get_field_by_name(f).is_some(), "{m}.{f}");
        }
    }
}
