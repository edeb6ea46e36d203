//! HTTP plumbing: one reqwest client per TLS/proxy configuration, requests with
//! authentication (401 → challenge → credentials or token → retry), the HTTPS→HTTP fallback
//! of loopback hosts, and registry error bodies.

use super::auth::{self, AuthCache, Challenge, Secret, TokenKey, TokenResponse};
use super::{ClientOptions, DistributionError};
use crate::image::hosts::{ClientCert, RegistryHost, is_localhost};
use http::StatusCode;
use reqwest::header::{
    ACCEPT, AUTHORIZATION, HeaderMap, HeaderName, HeaderValue, WWW_AUTHENTICATE,
};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// containerd's default dial timeout.
const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, PartialEq, Eq, Hash)]
struct ClientKey {
    ca: Vec<PathBuf>,
    client_certs: Vec<ClientCert>,
    skip_verify: bool,
    dial_timeout: Option<Duration>,
    proxy: Option<String>,
    loopback: bool,
}

/// Who is asking, for what: the registry (reference domain), the repository and the
/// credentials.
pub(crate) struct RepoCtx<'a> {
    pub registry: &'a str,
    pub repository: &'a str,
    pub creds: &'a super::Credentials,
}

pub(crate) struct Http {
    options: ClientOptions,
    clients: Mutex<HashMap<ClientKey, reqwest::Client>>,
    auth: AuthCache,
    /// Hosts whose HTTPS attempt failed and that are now spoken to in plain HTTP.
    fell_back: Mutex<HashSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The text of a reqwest error without its URL, causes joined with ": ".
pub(crate) fn describe(e: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    if e.is_timeout() {
        parts.push("timeout".into());
    }
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        src = s.source();
    }
    if parts.is_empty() {
        parts.push(e.to_string());
    }
    parts.join(": ")
}

/// The `errors` of a registry error body (distribution spec).
#[derive(serde::Deserialize, Default)]
pub(crate) struct ErrorBody {
    #[serde(default)]
    pub errors: Vec<RegistryError>,
}

#[derive(serde::Deserialize)]
pub(crate) struct RegistryError {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

impl ErrorBody {
    pub(crate) fn has_code(&self, codes: &[&str]) -> bool {
        self.errors.iter().any(|e| codes.contains(&e.code.as_str()))
    }

    pub(crate) fn summary(&self) -> String {
        self.errors
            .iter()
            .map(|e| {
                if e.message.is_empty() {
                    e.code.clone()
                } else {
                    format!("{}: {}", e.code, e.message)
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Reads at most `limit` bytes of a response body.
pub(crate) async fn read_limited(
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<Result<Vec<u8>, usize>, reqwest::Error> {
    let mut buf = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if buf.len() + chunk.len() > limit {
            return Ok(Err(buf.len() + chunk.len()));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Ok(buf))
}

/// The status and parsed registry errors of a failed response (body read up to 64 KiB).
pub(crate) async fn error_of(resp: reqwest::Response) -> (StatusCode, ErrorBody) {
    let status = resp.status();
    let body = match read_limited(resp, 64 << 10).await {
        Ok(Ok(b)) => serde_json::from_slice(&b).unwrap_or_default(),
        _ => ErrorBody::default(),
    };
    (status, body)
}

/// containerd's `isProxy`: whether `host` serves `registry` as a mirror, in which case the
/// registry is named in an `ns` query parameter.
pub(crate) fn is_mirror(host: &str, registry: &str) -> bool {
    host != registry && !(registry == "docker.io" && host == "registry-1.docker.io")
}

impl Http {
    pub(crate) fn new(options: ClientOptions) -> Self {
        Http {
            options,
            clients: Mutex::new(HashMap::new()),
            auth: AuthCache::default(),
            fell_back: Mutex::new(HashSet::new()),
        }
    }

    pub(crate) fn options(&self) -> &ClientOptions {
        &self.options
    }

    fn client_for(&self, host: &RegistryHost) -> Result<reqwest::Client, DistributionError> {
        let key = ClientKey {
            ca: host.ca.clone(),
            client_certs: host.client_certs.clone(),
            skip_verify: host.skip_verify == Some(true),
            dial_timeout: host.dial_timeout,
            proxy: host.proxy.clone(),
            loopback: is_localhost(&host.host),
        };
        if let Some(c) = lock(&self.clients).get(&key) {
            return Ok(c.clone());
        }
        let cfg = |m: String| {
            DistributionError::InvalidConfig(format!("registry host {}: {m}", host.host))
        };
        let mut b = reqwest::Client::builder()
            .user_agent(self.options.user_agent.clone())
            .connect_timeout(key.dial_timeout.unwrap_or(DEFAULT_DIAL_TIMEOUT))
            .read_timeout(self.options.read_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::limited(10));
        if key.skip_verify {
            b = b.danger_accept_invalid_certs(true);
        }
        for path in &key.ca {
            let pem = std::fs::read(path)
                .map_err(|e| cfg(format!("unable to read CA cert {}: {e}", path.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| cfg(format!("unable to load CA cert {}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(cfg(format!(
                    "unable to load CA cert {}: no PEM certificate in it",
                    path.display()
                )));
            }
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        match key.client_certs.as_slice() {
            [] => {}
            [one] => {
                let mut pem = std::fs::read(&one.cert).map_err(|e| {
                    cfg(format!(
                        "unable to read client certificate {}: {e}",
                        one.cert.display()
                    ))
                })?;
                if let Some(k) = &one.key {
                    pem.push(b'\n');
                    pem.extend(std::fs::read(k).map_err(|e| {
                        cfg(format!("unable to read client key {}: {e}", k.display()))
                    })?);
                }
                let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                    cfg(format!(
                        "failed to load X509 key pair {}: {e}",
                        one.cert.display()
                    ))
                })?;
                b = b.identity(id);
            }
            many => {
                return Err(cfg(format!(
                    "{} client certificates are configured; nodus supports one per host",
                    many.len()
                )));
            }
        }
        if let Some(p) = &key.proxy {
            let proxy =
                reqwest::Proxy::all(p).map_err(|e| cfg(format!("invalid proxy {p:?}: {e}")))?;
            b = b.proxy(proxy);
        } else if key.loopback {
            // Go's ProxyFromEnvironment never proxies loopback hosts.
            b = b.no_proxy();
        }
        let client = b
            .build()
            .map_err(|e| cfg(format!("failed to build HTTP client: {}", describe(&e))))?;
        lock(&self.clients).insert(key, client.clone());
        Ok(client)
    }

    /// Forgets that `host` fell back to plain HTTP, so the next pull tries HTTPS first
    /// again (containerd keeps the fallback for one pull only: a registry restarted with TLS
    /// must not stay unreachable until the runtime restarts).
    pub(crate) fn forget_fallback(&self, host: &str) {
        lock(&self.fell_back).remove(host);
    }

    /// The URL of `suffix` (e.g. `manifests/latest`) under `repository` on `host`, in the
    /// scheme currently used for the host.
    pub(crate) fn url(&self, host: &RegistryHost, ctx: &RepoCtx<'_>, suffix: &str) -> String {
        let scheme = if host.http_fallback && lock(&self.fell_back).contains(&host.host) {
            "http"
        } else {
            host.scheme.as_str()
        };
        let mut u = format!(
            "{scheme}://{}{}/{}/{suffix}",
            host.host, host.path, ctx.repository
        );
        if is_mirror(&host.host, ctx.registry) {
            u.push_str("?ns=");
            u.push_str(
                &url::form_urlencoded::byte_serialize(ctx.registry.as_bytes()).collect::<String>(),
            );
        }
        u
    }

    /// GET `suffix` on `host` with authentication. Returns the final response (any status
    /// but an unresolvable 401) and the URL it came from.
    pub(crate) async fn get(
        &self,
        host: &RegistryHost,
        ctx: &RepoCtx<'_>,
        suffix: &str,
        accept: &str,
    ) -> Result<(reqwest::Response, String), DistributionError> {
        self.get_with(host, ctx, suffix, accept, &HeaderMap::new())
            .await
    }

    /// [`get`](Self::get) with `extra` headers (e.g. `Range`) on every request it sends to
    /// `host` (not on token requests).
    pub(crate) async fn get_with(
        &self,
        host: &RegistryHost,
        ctx: &RepoCtx<'_>,
        suffix: &str,
        accept: &str,
        extra: &HeaderMap,
    ) -> Result<(reqwest::Response, String), DistributionError> {
        let client = self.client_for(host)?;
        let mut headers = extra.clone();
        let accept = HeaderValue::from_str(accept).map_err(|_| {
            DistributionError::InvalidConfig(format!("invalid Accept header {accept:?}"))
        })?;
        headers.insert(ACCEPT, accept);
        let secret = ctx
            .creds
            .secret_for(&host.host, ctx.registry)
            .map_err(DistributionError::Unauthorized)?;
        let mut challenge: Option<Challenge> = None;
        let mut force_fresh = false;
        loop {
            let (authz, fresh) = self
                .authorization(
                    &client,
                    host,
                    ctx,
                    secret.as_ref(),
                    challenge.as_ref(),
                    force_fresh,
                )
                .await?;
            let (resp, url) = self
                .send(&client, host, ctx, suffix, &headers, authz.as_deref())
                .await?;
            if resp.status() != StatusCode::UNAUTHORIZED {
                return Ok((resp, url));
            }
            let values: Vec<&str> = resp
                .headers()
                .get_all(WWW_AUTHENTICATE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            let challenges = auth::parse_www_authenticate(values);
            let chosen = challenges
                .iter()
                .find(|c| c.scheme == "bearer")
                .or_else(|| challenges.iter().find(|c| c.scheme == "basic"))
                .cloned();
            let Some(ch) = chosen else {
                let (status, body) = error_of(resp).await;
                return Err(DistributionError::Unauthorized(format!(
                    "unexpected status from GET request to {url}: {status}{}: no supported WWW-Authenticate challenge (Basic or Bearer)",
                    suffix_of(&body)
                )));
            };
            if authz.is_some() {
                if fresh {
                    let what = match ch.param("error") {
                        Some(e) => format!("server message: {e}: authorization failed"),
                        None => "authorization failed".to_string(),
                    };
                    return Err(DistributionError::Unauthorized(what));
                }
                // A cached token the registry no longer accepts: get a new one, once.
                force_fresh = true;
            }
            self.auth.set_challenge(&host.host, &ch);
            if ch.scheme == "basic" && !matches!(secret, Some(Secret::Basic { .. })) {
                return Err(DistributionError::Unauthorized(
                    "no basic auth credentials".to_string(),
                ));
            }
            challenge = Some(ch);
        }
    }

    /// The `Authorization` to send to `host` and whether it was just obtained (as opposed to
    /// taken from the cache).
    async fn authorization(
        &self,
        client: &reqwest::Client,
        host: &RegistryHost,
        ctx: &RepoCtx<'_>,
        secret: Option<&Secret>,
        fresh_challenge: Option<&Challenge>,
        force_fresh: bool,
    ) -> Result<(Option<String>, bool), DistributionError> {
        let Some(ch) = fresh_challenge
            .cloned()
            .or_else(|| self.auth.challenge(&host.host))
        else {
            return Ok((None, false));
        };
        match ch.scheme.as_str() {
            "basic" => Ok((secret.and_then(Secret::basic_header), true)),
            "bearer" => {
                if let Some(Secret::RegistryToken(t)) = secret {
                    return Ok((Some(format!("Bearer {t}")), true));
                }
                let scopes = auth::pull_scopes(ctx.repository, fresh_challenge);
                let key = TokenKey::new(&ch, &scopes, secret);
                if force_fresh {
                    self.auth.forget_token(&key);
                } else if let Some(t) = self.auth.token(&key) {
                    return Ok((Some(format!("Bearer {t}")), false));
                }
                let (token, expires_in) =
                    self.fetch_token(client, host, &ch, &scopes, secret).await?;
                self.auth.put_token(key, token.clone(), expires_in);
                Ok((Some(format!("Bearer {token}")), true))
            }
            _ => Ok((None, false)),
        }
    }

    /// Asks the token service named by a Bearer challenge for a token.
    async fn fetch_token(
        &self,
        client: &reqwest::Client,
        host: &RegistryHost,
        ch: &Challenge,
        scopes: &[String],
        secret: Option<&Secret>,
    ) -> Result<(String, Option<u64>), DistributionError> {
        let realm = ch.param("realm").filter(|r| !r.is_empty()).ok_or_else(|| {
            DistributionError::Unauthorized(format!(
                "no realm specified for token auth challenge from {}",
                host.host
            ))
        })?;
        let mut url = url::Url::parse(realm).map_err(|e| {
            DistributionError::Unauthorized(format!("invalid token realm {realm:?}: {e}"))
        })?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(DistributionError::Unauthorized(format!(
                "invalid token realm {realm:?}: not an http(s) URL"
            )));
        }
        let service = ch.param("service").unwrap_or_default();
        let headers = self.host_headers(host);
        let (kind, method, req) = match secret {
            Some(Secret::IdentityToken(t)) => {
                let mut form = url::form_urlencoded::Serializer::new(String::new());
                form.append_pair("grant_type", "refresh_token");
                form.append_pair("refresh_token", t);
                form.append_pair("service", service);
                form.append_pair("client_id", "nodus");
                if !scopes.is_empty() {
                    form.append_pair("scope", &scopes.join(" "));
                }
                let req = client
                    .post(url.clone())
                    .headers(headers)
                    .header(
                        reqwest::header::CONTENT_TYPE,
                        "application/x-www-form-urlencoded; charset=utf-8",
                    )
                    .body(form.finish());
                ("oauth", "POST", req)
            }
            _ => {
                {
                    let mut q = url.query_pairs_mut();
                    if !service.is_empty() {
                        q.append_pair("service", service);
                    }
                    for s in scopes {
                        q.append_pair("scope", s);
                    }
                }
                let mut req = client.get(url.clone()).headers(headers);
                let kind = match secret.and_then(Secret::basic_header) {
                    Some(b) => {
                        req = req.header(AUTHORIZATION, b);
                        "basic-auth"
                    }
                    None => "anonymous",
                };
                (kind, "GET", req)
            }
        };
        let resp = req.send().await.map_err(|e| {
            DistributionError::Unavailable(format!(
                "failed to fetch {kind} token: failed to do request: {method} {:?}: {}",
                url.as_str(),
                describe(&e)
            ))
        })?;
        let status = resp.status();
        if !status.is_success() {
            let (_, body) = error_of(resp).await;
            let msg = format!(
                "failed to fetch {kind} token: unexpected status from {method} request to {url}: {status}{}",
                suffix_of(&body)
            );
            return Err(
                if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                    DistributionError::Unavailable(msg)
                } else {
                    DistributionError::Unauthorized(msg)
                },
            );
        }
        let body = read_limited(resp, 1 << 20)
            .await
            .map_err(|e| {
                DistributionError::Unavailable(format!(
                    "failed to fetch {kind} token from {url}: {}",
                    describe(&e)
                ))
            })?
            .map_err(|_| {
                DistributionError::Unauthorized(format!(
                    "failed to fetch {kind} token from {url}: response too large"
                ))
            })?;
        let parsed: TokenResponse = serde_json::from_slice(&body).map_err(|e| {
            DistributionError::Unauthorized(format!(
                "failed to decode {kind} token response from {url}: {e}"
            ))
        })?;
        parsed.into_token().ok_or_else(|| {
            DistributionError::Unauthorized(format!(
                "authorization server {url} did not include a token in the response"
            ))
        })
    }

    fn host_headers(&self, host: &RegistryHost) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, values) in &host.headers {
            let Ok(n) = HeaderName::from_bytes(name.as_bytes()) else {
                continue; // validated when the hosts file was read
            };
            for v in values {
                if let Ok(v) = HeaderValue::from_str(v) {
                    h.append(n.clone(), v);
                }
            }
        }
        h
    }

    /// One request, with the HTTPS→HTTP fallback of hosts that have it.
    async fn send(
        &self,
        client: &reqwest::Client,
        host: &RegistryHost,
        ctx: &RepoCtx<'_>,
        suffix: &str,
        headers: &HeaderMap,
        authz: Option<&str>,
    ) -> Result<(reqwest::Response, String), DistributionError> {
        loop {
            let url = self.url(host, ctx, suffix);
            let mut req = client.get(&url).headers(self.host_headers(host));
            for (name, value) in headers {
                req = req.header(name, value);
            }
            if let Some(a) = authz {
                req = req.header(AUTHORIZATION, a);
            }
            match req.send().await {
                Ok(r) => return Ok((r, url)),
                Err(e) => {
                    // As containerd's httpFallback: only when the server answered the TLS
                    // hello in plain HTTP, or the handshake timed out. A certificate that
                    // fails verification or a refused connection is reported as it is,
                    // never papered over by trying plain HTTP.
                    let fallback_possible =
                        host.http_fallback && url.starts_with("https://") && speaks_plain_http(&e);
                    if fallback_possible {
                        tracing::info!(
                            host = %host.host,
                            url = %url,
                            error = %describe(&e),
                            "HTTPS failed, falling back to plain HTTP for this host"
                        );
                        lock(&self.fell_back).insert(host.host.clone());
                        continue;
                    }
                    return Err(DistributionError::Unavailable(format!(
                        "failed to do request: GET {url:?}: {}",
                        describe(&e)
                    )));
                }
            }
        }
    }
}

/// Whether a failed HTTPS request hit a server speaking plain HTTP (rustls sees an HTTP
/// response where a TLS record should be) or a TLS handshake that timed out.
fn speaks_plain_http(e: &reqwest::Error) -> bool {
    if e.is_connect() && e.is_timeout() {
        return true;
    }
    let chain = describe(e);
    chain.contains("InvalidContentType") || chain.contains("corrupt message")
}

/// `": CODE: message"` from a registry error body, or nothing.
pub(crate) fn suffix_of(body: &ErrorBody) -> String {
    let s = body.summary();
    if s.is_empty() { s } else { format!(": {s}") }
}
