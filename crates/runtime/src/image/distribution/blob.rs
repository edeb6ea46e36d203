//! Blob downloads that survive dropped connections.
//!
//! As containerd's fetcher (`remotes/docker/httpreadseeker.go`), a body that fails part way
//! (or ends before its announced length) is resumed on the same host with
//! `Range: bytes=<offset>-`: a 206 continues from there (its `Content-Range` must start at
//! the offset), a 200 (the server ignored the range) is read from the start with the bytes
//! already delivered skipped. The consumer thus sees the blob's bytes exactly once, in
//! order; it verifies digest and size itself.
//!
//! A read timeout is not resumed: a stalled download fails after
//! [`ClientOptions::read_timeout`](super::ClientOptions::read_timeout), as the doc there says.

use super::client::{Http, RepoCtx, describe, error_of, suffix_of};
use super::{BlobStream, DistributionError, RetryPolicy, Source, status_error};
use crate::image::digest::Digest;
use crate::image::hosts::RegistryHost;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::StatusCode;
use reqwest::header::{CONTENT_RANGE, HeaderMap, HeaderValue, RANGE};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

type Body = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// One blob on one host: what every (re)request needs.
pub(super) struct BlobRequest {
    pub http: Arc<Http>,
    pub source: Arc<Source>,
    pub host: RegistryHost,
    pub digest: Digest,
    pub size: u64,
}

/// A response being read.
struct Opened {
    body: Body,
    /// Bytes at the start of `body` the consumer already has (a 200 to a Range request).
    skip: u64,
    /// Where `body` ends in the blob, when the response says.
    end: Option<u64>,
    content_length: Option<u64>,
}

/// Why a request gave no body.
enum Failure {
    /// Connection error, 5xx, 429: worth another try.
    Transient(DistributionError),
    /// Anything else: give up on this host.
    Fatal(DistributionError),
}

impl Failure {
    fn into_error(self) -> DistributionError {
        match self {
            Failure::Transient(e) | Failure::Fatal(e) => e,
        }
    }
}

/// The delay before retry number `n` (1-based) of a run without progress.
fn backoff(policy: &RetryPolicy, n: u32) -> Duration {
    let factor = 1u32
        .checked_shl(n.saturating_sub(1).min(16))
        .unwrap_or(u32::MAX);
    policy
        .backoff_initial
        .saturating_mul(factor)
        .min(policy.backoff_max)
}

/// `Content-Range: bytes <start>-<end>/<total|*>` → (start, end inclusive, total).
fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let (start, end) = range.trim().split_once('-')?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    Some((start.trim().parse().ok()?, end.trim().parse().ok()?, total))
}

impl BlobRequest {
    fn what(&self) -> String {
        format!("blob {} from {}", self.digest, self.host.host)
    }

    /// The first request, retried on connection errors, 5xx and 429 (`request_retries`
    /// times); `Ok(None)`: the host does not have the blob.
    pub async fn open(self) -> Result<Option<BlobStream>, DistributionError> {
        let policy = self.http.options().retry.clone();
        let mut retry = 0;
        let opened = loop {
            match self.request(0).await {
                Ok(Some(o)) => break o,
                Ok(None) => return Ok(None),
                Err(Failure::Transient(e)) if retry < policy.request_retries => {
                    retry += 1;
                    let delay = backoff(&policy, retry);
                    tracing::warn!(
                        digest = %self.digest,
                        host = %self.host.host,
                        attempt = retry,
                        delay_ms = delay.as_millis() as u64,
                        error = %e,
                        "blob request failed, retrying"
                    );
                    tokio::time::sleep(delay).await;
                }
                Err(f) => return Err(f.into_error()),
            }
        };
        let host = self.host.host.clone();
        let content_length = opened.content_length;
        let state = Resuming {
            req: self,
            policy,
            current: Some(opened),
            offset: 0,
            attempt_start: 0,
            stalled_in_a_row: 0,
            stalled_total: 0,
            resumes: 0,
            done: false,
        };
        let inner = futures::stream::unfold(state, |mut st| async move {
            let item = st.next().await?;
            Some((item, st))
        });
        Ok(Some(BlobStream {
            host,
            content_length,
            inner: Box::pin(inner),
        }))
    }

    /// One GET of the blob from `offset` on (no `Range` at 0), with authentication.
    async fn request(&self, offset: u64) -> Result<Option<Opened>, Failure> {
        let rctx = RepoCtx {
            registry: &self.source.registry,
            repository: &self.source.repository,
            creds: &self.source.creds,
        };
        let mut extra = HeaderMap::new();
        if offset > 0 {
            let v = HeaderValue::from_str(&format!("bytes={offset}-"))
                .expect("a byte range is a valid header value");
            extra.insert(RANGE, v);
        }
        let what = self.what();
        let (resp, url) = self
            .http
            .get_with(
                &self.host,
                &rctx,
                &format!("blobs/{}", self.digest),
                "*/*",
                &extra,
            )
            .await
            .map_err(|e| match e {
                DistributionError::Unavailable(_) => Failure::Transient(e),
                e => Failure::Fatal(e),
            })?;
        let status = resp.status();
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            let (status, body) = error_of(resp).await;
            return Err(Failure::Transient(DistributionError::Unavailable(format!(
                "unexpected status from GET request to {url}: {status}{}",
                suffix_of(&body)
            ))));
        }
        if !status.is_success() {
            return match status_error(resp, &url).await {
                Ok(()) if offset == 0 => Ok(None),
                // Gone while being downloaded: not a reason to try another host mid-stream.
                Ok(()) => Err(Failure::Fatal(DistributionError::NotFound(format!(
                    "{what}: not found when resuming at offset {offset}"
                )))),
                Err(e) => Err(Failure::Fatal(e)),
            };
        }
        let content_length = resp.content_length();
        let (skip, end) = if status == StatusCode::PARTIAL_CONTENT {
            let header = resp
                .headers()
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let Some((start, last, total)) = parse_content_range(&header) else {
                return Err(Failure::Fatal(DistributionError::Unavailable(format!(
                    "{what}: 206 response to GET {url} with invalid Content-Range {header:?}"
                ))));
            };
            if start != offset {
                return Err(Failure::Fatal(DistributionError::Unavailable(format!(
                    "{what}: asked for bytes from offset {offset}, got Content-Range {header:?}"
                ))));
            }
            if let Some(t) = total
                && t != self.size
            {
                return Err(Failure::Fatal(DistributionError::DigestMismatch(format!(
                    "{what}: Content-Range {header:?} does not match the expected size {}",
                    self.size
                ))));
            }
            (0, Some(last.saturating_add(1)))
        } else {
            if let Some(n) = content_length
                && n != self.size
            {
                return Err(Failure::Fatal(DistributionError::DigestMismatch(format!(
                    "blob {} from {url}: Content-Length {n} does not match the expected size {}",
                    self.digest, self.size
                ))));
            }
            (offset, content_length)
        };
        Ok(Some(Opened {
            body: Box::pin(resp.bytes_stream()),
            skip,
            end,
            content_length,
        }))
    }
}

/// The state of a [`BlobStream`].
struct Resuming {
    req: BlobRequest,
    policy: RetryPolicy,
    current: Option<Opened>,
    /// Bytes delivered to the consumer.
    offset: u64,
    /// `offset` when the current response was requested.
    attempt_start: u64,
    stalled_in_a_row: u32,
    stalled_total: u32,
    resumes: u32,
    done: bool,
}

impl Resuming {
    async fn next(&mut self) -> Option<Result<Bytes, DistributionError>> {
        loop {
            if self.done {
                return None;
            }
            let Some(cur) = self.current.as_mut() else {
                // Only between a failed resume and the end of the stream.
                self.done = true;
                return None;
            };
            let cause = match cur.body.next().await {
                Some(Ok(mut chunk)) => {
                    if cur.skip > 0 {
                        let n = cur.skip.min(chunk.len() as u64);
                        cur.skip -= n;
                        chunk = chunk.slice(n as usize..);
                    }
                    if chunk.is_empty() {
                        continue;
                    }
                    self.offset += chunk.len() as u64;
                    return Some(Ok(chunk));
                }
                Some(Err(e)) if e.is_timeout() => {
                    return Some(Err(self.fail(DistributionError::Unavailable(format!(
                        "reading {}: {}",
                        self.req.what(),
                        describe(&e)
                    )))));
                }
                Some(Err(e)) => describe(&e),
                // Where the body ended in the blob: the skipped bytes were never delivered.
                None => match cur.end {
                    Some(end) if self.offset - cur.skip < end => format!(
                        "connection closed after {} of {end} bytes",
                        self.offset - cur.skip
                    ),
                    _ => {
                        self.done = true;
                        return None;
                    }
                },
            };
            self.current = None;
            if let Err(e) = self.resume(cause).await {
                return Some(Err(self.fail(e)));
            }
        }
    }

    fn fail(&mut self, e: DistributionError) -> DistributionError {
        self.done = true;
        self.current = None;
        e
    }

    /// Re-requests the rest of the blob after the current attempt failed with `cause`.
    async fn resume(&mut self, mut cause: String) -> Result<(), DistributionError> {
        loop {
            if self.offset > self.attempt_start {
                self.stalled_in_a_row = 0;
            } else {
                self.stalled_in_a_row += 1;
                self.stalled_total += 1;
            }
            let p = &self.policy;
            if self.stalled_in_a_row >= p.max_stalled_in_a_row
                || self.stalled_total >= p.max_stalled_total
            {
                return Err(DistributionError::Unavailable(format!(
                    "reading {}: {cause} (gave up at offset {} of {} after {} resume attempts, {} in a row without progress)",
                    self.req.what(),
                    self.offset,
                    self.req.size,
                    self.resumes,
                    self.stalled_in_a_row
                )));
            }
            self.resumes += 1;
            let delay = backoff(p, self.stalled_in_a_row.max(1));
            tracing::warn!(
                digest = %self.req.digest,
                host = %self.req.host.host,
                offset = self.offset,
                attempt = self.resumes,
                error = %cause,
                "blob download interrupted, resuming with a Range request"
            );
            tokio::time::sleep(delay).await;
            self.attempt_start = self.offset;
            match self.req.request(self.offset).await {
                Ok(Some(o)) => {
                    self.current = Some(o);
                    return Ok(());
                }
                Ok(None) => {
                    return Err(DistributionError::NotFound(format!(
                        "{}: not found when resuming at offset 0",
                        self.req.what()
                    )));
                }
                Err(Failure::Transient(e)) => cause = e.to_string(),
                Err(Failure::Fatal(e)) => {
                    return Err(e.context(format!(
                        "resuming {} at offset {}",
                        self.req.what(),
                        self.offset
                    )));
                }
            }
        }
    }
}
