//! The registry client: resolves a reference to a manifest for this node's platform and
//! streams blobs, over the endpoints [`hosts`](super::hosts) lists (mirrors, then the
//! registry), with Basic and Bearer authentication.
//!
//! Semantics follow containerd's docker resolver and fetcher (`remotes/docker/resolver.go`,
//! `fetcher.go`, `authorizer.go`):
//! * a tag is resolved only by hosts with the `resolve` capability; a digest (and every blob
//!   and child manifest) by hosts with `pull`, in configuration order;
//! * a 404 (or `MANIFEST_UNKNOWN`/`NAME_UNKNOWN`/`BLOB_UNKNOWN`) or an error moves on to the
//!   next host; when every host failed, the first error that was not "not found" is reported,
//!   else `<ref>: not found`;
//! * a mirror (a host other than the registry) gets `?ns=<registry>`;
//! * manifests are verified against the digest asked for and `Docker-Content-Digest`;
//! * an index selects this node's platform with containerd's default matcher;
//! * Docker schema 1 is refused;
//! * redirects are followed (10 at most); `Authorization` is dropped when a redirect leaves
//!   the host (registries send blobs to object storage).
//!
//! * a blob's first request is retried on connection errors, 5xx and 429 before moving on
//!   to the next host, and a blob download that breaks off part way is resumed on the same
//!   host with a `Range` request, as containerd's fetcher does (see [`RetryPolicy`]).
//!
//! Blob contents are verified by the content store; this module only streams them.

mod auth;
mod blob;
mod client;
pub mod manifest;

pub use auth::{Challenge, Credentials, parse_www_authenticate};
pub use manifest::{Descriptor, Index, Manifest, ManifestKind, Platform, PlatformMatcher};

use super::digest::Digest;
use super::hosts::{Capabilities, HostsConfig, RegistryHost};
use super::reference::Reference;
use bytes::Bytes;
use client::{Http, RepoCtx, describe, error_of, read_limited, suffix_of};
use futures::{Stream, StreamExt};
use http::StatusCode;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// What kind of failure, for callers that map errors to gRPC codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Manifest, tag, repository or blob unknown to every host.
    NotFound,
    /// Credentials refused or missing (401/403 after authenticating, token service refusal).
    Unauthorized,
    /// Connection refused, DNS, timeout, 5xx, 429.
    Unavailable,
    /// Content did not match the digest (or size) asked for.
    DigestMismatch,
    /// Malformed JSON, schema 1, unknown media type, oversized manifest.
    InvalidManifest,
    /// The index has no manifest for this node's platform.
    NoMatchingPlatform,
    /// The reference cannot be pulled as given.
    InvalidReference,
    /// The registry host configuration (hosts.toml, CA files, credentials) is unusable.
    InvalidConfig,
}

/// A registry client failure; the message names the reference, the host and what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DistributionError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    DigestMismatch(String),
    #[error("{0}")]
    InvalidManifest(String),
    #[error("{0}")]
    NoMatchingPlatform(String),
    #[error("{0}")]
    InvalidReference(String),
    #[error("{0}")]
    InvalidConfig(String),
}

impl DistributionError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::Unauthorized(_) => ErrorKind::Unauthorized,
            Self::Unavailable(_) => ErrorKind::Unavailable,
            Self::DigestMismatch(_) => ErrorKind::DigestMismatch,
            Self::InvalidManifest(_) => ErrorKind::InvalidManifest,
            Self::NoMatchingPlatform(_) => ErrorKind::NoMatchingPlatform,
            Self::InvalidReference(_) => ErrorKind::InvalidReference,
            Self::InvalidConfig(_) => ErrorKind::InvalidConfig,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Self::NotFound(m)
            | Self::Unauthorized(m)
            | Self::Unavailable(m)
            | Self::DigestMismatch(m)
            | Self::InvalidManifest(m)
            | Self::NoMatchingPlatform(m)
            | Self::InvalidReference(m)
            | Self::InvalidConfig(m) => m,
        }
    }

    /// The same error with `ctx: ` in front of the message.
    pub fn context(self, ctx: impl std::fmt::Display) -> Self {
        self.map(|m| format!("{ctx}: {m}"))
    }

    fn map(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            Self::NotFound(m) => Self::NotFound(f(m)),
            Self::Unauthorized(m) => Self::Unauthorized(f(m)),
            Self::Unavailable(m) => Self::Unavailable(f(m)),
            Self::DigestMismatch(m) => Self::DigestMismatch(f(m)),
            Self::InvalidManifest(m) => Self::InvalidManifest(f(m)),
            Self::NoMatchingPlatform(m) => Self::NoMatchingPlatform(f(m)),
            Self::InvalidReference(m) => Self::InvalidReference(f(m)),
            Self::InvalidConfig(m) => Self::InvalidConfig(f(m)),
        }
    }
}

/// Client settings; the defaults suit a node.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The platform an index is resolved for (default: this node's, e.g. linux/amd64).
    pub platform: Platform,
    pub user_agent: String,
    /// Longest wait for the next bytes of a response (a stalled download fails after it);
    /// default 5 minutes, as containerd CRI's `image_pull_progress_timeout`. There is no
    /// limit on a whole transfer.
    pub read_timeout: Duration,
    /// Retries of blob requests and resumption of interrupted blob downloads.
    pub retry: RetryPolicy,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            platform: Platform::host(),
            user_agent: format!("nodus/{}", env!("CARGO_PKG_VERSION")),
            read_timeout: Duration::from_secs(300),
            retry: RetryPolicy::default(),
        }
    }
}

/// How blob fetches ride out flaky connections.
///
/// A blob body that fails part way (connection reset, "end of file before message length
/// reached") is resumed on the same host with `Range: bytes=<offset>-`, with the same
/// authentication, after a delay of `backoff_initial` doubling with each attempt in a row
/// that brought no new byte (at most `backoff_max`). An attempt that delivers bytes resets
/// the run: as containerd's fetcher, only attempts without progress are limited, so a
/// connection that keeps breaking after a few bytes still gets the whole blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries of a blob's first request after a connection error, 5xx or 429, before the
    /// next host is tried (default 3).
    pub request_retries: u32,
    /// The download fails after this many attempts in a row that delivered no byte
    /// (default 5).
    pub max_stalled_in_a_row: u32,
    /// ... or after this many attempts without progress in all (default 20).
    pub max_stalled_total: u32,
    /// Delay before the first retry (default 100ms).
    pub backoff_initial: Duration,
    /// Longest delay between retries (default 2s).
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            request_retries: 3,
            max_stalled_in_a_row: 5,
            max_stalled_total: 20,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
        }
    }
}

/// A fetched manifest or index: digest, media type and the exact bytes.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub digest: Digest,
    pub media_type: String,
    pub bytes: Bytes,
}

#[derive(Debug)]
struct Source {
    registry: String,
    repository: String,
    /// Hosts with the pull capability, in order: where blobs and child manifests come from.
    pull_hosts: Vec<RegistryHost>,
    creds: Credentials,
}

/// A resolved reference: what the tag (or digest) points to, the manifest for this node's
/// platform, and where to fetch its blobs.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The reference as resolved (containerd's `ParseDockerRef` form: the digest wins).
    pub reference: Reference,
    /// The registry host that answered the resolve (`host[:port]`).
    pub host: String,
    top: Fetched,
    manifest: Fetched,
    parsed: Manifest,
    platform: Option<Platform>,
    source: Arc<Source>,
}

impl Resolved {
    /// What the reference points to: the repo digest (`name@<this>`).
    pub fn top_digest(&self) -> &Digest {
        &self.top.digest
    }

    pub fn top_media_type(&self) -> &str {
        &self.top.media_type
    }

    /// The top-level manifest or index, as served.
    pub fn top(&self) -> &Fetched {
        &self.top
    }

    /// The top-level index (digest and bytes) when the reference points to an index.
    pub fn index(&self) -> Option<(&Digest, &[u8])> {
        (self.top.digest != self.manifest.digest).then(|| (&self.top.digest, &self.top.bytes[..]))
    }

    /// The platform manifest's digest and bytes.
    pub fn manifest_blob(&self) -> (&Digest, &[u8]) {
        (&self.manifest.digest, &self.manifest.bytes[..])
    }

    pub fn manifest_digest(&self) -> &Digest {
        &self.manifest.digest
    }

    pub fn manifest_media_type(&self) -> &str {
        &self.manifest.media_type
    }

    /// The parsed platform manifest: config and layer descriptors.
    pub fn manifest(&self) -> &Manifest {
        &self.parsed
    }

    /// The platform chosen from an index (`None` when the reference named a manifest).
    pub fn platform(&self) -> Option<&Platform> {
        self.platform.as_ref()
    }

    /// The endpoints blobs are fetched from, in order.
    pub fn pull_hosts(&self) -> &[RegistryHost] {
        &self.source.pull_hosts
    }

    /// The repository path inside the registry.
    pub fn repository(&self) -> &str {
        &self.source.repository
    }
}

/// A blob being downloaded. Yields the blob's bytes in order, each once, resuming on the
/// same host when the connection breaks (see [`RetryPolicy`]); errors are
/// [`DistributionError::Unavailable`] (or `NotFound`, `Unauthorized`, `DigestMismatch` when
/// a resumed request is answered so), naming the blob, the host and the cause.
pub struct BlobStream {
    /// The host serving it.
    pub host: String,
    /// `Content-Length` of the first response, when the server sent one.
    pub content_length: Option<u64>,
    inner: Pin<Box<dyn Stream<Item = Result<Bytes, DistributionError>> + Send>>,
}

impl Stream for BlobStream {
    type Item = Result<Bytes, DistributionError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for BlobStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStream")
            .field("host", &self.host)
            .field("content_length", &self.content_length)
            .finish_non_exhaustive()
    }
}

/// The registry client. Cheap to clone; shares connections, tokens and HTTP fallbacks.
#[derive(Clone)]
pub struct RegistryClient {
    hosts: HostsConfig,
    http: Arc<Http>,
}

/// Nesting of indexes followed at most.
const MAX_INDEX_DEPTH: usize = 4;

enum Attempt {
    Found(Fetched, String),
    NotFound,
}

impl RegistryClient {
    /// A client using the `certs.d` directory `hosts_dir` (none: defaults for every
    /// registry).
    pub fn new(hosts_dir: Option<&Path>) -> Result<Self, DistributionError> {
        if let Some(d) = hosts_dir
            && let Ok(m) = std::fs::metadata(d)
            && !m.is_dir()
        {
            return Err(DistributionError::InvalidConfig(format!(
                "registry config dir {} is not a directory",
                d.display()
            )));
        }
        let hosts = hosts_dir.map(HostsConfig::new).unwrap_or_default();
        Ok(Self::with_options(hosts, ClientOptions::default()))
    }

    pub fn with_options(hosts: HostsConfig, options: ClientOptions) -> Self {
        RegistryClient {
            hosts,
            http: Arc::new(Http::new(options)),
        }
    }

    pub fn hosts(&self) -> &HostsConfig {
        &self.hosts
    }

    /// Resolves `reference` to the manifest for this node's platform.
    ///
    /// Errors read like containerd's: `failed to resolve reference "<ref>": <ref>: not found`.
    pub async fn resolve(
        &self,
        reference: &Reference,
        creds: &Credentials,
    ) -> Result<Resolved, DistributionError> {
        let reference = reference.docker_ref();
        let refstr = reference.to_string();
        let ctx_msg = format!("failed to resolve reference {refstr:?}");
        let hosts = self
            .hosts
            .hosts(&reference.domain)
            .map_err(|e| DistributionError::InvalidConfig(e.to_string()).context(&ctx_msg))?;
        for h in &hosts {
            self.http.forget_fallback(&h.host);
        }
        let (object, caps) = match &reference.digest {
            Some(d) => (d.to_string(), Capabilities::PULL),
            None => (
                reference.tag_or_latest().to_string(),
                Capabilities::PULL.union(Capabilities::RESOLVE),
            ),
        };
        let source = Arc::new(Source {
            registry: reference.domain.clone(),
            repository: reference.path.clone(),
            pull_hosts: hosts
                .iter()
                .filter(|h| h.capabilities.contains(Capabilities::PULL))
                .cloned()
                .collect(),
            creds: creds.clone(),
        });
        let candidates: Vec<&RegistryHost> = hosts
            .iter()
            .filter(|h| h.capabilities.contains(caps))
            .collect();
        if candidates.is_empty() {
            return Err(DistributionError::NotFound(format!(
                "{ctx_msg}: no resolve hosts: not found"
            )));
        }
        let rctx = RepoCtx {
            registry: &source.registry,
            repository: &source.repository,
            creds,
        };
        let mut first_err: Option<DistributionError> = None;
        let mut top = None;
        for host in candidates {
            match self
                .get_manifest(host, &rctx, &object, reference.digest.as_ref())
                .await
            {
                Ok(Attempt::Found(f, url)) => {
                    tracing::debug!(reference = %refstr, host = %host.host, url = %url, digest = %f.digest, media_type = %f.media_type, "resolved");
                    top = Some((f, host.host.clone()));
                    break;
                }
                Ok(Attempt::NotFound) => {
                    tracing::info!(reference = %refstr, host = %host.host, "not found on host, trying next host");
                }
                Err(e) => {
                    tracing::warn!(reference = %refstr, host = %host.host, kind = ?e.kind(), error = %e, "resolve attempt failed, trying next host");
                    if first_err.is_none() {
                        first_err = Some(e);
                    }
                }
            }
        }
        let Some((top, answered)) = top else {
            return Err(match first_err {
                Some(e @ DistributionError::Unauthorized(_)) => e
                    .context("pull access denied, repository does not exist or may require authorization")
                    .context(&ctx_msg),
                Some(e) => e.context(&ctx_msg),
                None => DistributionError::NotFound(format!("{ctx_msg}: {refstr}: not found")),
            });
        };

        // Descend from an index to this platform's manifest.
        let matcher = PlatformMatcher::only(&self.http.options().platform);
        let mut current = top.clone();
        let mut platform = None;
        for depth in 0.. {
            let (kind, _) =
                manifest::classify(Some(&current.media_type), &current.bytes).map_err(|m| {
                    DistributionError::InvalidManifest(format!(
                        "{refstr}: manifest {}: {m}",
                        current.digest
                    ))
                })?;
            match kind {
                ManifestKind::Manifest => break,
                ManifestKind::Index => {
                    if depth >= MAX_INDEX_DEPTH {
                        return Err(DistributionError::InvalidManifest(format!(
                            "{refstr}: indexes nested more than {MAX_INDEX_DEPTH} deep"
                        )));
                    }
                    let index = manifest::parse_index(&current.bytes).map_err(|m| {
                        DistributionError::InvalidManifest(format!(
                            "{refstr}: index {}: {m}",
                            current.digest
                        ))
                    })?;
                    let Some(desc) = manifest::select_manifest(&index, &matcher) else {
                        let available: Vec<String> = index
                            .manifests
                            .iter()
                            .filter_map(|d| d.platform.as_ref().map(|p| p.to_string()))
                            .collect();
                        return Err(DistributionError::NoMatchingPlatform(format!(
                            "{refstr}: no match for platform in manifest {}: not found (want {}; the index has {})",
                            current.digest,
                            matcher.platform(),
                            if available.is_empty() {
                                "no platforms".to_string()
                            } else {
                                available.join(", ")
                            }
                        )));
                    };
                    if let Some(p) = &desc.platform {
                        platform = Some(p.clone());
                    }
                    let child = self.fetch_child(&source, &refstr, desc).await?;
                    current = child;
                }
            }
        }
        let parsed = manifest::parse_manifest(&current.bytes).map_err(|m| {
            DistributionError::InvalidManifest(format!(
                "{refstr}: manifest {}: {m}",
                current.digest
            ))
        })?;
        Ok(Resolved {
            reference,
            host: answered,
            top,
            manifest: current,
            parsed,
            platform,
            source,
        })
    }

    /// One manifest GET on one host, verified.
    async fn get_manifest(
        &self,
        host: &RegistryHost,
        rctx: &RepoCtx<'_>,
        object: &str,
        want: Option<&Digest>,
    ) -> Result<Attempt, DistributionError> {
        let (resp, url) = self
            .http
            .get(
                host,
                rctx,
                &format!("manifests/{object}"),
                manifest::ACCEPT_MANIFESTS,
            )
            .await?;
        let status = resp.status();
        if !status.is_success() {
            return status_error(resp, &url).await.map(|()| Attempt::NotFound);
        }
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let header_digest = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_limited(resp, manifest::MAX_MANIFEST_SIZE)
            .await
            .map_err(|e| {
                DistributionError::Unavailable(format!(
                    "reading manifest from {url}: {}",
                    describe(&e)
                ))
            })?
            .map_err(|n| {
                DistributionError::InvalidManifest(format!(
                    "manifest from {url} is larger than {} bytes ({n} bytes read)",
                    manifest::MAX_MANIFEST_SIZE
                ))
            })?;
        let actual = Digest::of(&body);
        if let Some(want) = want
            && &actual != want
        {
            return Err(DistributionError::DigestMismatch(format!(
                "manifest from {url}: expected digest {want}, got {actual}"
            )));
        }
        if let Some(h) = header_digest.filter(|h| !h.is_empty()) {
            // Only sha256 digests can be compared; another algorithm is not a mismatch.
            if h.starts_with("sha256:") && h != actual.to_string() {
                return Err(DistributionError::DigestMismatch(format!(
                    "manifest from {url}: Docker-Content-Digest {h} does not match the content digest {actual}"
                )));
            }
        }
        let (_, media_type) = manifest::classify(content_type.as_deref(), &body)
            .map_err(|m| DistributionError::InvalidManifest(format!("manifest from {url}: {m}")))?;
        Ok(Attempt::Found(
            Fetched {
                digest: actual,
                media_type,
                bytes: Bytes::from(body),
            },
            url,
        ))
    }

    /// A manifest an index points to, from the pull hosts in order.
    async fn fetch_child(
        &self,
        source: &Arc<Source>,
        refstr: &str,
        desc: &Descriptor,
    ) -> Result<Fetched, DistributionError> {
        let rctx = RepoCtx {
            registry: &source.registry,
            repository: &source.repository,
            creds: &source.creds,
        };
        let mut first_err = None;
        for host in &source.pull_hosts {
            match self
                .get_manifest(host, &rctx, &desc.digest.to_string(), Some(&desc.digest))
                .await
            {
                Ok(Attempt::Found(f, _)) => {
                    if !desc.media_type.is_empty()
                        && manifest::is_manifest_type(&desc.media_type)
                        && desc.media_type != f.media_type
                    {
                        tracing::debug!(reference = %refstr, digest = %desc.digest, descriptor = %desc.media_type, served = %f.media_type, "index and manifest disagree on the media type");
                    }
                    return Ok(f);
                }
                Ok(Attempt::NotFound) => {
                    tracing::info!(reference = %refstr, host = %host.host, digest = %desc.digest, "manifest not found on host, trying next host");
                }
                Err(e) => {
                    tracing::warn!(reference = %refstr, host = %host.host, digest = %desc.digest, kind = ?e.kind(), error = %e, "manifest fetch failed, trying next host");
                    first_err.get_or_insert(e);
                }
            }
        }
        let ctx = format!("{refstr}: failed to fetch manifest {}", desc.digest);
        Err(match first_err {
            Some(e) => e.context(ctx),
            None => DistributionError::NotFound(format!("{ctx}: not found")),
        })
    }

    /// Streams blob `digest` (expected `size` bytes) of a resolved image from its pull hosts
    /// in order, moving on when a host lacks it or still fails after
    /// [`RetryPolicy::request_retries`] retries; once the body flows, interruptions are
    /// resumed on that host.
    pub async fn fetch_blob(
        &self,
        resolved: &Resolved,
        digest: &Digest,
        size: u64,
    ) -> Result<BlobStream, DistributionError> {
        let source = &resolved.source;
        let refstr = resolved.reference.to_string();
        let mut first_err = None;
        for host in &source.pull_hosts {
            let req = blob::BlobRequest {
                http: Arc::clone(&self.http),
                source: Arc::clone(source),
                host: host.clone(),
                digest: digest.clone(),
                size,
            };
            match req.open().await {
                Ok(Some(stream)) => return Ok(stream),
                Ok(None) => {
                    tracing::info!(reference = %refstr, host = %host.host, digest = %digest, "blob not found on host, trying next host");
                }
                Err(e) => {
                    tracing::warn!(reference = %refstr, host = %host.host, digest = %digest, kind = ?e.kind(), error = %e, "blob fetch failed, trying next host");
                    first_err.get_or_insert(e);
                }
            }
        }
        let ctx = format!("{refstr}: failed to fetch blob {digest}");
        Err(match first_err {
            Some(e) => e.context(ctx),
            None => DistributionError::NotFound(format!(
                "{ctx}: could not fetch content {digest} from remote: not found"
            )),
        })
    }

    /// A whole small blob (e.g. an image config), verified against its digest and size.
    pub async fn fetch_blob_bytes(
        &self,
        resolved: &Resolved,
        digest: &Digest,
        size: u64,
    ) -> Result<Bytes, DistributionError> {
        const LIMIT: u64 = 64 << 20;
        if size > LIMIT {
            return Err(DistributionError::InvalidManifest(format!(
                "blob {digest} is {size} bytes, more than the {LIMIT} read into memory"
            )));
        }
        let mut stream = self.fetch_blob(resolved, digest, size).await?;
        let mut buf = Vec::with_capacity(size as usize);
        while let Some(chunk) = stream.next().await {
            buf.extend_from_slice(&chunk?);
            if buf.len() as u64 > size {
                break;
            }
        }
        let actual = Digest::of(&buf);
        if buf.len() as u64 != size || &actual != digest {
            return Err(DistributionError::DigestMismatch(format!(
                "blob {digest} from {}: got {} bytes with digest {actual}, expected {size} bytes",
                stream.host,
                buf.len()
            )));
        }
        Ok(Bytes::from(buf))
    }
}

/// Classifies a non-2xx response: `Ok(())` means "not found here" (try the next host).
async fn status_error(resp: reqwest::Response, url: &str) -> Result<(), DistributionError> {
    let (status, body) = error_of(resp).await;
    if status == StatusCode::NOT_FOUND
        || body.has_code(&["MANIFEST_UNKNOWN", "NAME_UNKNOWN", "BLOB_UNKNOWN"])
    {
        return Ok(());
    }
    let msg = format!(
        "unexpected status from GET request to {url}: {status}{}",
        suffix_of(&body)
    );
    Err(
        if status == StatusCode::UNAUTHORIZED
            || status == StatusCode::FORBIDDEN
            || body.has_code(&["DENIED", "UNAUTHORIZED"])
        {
            DistributionError::Unauthorized(msg)
        } else {
            DistributionError::Unavailable(msg)
        },
    )
}

#[cfg(test)]
mod tests;
