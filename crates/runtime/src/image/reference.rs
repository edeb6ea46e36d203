//! Image references, parsed and normalised exactly as the kubelet and containerd's CRI do it:
//! `reference.ParseNormalizedNamed` followed by `TagNameOnly` (distribution/reference).
//!
//! * `busybox` → `docker.io/library/busybox:latest`
//! * `user/img` → `docker.io/user/img:latest`
//! * `localhost:5000/x` → `localhost:5000/x:latest`
//! * `name@sha256:…` stays digest-only; `name:tag@sha256:…` keeps both (see
//!   [`Reference::docker_ref`] for containerd's `ParseDockerRef`, where the digest wins).
//!
//! The first path component is a registry domain when it contains `.` or `:`, is
//! `localhost`, or contains an uppercase letter (upstream's `splitDockerDomain`); otherwise the
//! name lives on Docker Hub. Error messages are upstream's, word for word.

use super::digest::Digest;
use std::fmt;
use std::str::FromStr;

/// Docker Hub's canonical domain in normalised names.
pub const DEFAULT_DOMAIN: &str = "docker.io";
/// The historical name of Docker Hub, normalised to [`DEFAULT_DOMAIN`].
pub const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
/// Namespace of Docker Hub's official images.
pub const OFFICIAL_REPO_PREFIX: &str = "library/";
/// Tag given to a reference that has neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";
/// Maximum length of a repository name (domain + path), upstream's `NameTotalLengthMax`.
pub const NAME_TOTAL_LENGTH_MAX: usize = 255;

/// Why a reference string was refused. The `Display` texts are upstream's messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// `ErrReferenceInvalidFormat`.
    #[error("invalid reference format")]
    InvalidFormat,
    /// `ParseNormalizedNamed`'s check of the repository path (containerd 1.7's wording).
    #[error("invalid reference format: repository name must be lowercase")]
    NotLowercase,
    /// `ErrNameContainsUppercase`, from the grammar check.
    #[error("repository name must be lowercase")]
    NameContainsUppercase,
    /// `ErrNameEmpty`.
    #[error("repository name must have at least one component")]
    NameEmpty,
    /// `ErrNameTooLong`.
    #[error("repository name must not be more than 255 characters")]
    NameTooLong,
    /// A bare 64-hex string is an image ID, never a repository name.
    #[error("invalid repository name ({0}), cannot specify 64-byte hexadecimal strings")]
    HexIdentifier(String),
    /// `ErrTagInvalidFormat`.
    #[error("invalid tag format")]
    InvalidTag,
    /// go-digest's `ErrDigestInvalidFormat`.
    #[error("invalid checksum digest format")]
    DigestInvalidFormat,
    /// go-digest's `ErrDigestInvalidLength`.
    #[error("invalid checksum digest length")]
    DigestInvalidLength,
    /// go-digest's `ErrDigestUnsupported` (nodus verifies sha256 only).
    #[error("unsupported digest algorithm")]
    DigestUnsupported,
}

/// A normalised image reference: `domain/path[:tag][@digest]`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference {
    /// Registry host, e.g. `docker.io`, `registry.k8s.io`, `127.0.0.1:5000`.
    pub domain: String,
    /// Repository path inside the registry, e.g. `library/busybox`.
    pub path: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl Reference {
    /// `ParseNormalizedNamed` + `TagNameOnly`: what the kubelet and containerd's CRI store
    /// and compare. A reference without tag and digest gets `:latest`.
    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        let mut r = Self::parse_normalized_named(s)?;
        if r.tag.is_none() && r.digest.is_none() {
            r.tag = Some(DEFAULT_TAG.to_string());
        }
        Ok(r)
    }

    /// Same as [`Reference::parse`] (the name the manager uses).
    pub fn parse_normalized(s: &str) -> Result<Self, ReferenceError> {
        Self::parse(s)
    }

    /// `ParseNormalizedNamed` alone: normalises the domain and the `library/` prefix but adds
    /// no default tag.
    pub fn parse_normalized_named(s: &str) -> Result<Self, ReferenceError> {
        if is_hex_identifier(s) {
            return Err(ReferenceError::HexIdentifier(s.to_string()));
        }
        let (domain, remainder) = split_docker_domain(s);
        let remote = match remainder.find(':') {
            Some(i) => &remainder[..i],
            None => &remainder[..],
        };
        if remote.to_lowercase() != remote {
            return Err(ReferenceError::NotLowercase);
        }
        let parsed = parse_grammar(&format!("{domain}/{remainder}"))?;
        Ok(Reference {
            domain,
            path: parsed.path,
            tag: parsed.tag,
            digest: parsed.digest,
        })
    }

    /// The repository name, `docker.io/library/busybox`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// The tag, or `latest` when there is none.
    pub fn tag_or_latest(&self) -> &str {
        self.tag.as_deref().unwrap_or(DEFAULT_TAG)
    }

    /// What a registry is asked for under `/manifests/`: the digest when there is one (it is
    /// what containerd resolves for `name:tag@digest`), else the tag (or `latest`).
    pub fn object(&self) -> String {
        match &self.digest {
            Some(d) => d.to_string(),
            None => self.tag_or_latest().to_string(),
        }
    }

    /// The repo digest of this repository for `digest`, as CRI reports it:
    /// `docker.io/library/busybox@sha256:…` (no tag).
    pub fn with_digest(&self, digest: &Digest) -> String {
        self.digested(digest).to_string()
    }

    /// This repository at `digest`: `name@sha256:…` (no tag).
    pub fn digested(&self, digest: &Digest) -> Reference {
        Reference {
            domain: self.domain.clone(),
            path: self.path.clone(),
            tag: None,
            digest: Some(digest.clone()),
        }
    }

    /// A repo tag for this repository: `name:tag` (no digest).
    pub fn with_tag(&self, tag: &str) -> Result<Reference, ReferenceError> {
        if !is_tag(tag) {
            return Err(ReferenceError::InvalidTag);
        }
        Ok(Reference {
            domain: self.domain.clone(),
            path: self.path.clone(),
            tag: Some(tag.to_string()),
            digest: None,
        })
    }

    /// containerd's `ParseDockerRef` on top of [`Reference::parse`]: a reference with both a
    /// tag and a digest keeps only the digest.
    pub fn docker_ref(&self) -> Reference {
        let mut r = self.clone();
        if r.digest.is_some() {
            r.tag = None;
        } else if r.tag.is_none() {
            r.tag = Some(DEFAULT_TAG.to_string());
        }
        r
    }

    /// The familiar name shown by docker: `busybox` for `docker.io/library/busybox`,
    /// `user/img` for `docker.io/user/img`, unchanged for other registries.
    pub fn familiar_name(&self) -> String {
        if self.domain == DEFAULT_DOMAIN {
            if let Some(rest) = self.path.strip_prefix(OFFICIAL_REPO_PREFIX)
                && !rest.contains('/')
            {
                return rest.to_string();
            }
            return self.path.clone();
        }
        self.name()
    }

    /// `FamiliarString`: the familiar name with the tag and digest.
    pub fn familiar(&self) -> String {
        let mut s = self.familiar_name();
        push_suffix(&mut s, self);
        s
    }
}

fn push_suffix(s: &mut String, r: &Reference) {
    if let Some(t) = &r.tag {
        s.push(':');
        s.push_str(t);
    }
    if let Some(d) = &r.digest {
        s.push('@');
        s.push_str(&d.to_string());
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = self.name();
        push_suffix(&mut s, self);
        f.write_str(&s)
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reference({self})")
    }
}

impl FromStr for Reference {
    type Err = ReferenceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl serde::Serialize for Reference {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Reference {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse_normalized_named(&s).map_err(serde::de::Error::custom)
    }
}

/// Whether `s` addresses an image by ID rather than by name: a bare 64-hex string or
/// `sha256:<64 hex>` (CRI clients pass image IDs where references are expected). Returns the
/// ID as a digest.
pub fn looks_like_image_id(s: &str) -> Option<Digest> {
    if is_hex_identifier(s) {
        return Digest::from_hex(s).ok();
    }
    match s.strip_prefix("sha256:") {
        Some(hex) if is_hex_identifier(hex) => Digest::from_hex(hex).ok(),
        _ => None,
    }
}

/// `^[a-f0-9]{64}$`.
fn is_hex_identifier(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// upstream `splitDockerDomain`: the domain (normalised) and the remainder (`library/`
/// prefixed for official images).
fn split_docker_domain(name: &str) -> (String, String) {
    let (domain, mut remainder) = match name.split_once('/') {
        None => {
            return (
                DEFAULT_DOMAIN.into(),
                format!("{OFFICIAL_REPO_PREFIX}{name}"),
            );
        }
        Some((first, rest)) => {
            if first == "localhost" || first.contains(['.', ':']) || first.to_lowercase() != first {
                let d = if first == LEGACY_DEFAULT_DOMAIN {
                    DEFAULT_DOMAIN
                } else {
                    first
                };
                (d.to_string(), rest.to_string())
            } else {
                (DEFAULT_DOMAIN.to_string(), name.to_string())
            }
        }
    };
    if domain == DEFAULT_DOMAIN && !remainder.contains('/') {
        remainder = format!("{OFFICIAL_REPO_PREFIX}{remainder}");
    }
    (domain, remainder)
}

struct Parsed {
    path: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

/// upstream `Parse` (the `ReferenceRegexp` grammar) on a string that starts with a domain.
fn parse_grammar(s: &str) -> Result<Parsed, ReferenceError> {
    if s.is_empty() {
        return Err(ReferenceError::NameEmpty);
    }
    let Some((name, tag, digest)) = match_reference(s) else {
        let lower = s.to_lowercase();
        if lower != s && match_reference(&lower).is_some() {
            return Err(ReferenceError::NameContainsUppercase);
        }
        return Err(ReferenceError::InvalidFormat);
    };
    if name.len() > NAME_TOTAL_LENGTH_MAX {
        return Err(ReferenceError::NameTooLong);
    }
    // The caller always puts a domain first; the path is everything after it.
    let path = match name.split_once('/') {
        Some((_, p)) => p.to_string(),
        None => return Err(ReferenceError::InvalidFormat),
    };
    let digest = match digest {
        Some(d) => Some(parse_digest(d)?),
        None => None,
    };
    Ok(Parsed {
        path,
        tag: tag.map(str::to_string),
        digest,
    })
}

/// Matches `^(name)(?::(tag))?(?:@(digest))?$`; returns the captures.
fn match_reference(s: &str) -> Option<(&str, Option<&str>, Option<&str>)> {
    let (left, digest) = match s.split_once('@') {
        Some((l, d)) => {
            if !is_digest_pattern(d) {
                return None;
            }
            (l, Some(d))
        }
        None => (s, None),
    };
    // A tag can hold neither '/' nor ':', and a name holds ':' only in its domain, so a
    // ':' after the last '/' is necessarily the tag separator.
    let last_slash = left.rfind('/');
    let (name, tag) = match left.rfind(':') {
        Some(i) if last_slash.is_none_or(|sl| i > sl) => (&left[..i], Some(&left[i + 1..])),
        _ => (left, None),
    };
    if let Some(t) = tag
        && !is_tag(t)
    {
        return None;
    }
    if !is_name(name) {
        return None;
    }
    Some((name, tag, digest))
}

/// `(?:domainAndPort/)?remoteName`.
fn is_name(s: &str) -> bool {
    if let Some((first, rest)) = s.split_once('/')
        && is_domain_and_port(first)
        && is_remote_name(rest)
    {
        return true;
    }
    is_remote_name(s)
}

/// `pathComponent(?:/pathComponent)*`.
fn is_remote_name(s: &str) -> bool {
    !s.is_empty() && s.split('/').all(is_path_component)
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`.
fn is_path_component(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let mut i = 0;
    loop {
        // An alphanumeric run.
        let start = i;
        while i < b.len() && alnum(b[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == b.len() {
            return true;
        }
        // A separator.
        match b[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < b.len() && b[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < b.len() && b[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
    }
}

/// `host(?::[0-9]+)?` where host is a domain name or a bracketed IPv6 address.
fn is_domain_and_port(s: &str) -> bool {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return false;
        };
        let addr = &rest[..end];
        if addr.is_empty() || !addr.bytes().all(|c| c.is_ascii_hexdigit() || c == b':') {
            return false;
        }
        let after = &rest[end + 1..];
        match after.strip_prefix(':') {
            Some(p) => (None, Some(p)),
            None if after.is_empty() => (None, None),
            None => return false,
        }
    } else {
        match s.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(s), None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit()))
    {
        return false;
    }
    match host {
        None => true,
        Some(h) => !h.is_empty() && h.split('.').all(is_domain_component),
    }
}

/// `[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]`.
fn is_domain_component(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

/// `[\w][\w.-]{0,127}`.
fn is_tag(s: &str) -> bool {
    let b = s.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b[1..].iter().all(|c| word(*c) || *c == b'.' || *c == b'-')
}

/// `[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[[:xdigit:]]{32,}`.
fn is_digest_pattern(s: &str) -> bool {
    let Some((alg, hex)) = s.split_once(':') else {
        return false;
    };
    if hex.len() < 32 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return false;
    }
    let mut expect_alpha = true;
    for c in alg.bytes() {
        if expect_alpha {
            if !c.is_ascii_alphabetic() {
                return false;
            }
            expect_alpha = false;
        } else if b"-_+.".contains(&c) {
            expect_alpha = true;
        } else if !c.is_ascii_alphanumeric() {
            return false;
        }
    }
    !expect_alpha
}

/// go-digest's `Parse` on a string that already matched the digest pattern.
fn parse_digest(s: &str) -> Result<Digest, ReferenceError> {
    let (alg, hex) = s
        .split_once(':')
        .ok_or(ReferenceError::DigestInvalidFormat)?;
    if alg != "sha256" {
        return Err(ReferenceError::DigestUnsupported);
    }
    if hex.len() != 64 {
        return Err(ReferenceError::DigestInvalidLength);
    }
    Digest::from_hex(hex).map_err(|_| ReferenceError::DigestInvalidFormat)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn norm(s: &str) -> String {
        Reference::parse(s)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .to_string()
    }

    #[test]
    fn normalises_like_upstream() {
        let table = [
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("user/img", "docker.io/user/img:latest"),
            ("docker.io/busybox", "docker.io/library/busybox:latest"),
            (
                "index.docker.io/busybox",
                "docker.io/library/busybox:latest",
            ),
            ("index.docker.io/user/img:v1", "docker.io/user/img:v1"),
            ("library/busybox", "docker.io/library/busybox:latest"),
            ("localhost/x", "localhost/x:latest"),
            ("localhost:5000/x", "localhost:5000/x:latest"),
            ("127.0.0.1:5000/a/b:tag", "127.0.0.1:5000/a/b:tag"),
            ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
            ("[::1]:5000/x", "[::1]:5000/x:latest"),
            ("a/b/c/d", "docker.io/a/b/c/d:latest"),
            ("foo_bar/x-y.z__w", "docker.io/foo_bar/x-y.z__w:latest"),
            ("a--b/c", "docker.io/a--b/c:latest"),
            ("Foo/bar", "Foo/bar:latest"),
            (
                "busybox:Latest_1.0-x",
                "docker.io/library/busybox:Latest_1.0-x",
            ),
        ];
        for (input, want) in table {
            assert_eq!(norm(input), want, "{input}");
        }
    }

    #[test]
    fn digests() {
        let r = Reference::parse(&format!("busybox@{D}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.to_string(), format!("docker.io/library/busybox@{D}"));
        assert_eq!(r.object(), D);

        let r = Reference::parse(&format!("127.0.0.1:5000/x:v1@{D}")).unwrap();
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(r.to_string(), format!("127.0.0.1:5000/x:v1@{D}"));
        assert_eq!(r.object(), D);
        assert_eq!(r.docker_ref().to_string(), format!("127.0.0.1:5000/x@{D}"));

        let r = Reference::parse("busybox:1.36").unwrap();
        assert_eq!(r.object(), "1.36");
        let d: Digest = D.parse().unwrap();
        assert_eq!(r.with_digest(&d), format!("docker.io/library/busybox@{D}"));
    }

    #[test]
    fn parts() {
        let r = Reference::parse("busybox").unwrap();
        assert_eq!(r.domain, "docker.io");
        assert_eq!(r.path, "library/busybox");
        assert_eq!(r.name(), "docker.io/library/busybox");
        assert_eq!(r.tag_or_latest(), "latest");
        assert_eq!(r.familiar(), "busybox:latest");
        assert_eq!(
            Reference::parse("user/img:v1").unwrap().familiar(),
            "user/img:v1"
        );
        assert_eq!(
            Reference::parse("localhost:5000/x").unwrap().familiar(),
            "localhost:5000/x:latest"
        );
        let r = Reference::parse_normalized_named("busybox").unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(
            r.docker_ref().to_string(),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            r.with_tag("v2").unwrap().to_string(),
            "docker.io/library/busybox:v2"
        );
        assert_eq!(r.with_tag("-bad"), Err(ReferenceError::InvalidTag));
    }

    #[test]
    fn errors_match_upstream() {
        let hex = "a".repeat(64);
        let long = format!("x/{}", "a".repeat(260));
        let table: Vec<(String, &str)> = vec![
            ("".into(), "invalid reference format"),
            (
                "Busybox".into(),
                "invalid reference format: repository name must be lowercase",
            ),
            (
                "user/Img".into(),
                "invalid reference format: repository name must be lowercase",
            ),
            (
                "localhost:5000/Foo:tag".into(),
                "invalid reference format: repository name must be lowercase",
            ),
            (
                hex.clone(),
                "invalid repository name (aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa), cannot specify 64-byte hexadecimal strings",
            ),
            ("busybox:".into(), "invalid reference format"),
            ("busybox:-x".into(), "invalid reference format"),
            ("busybox:a/b".into(), "invalid reference format"),
            ("bu$ybox".into(), "invalid reference format"),
            ("a//b".into(), "invalid reference format"),
            ("a/b/".into(), "invalid reference format"),
            ("-a/b".into(), "invalid reference format"),
            ("a_/b".into(), "invalid reference format"),
            ("a___b/c".into(), "invalid reference format"),
            ("localhost:port/x".into(), "invalid reference format"),
            ("busybox@sha256:abc".into(), "invalid reference format"),
            (
                format!("busybox:{}", "t".repeat(129)),
                "invalid reference format",
            ),
            (long, "repository name must not be more than 255 characters"),
            (
                format!("busybox@sha256:{}", "A".repeat(64)),
                "invalid checksum digest format",
            ),
            (
                format!("busybox@sha256:{}", "a".repeat(40)),
                "invalid checksum digest length",
            ),
            (
                format!("busybox@sha512:{}", "a".repeat(128)),
                "unsupported digest algorithm",
            ),
        ];
        for (input, want) in table {
            match Reference::parse(&input) {
                Ok(r) => panic!("{input:?} parsed as {r}"),
                Err(e) => assert_eq!(e.to_string(), want, "{input:?}"),
            }
        }
    }

    #[test]
    fn image_ids() {
        let hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(looks_like_image_id(hex).unwrap().hex(), hex);
        assert_eq!(
            looks_like_image_id(&format!("sha256:{hex}")).unwrap().hex(),
            hex
        );
        assert!(looks_like_image_id("busybox").is_none());
        assert!(looks_like_image_id(&hex[..12]).is_none());
        assert!(looks_like_image_id(&hex.to_uppercase()).is_none());
    }

    #[test]
    fn serde_round_trip() {
        let r = Reference::parse("busybox").unwrap();
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(j, "\"docker.io/library/busybox:latest\"");
        let back: Reference = serde_json::from_str(&j).unwrap();
        assert_eq!(back, r);
    }
}
