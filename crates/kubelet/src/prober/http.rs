//! The httpGet handler for probes and lifecycle hooks (upstream's `pkg/probe/http`):
//! GET `scheme://host:port/path` with the action's headers, `User-Agent: kube-probe/1.33`
//! (`kube-lifecycle/1.33` for hooks), certificates not verified, redirects followed only
//! on the same host, at most 10 KiB of body read; 200–399 is success.

use super::handler::{
    HandlerResult, Outcome, go_dial_error, join_host_port, resolve_container_port,
};
use k8s_openapi::api::core::v1::{Container, HTTPGetAction};
use reqwest::header::{ACCEPT, HeaderMap, HeaderName, HeaderValue, USER_AGENT};
use std::time::Duration;

/// Upstream reads at most this much of a probe response body.
pub const MAX_RESPONSE_BODY: usize = 10 << 10;

/// The Kubernetes minor version this kubelet reports in `User-Agent`.
pub const KUBE_VERSION: &str = "1.33";

/// Who is asking: decides the `User-Agent` (`kube-probe/…` or `kube-lifecycle/…`).
#[derive(Clone, Copy, Debug)]
pub enum Purpose {
    Probe,
    Lifecycle,
}

impl Purpose {
    fn user_agent(self) -> String {
        match self {
            Purpose::Probe => format!("kube-probe/{KUBE_VERSION}"),
            Purpose::Lifecycle => format!("kube-lifecycle/{KUBE_VERSION}"),
        }
    }
}

/// A GET request built from an `HTTPGetAction`.
#[derive(Clone, Debug)]
pub struct ProbeRequest {
    pub url: String,
    pub headers: HeaderMap,
}

/// Upstream's `NewRequestForHTTPGetAction`: scheme defaults to http, host to the pod IP,
/// the port may name a container port, `User-Agent` and `Accept: */*` unless given (an
/// empty `Accept` removes the header).
pub fn build_request(
    action: &HTTPGetAction,
    container: &Container,
    pod_ip: &str,
    purpose: Purpose,
) -> Result<ProbeRequest, String> {
    let scheme = action
        .scheme
        .as_deref()
        .unwrap_or("http")
        .to_ascii_lowercase();
    let scheme = if scheme.is_empty() {
        "http".to_string()
    } else {
        scheme
    };
    let host = match action.host.as_deref() {
        Some(h) if !h.is_empty() => h,
        _ => pod_ip,
    };
    if host.is_empty() {
        return Err("no host to probe: the pod has no IP yet".to_string());
    }
    let port = resolve_container_port(&action.port, container)?;
    let path = action.path.as_deref().unwrap_or_default();
    let path = if path.starts_with('/') || path.is_empty() {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let url = format!("{scheme}://{}{path}", join_host_port(host, port));
    reqwest::Url::parse(&url).map_err(|e| format!("parse {url:?}: {e}"))?;

    let mut headers = HeaderMap::new();
    for h in action.http_headers.iter().flatten() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|e| format!("invalid header name {:?}: {e}", h.name))?;
        let value = HeaderValue::from_str(&h.value)
            .map_err(|e| format!("invalid value for header {:?}: {e}", h.name))?;
        headers.append(name, value);
    }
    if !headers.contains_key(USER_AGENT) {
        headers.insert(
            USER_AGENT,
            HeaderValue::from_str(&purpose.user_agent()).map_err(|e| e.to_string())?,
        );
    }
    match headers.get(ACCEPT) {
        None => {
            headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        }
        Some(v) if v.is_empty() => {
            // Upstream then sends no Accept at all; the HTTP client puts `*/*` back, which
            // RFC 9110 defines as meaning the same as no Accept header.
            headers.remove(ACCEPT);
        }
        Some(_) => {}
    }
    Ok(ProbeRequest { url, headers })
}

/// A shared HTTP client for probes and hooks. Cheap to clone.
#[derive(Clone)]
pub struct HttpProber {
    client: reqwest::Client,
}

impl HttpProber {
    pub fn new() -> Result<HttpProber, reqwest::Error> {
        let policy = reqwest::redirect::Policy::custom(|attempt| {
            let first_host = attempt
                .previous()
                .first()
                .and_then(|u| u.host_str())
                .map(str::to_string);
            if attempt.url().host_str().map(str::to_string) != first_host {
                // Upstream hands back the redirect itself: a warning, not a failure.
                attempt.stop()
            } else if attempt.previous().len() >= 10 {
                attempt.error("stopped after 10 redirects")
            } else {
                attempt.follow()
            }
        });
        let client = reqwest::Client::builder()
            .redirect(policy)
            .danger_accept_invalid_certs(true)
            // Probes go straight to the pod, never through HTTP(S)_PROXY (upstream sets a
            // nil proxy on the probe transport).
            .no_proxy()
            // Upstream disables keep-alive: each probe opens its own connection.
            .pool_max_idle_per_host(0)
            .build()?;
        Ok(HttpProber { client })
    }

    /// Runs one GET and classifies it as upstream's `DoHTTPProbe`. Transport errors and
    /// timeouts are failures with Go-shaped text; an error reading the body is an error.
    pub async fn probe(
        &self,
        req: &ProbeRequest,
        timeout: Duration,
    ) -> Result<HandlerResult, String> {
        let resp = match self
            .client
            .get(&req.url)
            .headers(req.headers.clone())
            .timeout(timeout)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                return Ok(HandlerResult::new(
                    Outcome::Failure,
                    go_client_error(&req.url, &e),
                ));
            }
        };
        let status = resp.status().as_u16();
        let body = match read_limited(resp, MAX_RESPONSE_BODY).await {
            Ok(b) => b,
            Err(e) if e.is_timeout() => {
                return Ok(HandlerResult::new(
                    Outcome::Failure,
                    go_client_error(&req.url, &e),
                ));
            }
            Err(e) => return Err(format!("reading the response body of {}: {e}", req.url)),
        };
        let body = String::from_utf8_lossy(&body).into_owned();
        if (200..400).contains(&status) {
            if status >= 300 {
                tracing::debug!(url = %req.url, status, "probe terminated redirects");
                return Ok(HandlerResult::new(
                    Outcome::Warning,
                    format!("Probe terminated redirects, Response body: {body}"),
                ));
            }
            return Ok(HandlerResult::new(Outcome::Success, body));
        }
        tracing::debug!(url = %req.url, status, body, "HTTP probe failed");
        // Like upstream, the user-facing text leaves the body out (kubernetes#99425).
        Ok(HandlerResult::new(
            Outcome::Failure,
            format!("HTTP probe failed with statuscode: {status}"),
        ))
    }

    /// A lifecycle hook's GET: only a transport error fails it, whatever the status code
    /// (as upstream). An https hook that meets a plain-HTTP server is retried over http
    /// without the `Authorization` header.
    pub async fn hook(&self, req: &ProbeRequest, timeout: Duration) -> Result<(), String> {
        let first = self
            .client
            .get(&req.url)
            .headers(req.headers.clone())
            .timeout(timeout)
            .send()
            .await;
        match first {
            Ok(resp) => {
                let _ = read_limited(resp, MAX_RESPONSE_BODY).await;
                Ok(())
            }
            Err(e) if req.url.starts_with("https://") && is_http_response_to_https(&e) => {
                tracing::info!(url = %req.url, "HTTPS request to lifecycle hook got HTTP response, retrying with HTTP.");
                let url = format!("http://{}", &req.url["https://".len()..]);
                let mut headers = req.headers.clone();
                headers.remove(reqwest::header::AUTHORIZATION);
                match self
                    .client
                    .get(&url)
                    .headers(headers)
                    .timeout(timeout)
                    .send()
                    .await
                {
                    Ok(resp) => {
                        let _ = read_limited(resp, MAX_RESPONSE_BODY).await;
                        Ok(())
                    }
                    Err(_) => Err(go_client_error(&req.url, &e)),
                }
            }
            Err(e) => Err(go_client_error(&req.url, &e)),
        }
    }
}

async fn read_limited(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = max - out.len();
        if chunk.len() >= room {
            out.extend_from_slice(&chunk[..room]);
            tracing::trace!("non-fatal body truncation of a probe response");
            break;
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn is_http_response_to_https(e: &reqwest::Error) -> bool {
    let text = error_chain(e);
    text.contains("InvalidContentType")
        || text.contains("received corrupt message")
        || text.contains("HTTP response to HTTPS")
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.join(": ")
}

/// Go's `http.Client` error text: `Get "URL": dial tcp HOST:PORT: connect: connection
/// refused`, `Get "URL": context deadline exceeded (Client.Timeout exceeded while awaiting
/// headers)`.
fn go_client_error(url: &str, e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return format!(
            "Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        );
    }
    if url.starts_with("https://") && is_http_response_to_https(e) {
        return format!("Get {url:?}: http: server gave HTTP response to HTTPS client");
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if e.is_connect() {
                let addr = reqwest::Url::parse(url)
                    .ok()
                    .and_then(|u| {
                        let host = u.host_str()?.trim_matches(['[', ']']).to_string();
                        Some(join_host_port(&host, u.port_or_known_default()?))
                    })
                    .unwrap_or_default();
                return format!("Get {url:?}: {}", go_dial_error(&addr, io));
            }
            return format!("Get {url:?}: {}", super::handler::go_errno_text(io));
        }
        cur = err.source();
    }
    if e.is_redirect() {
        return format!("Get {url:?}: stopped after 10 redirects");
    }
    format!("Get {url:?}: {}", error_chain(e))
}
