//! A minimal async client of the distribution HTTP API, for pushing test images and reading
//! them back. Handles anonymous, basic and bearer-token registries (it follows the
//! `WWW-Authenticate` challenge of a `401`, fetching a token from the realm with the
//! client's basic credentials when the challenge is `Bearer`). Speaks plain HTTP
//! ([`RegistryClient::new`]) or HTTPS with a test CA and client certificate
//! ([`RegistryClient::with_tls`]).

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use reqwest::{Method, StatusCode};

use super::tls::ClientTls;
use crate::image::{Image, ImageIndex, media_types};

/// A manifest fetched from a registry.
#[derive(Clone, Debug)]
pub struct FetchedManifest {
    /// `Content-Type` of the response.
    pub media_type: String,
    /// `Docker-Content-Digest` of the response, if sent.
    pub digest: Option<String>,
    pub body: Bytes,
}

/// A client of one registry (`host` = `127.0.0.1:PORT`), optionally with credentials and TLS.
#[derive(Debug)]
pub struct RegistryClient {
    http: reqwest::Client,
    base: url::Url,
    credentials: Option<(String, String)>,
    /// Authorization header value per scope.
    auth: Mutex<HashMap<String, String>>,
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// `basic` or `bearer` (lower case).
    pub scheme: String,
    /// Parameters (`realm`, `service`, `scope`, `error`, ...).
    pub params: HashMap<String, String>,
}

impl Challenge {
    /// Parses a single challenge such as
    /// `Bearer realm="http://x/token",service="s",scope="repository:a:pull,push"`.
    pub fn parse(header: &str) -> Option<Challenge> {
        let header = header.trim();
        let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
        let mut params = HashMap::new();
        let mut chars = rest.chars().peekable();
        loop {
            while matches!(chars.peek(), Some(c) if *c == ',' || c.is_whitespace()) {
                chars.next();
            }
            let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
            if key.is_empty() {
                break;
            }
            let mut value = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next()),
                        '"' => break,
                        c => value.push(c),
                    }
                }
            } else {
                while let Some(c) = chars.peek() {
                    if *c == ',' {
                        break;
                    }
                    value.push(*c);
                    chars.next();
                }
            }
            params.insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
        }
        Some(Challenge {
            scheme: scheme.to_ascii_lowercase(),
            params,
        })
    }
}

fn pull_scope(repo: &str) -> String {
    format!("repository:{repo}:pull")
}

fn push_scope(repo: &str) -> String {
    format!("repository:{repo}:pull,push")
}

impl RegistryClient {
    /// A client for `http://{host}`, with `credentials` used for basic auth and to obtain
    /// bearer tokens.
    pub fn new(host: &str, credentials: Option<(&str, &str)>) -> RegistryClient {
        RegistryClient::build(&format!("http://{host}/"), credentials, None)
            .expect("plain HTTP registry client")
    }

    /// A client for `https://{host}` trusting `tls.ca_pem` (besides the built-in roots) and
    /// presenting `tls.identity_pem` when the registry asks for a client certificate.
    pub fn with_tls(
        host: &str,
        credentials: Option<(&str, &str)>,
        tls: &ClientTls,
    ) -> Result<RegistryClient> {
        RegistryClient::build(&format!("https://{host}/"), credentials, Some(tls))
    }

    fn build(
        base: &str,
        credentials: Option<(&str, &str)>,
        tls: Option<&ClientTls>,
    ) -> Result<RegistryClient> {
        let mut b = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        if let Some(tls) = tls {
            b = tls.apply(b)?;
        }
        Ok(RegistryClient {
            http: b.build().context("build the registry HTTP client")?,
            base: url::Url::parse(base).with_context(|| format!("registry URL {base}"))?,
            credentials: credentials.map(|(u, p)| (u.to_string(), p.to_string())),
            auth: Mutex::new(HashMap::new()),
        })
    }

    /// The base URL (`http://127.0.0.1:PORT/`, or `https://` for a TLS client).
    pub fn base(&self) -> &url::Url {
        &self.base
    }

    async fn authorize(&self, challenge: &Challenge, scope: &str) -> Result<String> {
        let (user, pass) = self
            .credentials
            .as_ref()
            .context("registry requires authentication and the client has no credentials")?;
        let basic = format!("Basic {}", STANDARD.encode(format!("{user}:{pass}")));
        match challenge.scheme.as_str() {
            "basic" => Ok(basic),
            "bearer" => {
                let realm = challenge
                    .params
                    .get("realm")
                    .context("bearer challenge without realm")?;
                let mut url = url::Url::parse(realm).context("token realm URL")?;
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(service) = challenge.params.get("service") {
                        q.append_pair("service", service);
                    }
                    q.append_pair("scope", scope);
                    if let Some(s) = challenge.params.get("scope").filter(|s| *s != scope) {
                        q.append_pair("scope", s);
                    }
                }
                let resp = self
                    .http
                    .get(url)
                    .header("authorization", basic)
                    .send()
                    .await
                    .context("token request")?;
                let status = resp.status();
                ensure!(status.is_success(), "token server answered {status}");
                let v: serde_json::Value = resp.json().await.context("token response JSON")?;
                let token = v["token"]
                    .as_str()
                    .or(v["access_token"].as_str())
                    .context("token response without token")?;
                Ok(format!("Bearer {token}"))
            }
            other => bail!("unsupported auth scheme {other:?}"),
        }
    }

    /// Sends a request to `url` (absolute, or relative to the base), authenticating for
    /// `scope` on a 401 and retrying once.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        scope: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<reqwest::Response> {
        let url = self.base.join(url).with_context(|| format!("URL {url}"))?;
        let build = |auth: Option<&str>| {
            let mut rb = self.http.request(method.clone(), url.clone());
            for (k, v) in headers {
                rb = rb.header(*k, *v);
            }
            if let Some(a) = auth {
                rb = rb.header("authorization", a);
            }
            if let Some(b) = &body {
                rb = rb.body(b.clone());
            }
            rb
        };
        let cached = self.auth.lock().unwrap().get(scope).cloned();
        let resp = build(cached.as_deref())
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        if resp.status() != StatusCode::UNAUTHORIZED {
            return Ok(resp);
        }
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .and_then(Challenge::parse)
            .with_context(|| format!("{method} {url}: 401 without a usable WWW-Authenticate"))?;
        let auth = self.authorize(&challenge, scope).await?;
        self.auth
            .lock()
            .unwrap()
            .insert(scope.to_string(), auth.clone());
        build(Some(&auth))
            .send()
            .await
            .with_context(|| format!("{method} {url}"))
    }

    /// Uploads a blob unless the registry already has it: `POST .../blobs/uploads/` then a
    /// monolithic `PUT <location>&digest=...`.
    pub async fn push_blob(&self, repo: &str, digest: &str, data: Bytes) -> Result<()> {
        let scope = push_scope(repo);
        let head = self
            .send(
                Method::HEAD,
                &format!("v2/{repo}/blobs/{digest}"),
                &scope,
                &[],
                None,
            )
            .await?;
        if head.status() == StatusCode::OK {
            return Ok(());
        }
        let start = self
            .send(
                Method::POST,
                &format!("v2/{repo}/blobs/uploads/"),
                &scope,
                &[],
                None,
            )
            .await?;
        ensure!(
            start.status() == StatusCode::ACCEPTED,
            "start upload of {digest}: {}",
            start.status()
        );
        let location = start
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .context("upload without Location")?
            .to_string();
        let mut url = self.base.join(&location)?;
        url.query_pairs_mut().append_pair("digest", digest);
        let len = data.len().to_string();
        let put = self
            .send(
                Method::PUT,
                url.as_str(),
                &scope,
                &[
                    ("content-type", "application/octet-stream"),
                    ("content-length", &len),
                ],
                Some(data),
            )
            .await?;
        let status = put.status();
        ensure!(
            status == StatusCode::CREATED,
            "upload of {digest}: {status}: {}",
            put.text().await.unwrap_or_default()
        );
        Ok(())
    }

    /// `PUT /v2/<repo>/manifests/<reference>`.
    pub async fn put_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        body: Bytes,
    ) -> Result<()> {
        let resp = self
            .send(
                Method::PUT,
                &format!("v2/{repo}/manifests/{reference}"),
                &push_scope(repo),
                &[("content-type", media_type)],
                Some(body),
            )
            .await?;
        let status = resp.status();
        ensure!(
            status == StatusCode::CREATED,
            "put manifest {repo}:{reference}: {status}: {}",
            resp.text().await.unwrap_or_default()
        );
        Ok(())
    }

    async fn push_image_blobs(&self, repo: &str, image: &Image) -> Result<()> {
        for (digest, data) in image.blobs() {
            self.push_blob(repo, &digest, data).await?;
        }
        self.put_manifest(
            repo,
            &image.manifest_digest,
            image.media_type(),
            image.manifest.clone(),
        )
        .await
    }

    /// Pushes blobs, then the manifest by digest and by `tag`. Returns the manifest digest.
    pub async fn push_image(&self, repo: &str, tag: &str, image: &Image) -> Result<String> {
        self.push_image_blobs(repo, image).await?;
        self.put_manifest(repo, tag, image.media_type(), image.manifest.clone())
            .await?;
        Ok(image.manifest_digest.clone())
    }

    /// Pushes every child image (by digest), then the index by digest and by `tag`.
    /// Returns the index digest.
    pub async fn push_index(&self, repo: &str, tag: &str, index: &ImageIndex) -> Result<String> {
        for image in &index.images {
            self.push_image_blobs(repo, image).await?;
        }
        self.put_manifest(
            repo,
            &index.digest,
            index.media_type(),
            index.manifest.clone(),
        )
        .await?;
        self.put_manifest(repo, tag, index.media_type(), index.manifest.clone())
            .await?;
        Ok(index.digest.clone())
    }

    /// `GET /v2/<repo>/manifests/<reference>` accepting OCI and Docker manifests and indexes.
    pub async fn get_manifest(&self, repo: &str, reference: &str) -> Result<FetchedManifest> {
        let accept = [
            media_types::OCI_MANIFEST,
            media_types::OCI_INDEX,
            media_types::DOCKER_MANIFEST,
            media_types::DOCKER_MANIFEST_LIST,
        ]
        .join(", ");
        let resp = self
            .send(
                Method::GET,
                &format!("v2/{repo}/manifests/{reference}"),
                &pull_scope(repo),
                &[("accept", &accept)],
                None,
            )
            .await?;
        let status = resp.status();
        ensure!(
            status == StatusCode::OK,
            "get manifest {repo}:{reference}: {status}"
        );
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let media_type = header("content-type").unwrap_or_default();
        let digest = header("docker-content-digest");
        Ok(FetchedManifest {
            media_type,
            digest,
            body: resp.bytes().await?,
        })
    }

    /// `GET /v2/<repo>/blobs/<digest>`.
    pub async fn get_blob(&self, repo: &str, digest: &str) -> Result<Bytes> {
        let resp = self
            .send(
                Method::GET,
                &format!("v2/{repo}/blobs/{digest}"),
                &pull_scope(repo),
                &[],
                None,
            )
            .await?;
        let status = resp.status();
        ensure!(
            status == StatusCode::OK,
            "get blob {repo}@{digest}: {status}"
        );
        Ok(resp.bytes().await?)
    }

    /// `DELETE /v2/<repo>/manifests/<digest>` (the registry has deletes enabled).
    pub async fn delete_manifest(&self, repo: &str, digest: &str) -> Result<()> {
        let resp = self
            .send(
                Method::DELETE,
                &format!("v2/{repo}/manifests/{digest}"),
                &format!("repository:{repo}:delete"),
                &[],
                None,
            )
            .await?;
        let status = resp.status();
        ensure!(
            status == StatusCode::ACCEPTED,
            "delete manifest {repo}@{digest}: {status}"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_challenges() {
        let c = Challenge::parse(
            r#"Bearer realm="http://127.0.0.1:1/token",service="svc",scope="repository:a/b:pull,push",error="insufficient_scope""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "http://127.0.0.1:1/token");
        assert_eq!(c.params["service"], "svc");
        assert_eq!(c.params["scope"], "repository:a/b:pull,push");
        assert_eq!(c.params["error"], "insufficient_scope");
        let b = Challenge::parse(r#"Basic realm="basic-realm""#).unwrap();
        assert_eq!(b.scheme, "basic");
        assert_eq!(b.params["realm"], "basic-realm");
    }
}
