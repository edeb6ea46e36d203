//! Manifests, indexes and platforms: the JSON a registry serves, classified and parsed, and
//! the choice of one platform's manifest from an index with containerd's default matcher
//! (`platforms.Only(platforms.DefaultSpec())`, containerd `platforms/compare.go`).

use super::super::digest::Digest;
use std::collections::BTreeMap;
use std::fmt;

pub const MEDIA_TYPE_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_TYPE_DOCKER_MANIFEST_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
pub const MEDIA_TYPE_DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
pub const MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED: &str =
    "application/vnd.docker.distribution.manifest.v1+prettyjws";

/// The `Accept` header of a manifest request (containerd's resolver sends the same list).
pub const ACCEPT_MANIFESTS: &str = "application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.oci.image.index.v1+json, */*";

/// Largest manifest or index accepted (the OCI distribution spec's 4 MiB recommendation).
pub const MAX_MANIFEST_SIZE: usize = 4 << 20;

/// A content descriptor (OCI image-spec `descriptor.md`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
}

/// An image manifest: OCI `application/vnd.oci.image.manifest.v1+json` or Docker schema 2.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An image index (OCI) or manifest list (Docker).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A platform as in the OCI image spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(
        rename = "os.version",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub os_version: Option<String>,
    #[serde(rename = "os.features", default, skip_serializing_if = "Vec::is_empty")]
    pub os_features: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    pub fn new(os: &str, architecture: &str, variant: Option<&str>) -> Self {
        Platform {
            architecture: architecture.to_string(),
            os: os.to_string(),
            os_version: None,
            os_features: Vec::new(),
            variant: variant.map(str::to_string),
        }
    }

    /// The platform this node runs: Linux on the build's architecture, named the Go way.
    pub fn host() -> Self {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "x86" => "386",
            "aarch64" => "arm64",
            "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
            "loongarch64" => "loong64",
            other => other,
        };
        Platform::new("linux", arch, None).normalized()
    }

    /// containerd's `platforms.Normalize`.
    pub fn normalized(&self) -> Platform {
        let mut os = self.os.to_ascii_lowercase();
        if os.is_empty() {
            os = "linux".into();
        } else if os == "macos" {
            os = "darwin".into();
        }
        let (arch, variant) = normalize_arch(
            &self.architecture,
            self.variant.as_deref().unwrap_or_default(),
        );
        Platform {
            architecture: arch,
            os,
            os_version: self.os_version.clone(),
            os_features: self.os_features.clone(),
            variant: (!variant.is_empty()).then_some(variant),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let os = if self.os.is_empty() {
            "unknown"
        } else {
            &self.os
        };
        write!(f, "{os}/{}", self.architecture)?;
        if let Some(v) = self.variant.as_deref().filter(|v| !v.is_empty()) {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

fn normalize_arch(arch: &str, variant: &str) -> (String, String) {
    let arch = arch.to_ascii_lowercase();
    let variant = variant.to_ascii_lowercase();
    match arch.as_str() {
        "i386" => ("386".into(), String::new()),
        "x86_64" | "x86-64" | "amd64" => {
            let v = if variant == "v1" {
                String::new()
            } else {
                variant
            };
            ("amd64".into(), v)
        }
        "aarch64" | "arm64" => {
            let v = match variant.as_str() {
                "8" | "v8" | "v8.0" => String::new(),
                _ => variant,
            };
            ("arm64".into(), v)
        }
        "armhf" => ("arm".into(), "v7".into()),
        "armel" => ("arm".into(), "v6".into()),
        "arm" => {
            let v = match variant.as_str() {
                "" | "7" => "v7".to_string(),
                "5" | "6" | "8" => format!("v{variant}"),
                _ => variant,
            };
            ("arm".into(), v)
        }
        _ => (arch, variant),
    }
}

/// containerd's `platforms.Only(p)`: `p` first, then what it can also run (amd64 → lower
/// amd64 variants → 386; arm64 → arm/v8 … arm/v5; arm/vN → arm/vN-1 … arm/v5), in that
/// order of preference. Matching compares normalised OS, architecture and variant.
#[derive(Debug, Clone)]
pub struct PlatformMatcher {
    vector: Vec<Platform>,
}

impl PlatformMatcher {
    pub fn only(platform: &Platform) -> Self {
        Self {
            vector: platform_vector(&platform.normalized()),
        }
    }

    /// The platform asked for.
    pub fn platform(&self) -> &Platform {
        &self.vector[0]
    }

    /// Preference rank of `p` (0 is best), or `None` when it does not match.
    pub fn rank(&self, p: &Platform) -> Option<usize> {
        let n = p.normalized();
        self.vector.iter().position(|m| {
            m.os == n.os && m.architecture == n.architecture && m.variant == n.variant
        })
    }

    pub fn matches(&self, p: &Platform) -> bool {
        self.rank(p).is_some()
    }
}

fn platform_vector(p: &Platform) -> Vec<Platform> {
    let with = |arch: &str, variant: Option<String>| Platform {
        architecture: arch.to_string(),
        os: p.os.clone(),
        os_version: p.os_version.clone(),
        os_features: p.os_features.clone(),
        variant,
    };
    let version = |v: Option<&str>| -> Option<u32> { v?.strip_prefix('v')?.parse().ok() };
    let mut out = vec![p.clone()];
    match p.architecture.as_str() {
        "amd64" => {
            if let Some(n) = version(p.variant.as_deref())
                && n > 1
            {
                for k in (2..n).rev() {
                    out.push(with("amd64", Some(format!("v{k}"))));
                }
                out.push(with("amd64", None));
            }
            out.push(with("386", None));
        }
        "arm" => {
            if let Some(n) = version(p.variant.as_deref())
                && n > 5
            {
                for k in (5..n).rev() {
                    out.push(with("arm", Some(format!("v{k}"))));
                }
            }
        }
        "arm64" => {
            let arm = with("arm", Some("v8".into()));
            out.extend(platform_vector(&arm));
        }
        _ => {}
    }
    out
}

/// What a manifest body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestKind {
    Manifest,
    Index,
}

/// Decides what a served manifest is from its `mediaType` field, the `Content-Type` header
/// and, when neither says, its shape. Schema 1 and unknown media types are refused with a
/// message saying why.
pub fn classify(content_type: Option<&str>, body: &[u8]) -> Result<(ManifestKind, String), String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("malformed manifest JSON: {e}"))?;
    let obj = value
        .as_object()
        .ok_or("malformed manifest JSON: not an object")?;
    let body_mt = obj
        .get("mediaType")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty());
    let header_mt = content_type
        .map(|c| {
            c.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .filter(|c| is_manifest_type(c) || is_schema1(c));
    let schema_version = obj.get("schemaVersion").and_then(|v| v.as_u64());
    let schema1 = |mt: &str| {
        format!(
            "Docker Image Manifest version 2, schema 1 ({mt}) is not supported, as in \
             containerd 2; push the image again with a current client (Docker schema 2 or OCI)"
        )
    };
    if schema_version == Some(1) {
        return Err(schema1(
            body_mt
                .or(header_mt.as_deref())
                .unwrap_or(MEDIA_TYPE_DOCKER_SCHEMA1),
        ));
    }
    let mt = match (body_mt, header_mt.as_deref()) {
        (Some(b), _) => b.to_string(),
        (None, Some(h)) => h.to_string(),
        (None, None) => {
            if obj.contains_key("manifests") {
                MEDIA_TYPE_OCI_INDEX.to_string()
            } else if obj.contains_key("config") || obj.contains_key("layers") {
                MEDIA_TYPE_OCI_MANIFEST.to_string()
            } else {
                return Err(
                    "manifest has no mediaType and is neither an image manifest nor an index"
                        .into(),
                );
            }
        }
    };
    if is_schema1(&mt) {
        return Err(schema1(&mt));
    }
    let kind = kind_of(&mt).ok_or_else(|| {
        format!(
            "unsupported manifest media type {mt:?} (expected an OCI or Docker schema 2 image \
             manifest or index)"
        )
    })?;
    // A body that says one thing and a header that says another kind is not trusted.
    if let (Some(_), Some(h)) = (body_mt, header_mt.as_deref())
        && let Some(hk) = kind_of(h)
        && hk != kind
    {
        return Err(format!(
            "manifest media type {mt:?} does not match the Content-Type {h:?}"
        ));
    }
    if schema_version != Some(2) {
        return Err(format!(
            "unsupported manifest schemaVersion {} (expected 2)",
            obj.get("schemaVersion")
                .map(|v| v.to_string())
                .unwrap_or_else(|| "(missing)".into())
        ));
    }
    Ok((kind, mt))
}

fn is_schema1(mt: &str) -> bool {
    mt == MEDIA_TYPE_DOCKER_SCHEMA1 || mt == MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED
}

fn kind_of(mt: &str) -> Option<ManifestKind> {
    match mt {
        MEDIA_TYPE_OCI_MANIFEST | MEDIA_TYPE_DOCKER_MANIFEST => Some(ManifestKind::Manifest),
        MEDIA_TYPE_OCI_INDEX | MEDIA_TYPE_DOCKER_MANIFEST_LIST => Some(ManifestKind::Index),
        _ => None,
    }
}

/// Whether `mt` is an image manifest or index media type this client understands.
pub fn is_manifest_type(mt: &str) -> bool {
    kind_of(mt).is_some()
}

/// Parses an image manifest body (already classified).
pub fn parse_manifest(body: &[u8]) -> Result<Manifest, String> {
    serde_json::from_slice(body).map_err(|e| format!("malformed image manifest: {e}"))
}

/// Parses an index body (already classified).
pub fn parse_index(body: &[u8]) -> Result<Index, String> {
    serde_json::from_slice(body).map_err(|e| format!("malformed image index: {e}"))
}

/// Chooses the manifest for `matcher` from an index, as containerd's `images.Manifest` does:
/// entries whose platform matches, best-ranked first (file order among equals); entries
/// without a platform come last. Entries of other media types (attestations, artifacts) are
/// skipped.
pub fn select_manifest<'a>(index: &'a Index, matcher: &PlatformMatcher) -> Option<&'a Descriptor> {
    let mut candidates: Vec<(usize, &Descriptor)> = index
        .manifests
        .iter()
        .filter(|d| d.media_type.is_empty() || is_manifest_type(&d.media_type))
        .filter_map(|d| match &d.platform {
            None => Some((usize::MAX, d)),
            Some(p) => matcher.rank(p).map(|r| (r, d)),
        })
        .collect();
    candidates.sort_by_key(|(rank, _)| *rank);
    candidates.first().map(|(_, d)| *d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(n: u8, platform: Option<Platform>, mt: &str) -> Descriptor {
        Descriptor {
            media_type: mt.into(),
            digest: Digest::of(&[n]),
            size: 1,
            urls: vec![],
            annotations: BTreeMap::new(),
            platform,
            artifact_type: None,
        }
    }

    fn index(ds: Vec<Descriptor>) -> Index {
        Index {
            schema_version: 2,
            media_type: Some(MEDIA_TYPE_OCI_INDEX.into()),
            manifests: ds,
            annotations: BTreeMap::new(),
        }
    }

    fn p(os: &str, arch: &str, v: Option<&str>) -> Option<Platform> {
        Some(Platform::new(os, arch, v))
    }

    #[test]
    fn selects_amd64_like_containerd() {
        let m = PlatformMatcher::only(&Platform::new("linux", "amd64", None));
        let idx = index(vec![
            desc(0, p("linux", "arm64", Some("v8")), MEDIA_TYPE_OCI_MANIFEST),
            desc(1, p("linux", "386", None), MEDIA_TYPE_OCI_MANIFEST),
            desc(2, p("unknown", "unknown", None), MEDIA_TYPE_OCI_MANIFEST),
            desc(3, p("linux", "amd64", Some("v2")), MEDIA_TYPE_OCI_MANIFEST),
            desc(4, p("linux", "x86_64", None), MEDIA_TYPE_OCI_MANIFEST),
            desc(5, p("linux", "amd64", None), MEDIA_TYPE_OCI_MANIFEST),
        ]);
        // x86_64 normalises to amd64 and comes first in file order; amd64/v2 does not match
        // a plain amd64 node.
        assert_eq!(select_manifest(&idx, &m).unwrap().digest, Digest::of(&[4]));

        // 386 is the fallback for amd64; amd64/v1 is amd64.
        let idx = index(vec![
            desc(1, p("linux", "386", None), MEDIA_TYPE_DOCKER_MANIFEST),
            desc(
                2,
                p("linux", "amd64", Some("v1")),
                MEDIA_TYPE_DOCKER_MANIFEST,
            ),
        ]);
        assert_eq!(select_manifest(&idx, &m).unwrap().digest, Digest::of(&[2]));
        let idx = index(vec![
            desc(0, p("linux", "arm64", None), MEDIA_TYPE_DOCKER_MANIFEST),
            desc(1, p("linux", "386", None), MEDIA_TYPE_DOCKER_MANIFEST),
        ]);
        assert_eq!(select_manifest(&idx, &m).unwrap().digest, Digest::of(&[1]));

        // Nothing for this platform, attestation manifests and other OSes are skipped.
        let idx = index(vec![
            desc(0, p("linux", "arm64", None), MEDIA_TYPE_OCI_MANIFEST),
            desc(1, p("windows", "amd64", None), MEDIA_TYPE_OCI_MANIFEST),
            desc(2, p("linux", "amd64", None), "application/vnd.in-toto+json"),
        ]);
        assert!(select_manifest(&idx, &m).is_none());

        // An entry without a platform is the last resort.
        let idx = index(vec![
            desc(0, None, MEDIA_TYPE_OCI_MANIFEST),
            desc(1, p("linux", "386", None), MEDIA_TYPE_OCI_MANIFEST),
        ]);
        assert_eq!(select_manifest(&idx, &m).unwrap().digest, Digest::of(&[1]));
        let idx = index(vec![desc(0, None, MEDIA_TYPE_OCI_MANIFEST)]);
        assert_eq!(select_manifest(&idx, &m).unwrap().digest, Digest::of(&[0]));
    }

    #[test]
    fn variants() {
        let arm64 = PlatformMatcher::only(&Platform::new("linux", "aarch64", None));
        assert!(arm64.matches(&Platform::new("linux", "arm64", Some("v8"))));
        assert!(arm64.matches(&Platform::new("linux", "arm", Some("v7"))));
        assert!(!arm64.matches(&Platform::new("linux", "amd64", None)));
        assert!(
            arm64.rank(&Platform::new("linux", "arm64", None))
                < arm64.rank(&Platform::new("linux", "arm", Some("v7")))
        );

        let armv6 = PlatformMatcher::only(&Platform::new("linux", "arm", Some("v6")));
        assert!(armv6.matches(&Platform::new("linux", "arm", Some("v5"))));
        assert!(!armv6.matches(&Platform::new("linux", "arm", Some("v7"))));
        assert!(!armv6.matches(&Platform::new("linux", "arm", None))); // arm = arm/v7

        let v3 = PlatformMatcher::only(&Platform::new("linux", "amd64", Some("v3")));
        assert_eq!(
            v3.rank(&Platform::new("linux", "amd64", Some("v3"))),
            Some(0)
        );
        assert_eq!(
            v3.rank(&Platform::new("linux", "amd64", Some("v2"))),
            Some(1)
        );
        assert_eq!(v3.rank(&Platform::new("linux", "amd64", None)), Some(2));
        assert_eq!(v3.rank(&Platform::new("linux", "386", None)), Some(3));
        assert_eq!(
            Platform::new("Linux", "x86_64", None)
                .normalized()
                .to_string(),
            "linux/amd64"
        );
        assert_eq!(
            Platform::new("linux", "armhf", None)
                .normalized()
                .to_string(),
            "linux/arm/v7"
        );
    }

    #[test]
    fn classification() {
        let oci = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"x","digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":0},"layers":[]}"#;
        assert_eq!(
            classify(Some("application/json"), oci).unwrap(),
            (ManifestKind::Manifest, MEDIA_TYPE_OCI_MANIFEST.into())
        );
        let bare_index = br#"{"schemaVersion":2,"manifests":[]}"#;
        assert_eq!(classify(None, bare_index).unwrap().0, ManifestKind::Index);
        assert_eq!(
            classify(
                Some(&format!("{MEDIA_TYPE_DOCKER_MANIFEST_LIST}; charset=utf-8")),
                bare_index
            )
            .unwrap(),
            (ManifestKind::Index, MEDIA_TYPE_DOCKER_MANIFEST_LIST.into())
        );
        let e = classify(
            Some(MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED),
            br#"{"schemaVersion":1,"name":"x","fsLayers":[]}"#,
        )
        .unwrap_err();
        assert!(e.contains("schema 1"), "{e}");
        let e = classify(None, b"not json").unwrap_err();
        assert!(e.contains("malformed manifest JSON"), "{e}");
        let e = classify(
            None,
            br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.artifact.manifest.v1+json"}"#,
        )
        .unwrap_err();
        assert!(e.contains("unsupported manifest media type"), "{e}");
        let e = classify(Some(MEDIA_TYPE_OCI_INDEX), oci).unwrap_err();
        assert!(e.contains("does not match"), "{e}");
        let m = parse_manifest(oci).unwrap();
        assert_eq!(m.config.size, 0);
        assert!(parse_manifest(br#"{"schemaVersion":2,"layers":[]}"#).is_err());
    }
}
