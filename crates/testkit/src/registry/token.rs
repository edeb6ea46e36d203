//! A token server for the registry's `auth: token:` mode (docker distribution's token
//! authentication).
//!
//! At start it generates a P-256 key and a self-signed certificate for it; the certificate is
//! the registry's `rootcertbundle`. Tokens are ES256 JWTs whose header carries the
//! certificate in `x5c`, which distribution 2.8 verifies against that bundle. Claims: `iss`
//! = [`ISSUER`], `sub` = user, `aud` = the `service` asked for, `iat`/`nbf`/`exp`, `jti`,
//! and `access` = every requested `type:name:actions` scope, granted in full.
//!
//! Endpoints:
//!
//! - `GET /token?service=S&scope=repository:NAME:pull,push[&scope=...]` with HTTP basic
//!   credentials → `{"token", "access_token", "expires_in", "issued_at"}`.
//! - `POST /token` with the OAuth2 password grant form (`grant_type=password`, `username`,
//!   `password`, `service`, `scope`), as containerd sends it when it has credentials.
//!
//! Missing or wrong credentials get `401` (with `WWW-Authenticate: Basic`), so anonymous
//! clients cannot obtain any token.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use serde::Serialize;

use crate::http_server::{BackgroundServer, Body, Handler, respond};

/// `iss` of every token, and the registry's `auth.token.issuer`.
pub const ISSUER: &str = "testkit-token-issuer";

/// One granted scope in a token's `access` claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Access {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub actions: Vec<String>,
}

impl Access {
    /// Parses a scope such as `repository:library/busybox:pull,push`.
    pub fn parse(scope: &str) -> Option<Access> {
        let (kind, rest) = scope.split_once(':')?;
        let (name, actions) = rest.rsplit_once(':')?;
        Some(Access {
            kind: kind.to_string(),
            name: name.to_string(),
            actions: actions
                .split(',')
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .collect(),
        })
    }
}

/// Signs registry tokens with the key whose certificate is [`TokenIssuer::cert_pem`].
pub struct TokenIssuer {
    key: EcdsaKeyPair,
    cert_der: Vec<u8>,
    cert_pem: String,
    rng: SystemRandom,
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIssuer").finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Header<'a> {
    typ: &'static str,
    alg: &'static str,
    x5c: [&'a str; 1],
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'static str,
    sub: &'a str,
    aud: &'a str,
    exp: i64,
    nbf: i64,
    iat: i64,
    jti: String,
    access: &'a [Access],
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

impl TokenIssuer {
    /// A fresh P-256 key and self-signed certificate.
    pub fn generate() -> Result<TokenIssuer> {
        let key = rcgen::KeyPair::generate().context("generate P-256 key")?;
        let params = rcgen::CertificateParams::new(vec![ISSUER.to_string()])?;
        let cert = params
            .self_signed(&key)
            .context("self-sign token certificate")?;
        let rng = SystemRandom::new();
        let signing =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &key.serialize_der(), &rng)
                .map_err(|e| anyhow::anyhow!("load signing key: {e}"))?;
        Ok(TokenIssuer {
            key: signing,
            cert_der: cert.der().to_vec(),
            cert_pem: cert.pem(),
            rng,
        })
    }

    /// The certificate (PEM) to use as the registry's `rootcertbundle`.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A signed token for `subject`, audience `service`, valid for `ttl_secs` (negative for
    /// an already expired token).
    pub fn token(&self, subject: &str, service: &str, access: &[Access], ttl_secs: i64) -> String {
        let x5c = STANDARD.encode(&self.cert_der);
        let header = serde_json::to_vec(&Header {
            typ: "JWT",
            alg: "ES256",
            x5c: [&x5c],
        })
        .expect("serialize JWT header");
        let mut jti = [0u8; 16];
        self.rng.fill(&mut jti).expect("random jti");
        let t = now();
        let claims = serde_json::to_vec(&Claims {
            iss: ISSUER,
            sub: subject,
            aud: service,
            exp: t + ttl_secs,
            nbf: t.min(t + ttl_secs) - 60,
            iat: t.min(t + ttl_secs) - 60,
            jti: hex::encode(jti),
            access,
        })
        .expect("serialize JWT claims");
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims)
        );
        let sig = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .expect("ECDSA sign");
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }
}

/// The token server: a [`TokenIssuer`] behind HTTP on 127.0.0.1, checking one user's
/// basic credentials. Stopped on drop.
pub struct TokenServer {
    server: BackgroundServer,
    issuer: Arc<TokenIssuer>,
    requests: Arc<AtomicUsize>,
    issued: Arc<AtomicUsize>,
}

struct State {
    issuer: Arc<TokenIssuer>,
    user: String,
    pass: String,
    requests: Arc<AtomicUsize>,
    issued: Arc<AtomicUsize>,
}

impl TokenServer {
    /// Starts a token server accepting `user`/`pass`.
    pub fn start(user: &str, pass: &str) -> Result<TokenServer> {
        let issuer = Arc::new(TokenIssuer::generate()?);
        let requests = Arc::new(AtomicUsize::new(0));
        let issued = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(State {
            issuer: issuer.clone(),
            user: user.to_string(),
            pass: pass.to_string(),
            requests: requests.clone(),
            issued: issued.clone(),
        });
        let handler: Handler = Arc::new(move |req| {
            let state = state.clone();
            Box::pin(async move { handle(&state, req).await })
        });
        let server = BackgroundServer::start("token-server", handler)?;
        Ok(TokenServer {
            server,
            issuer,
            requests,
            issued,
        })
    }

    /// The `realm` URL: `http://127.0.0.1:PORT/token`.
    pub fn realm(&self) -> String {
        format!("http://{}/token", self.server.addr())
    }

    /// The issuer (to mint tokens directly, e.g. expired ones).
    pub fn issuer(&self) -> &TokenIssuer {
        &self.issuer
    }

    /// Number of requests received.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Number of tokens issued.
    pub fn issued(&self) -> usize {
        self.issued.load(Ordering::SeqCst)
    }
}

fn basic_credentials(req: &Request<Incoming>) -> Option<(String, String)> {
    let value = req
        .headers()
        .get(hyper::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let encoded = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))?;
    let decoded = String::from_utf8(STANDARD.decode(encoded.trim()).ok()?).ok()?;
    let (u, p) = decoded.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

fn unauthorized() -> Response<Body> {
    let mut resp = respond(
        401,
        "application/json",
        r#"{"errors":[{"code":"UNAUTHORIZED","message":"invalid credentials"}]}"#,
    );
    resp.headers_mut().insert(
        "www-authenticate",
        r#"Basic realm="testkit-token""#.parse().unwrap(),
    );
    resp
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<Body> {
    state.requests.fetch_add(1, Ordering::SeqCst);
    if req.uri().path() != "/token" {
        return respond(404, "text/plain", "not found");
    }
    let (user, pass, service, scopes, oauth) = match *req.method() {
        hyper::Method::GET => {
            let creds = basic_credentials(&req);
            let mut service = String::new();
            let mut scopes = Vec::new();
            for (k, v) in url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()) {
                match &*k {
                    "service" => service = v.into_owned(),
                    "scope" => scopes.extend(v.split(' ').map(str::to_string)),
                    _ => {}
                }
            }
            let (u, p) = creds.unwrap_or_default();
            (u, p, service, scopes, false)
        }
        hyper::Method::POST => {
            let Ok(body) = req.into_body().collect().await else {
                return respond(400, "text/plain", "bad body");
            };
            let (mut u, mut p, mut service, mut scopes, mut grant) = (
                String::new(),
                String::new(),
                String::new(),
                Vec::new(),
                String::new(),
            );
            for (k, v) in url::form_urlencoded::parse(&body.to_bytes()) {
                match &*k {
                    "grant_type" => grant = v.into_owned(),
                    "username" => u = v.into_owned(),
                    "password" => p = v.into_owned(),
                    "service" => service = v.into_owned(),
                    "scope" => scopes.extend(v.split(' ').map(str::to_string)),
                    _ => {}
                }
            }
            if grant != "password" {
                return respond(
                    400,
                    "application/json",
                    r#"{"error":"unsupported_grant_type"}"#,
                );
            }
            (u, p, service, scopes, true)
        }
        _ => return respond(405, "text/plain", "method not allowed"),
    };
    if user != state.user || pass != state.pass {
        return unauthorized();
    }
    let access: Vec<Access> = scopes
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| Access::parse(s))
        .collect();
    let ttl = 600;
    let token = state.issuer.token(&user, &service, &access, ttl);
    state.issued.fetch_add(1, Ordering::SeqCst);
    let issued_at = chrono_like_now();
    let body = if oauth {
        serde_json::json!({
            "access_token": token,
            "expires_in": ttl,
            "issued_at": issued_at,
            "scope": scopes.join(" "),
        })
    } else {
        serde_json::json!({
            "token": token,
            "access_token": token,
            "expires_in": ttl,
            "issued_at": issued_at,
        })
    };
    respond(
        200,
        "application/json",
        serde_json::to_vec(&body).expect("json"),
    )
}

/// RFC 3339 UTC timestamp of now, without pulling in a date crate.
fn chrono_like_now() -> String {
    let secs = now();
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse() {
        let a = Access::parse("repository:library/busybox:pull,push").unwrap();
        assert_eq!(a.kind, "repository");
        assert_eq!(a.name, "library/busybox");
        assert_eq!(a.actions, ["pull", "push"]);
        assert_eq!(Access::parse("registry:catalog:*").unwrap().actions, ["*"]);
        assert!(Access::parse("nonsense").is_none());
    }

    #[test]
    fn token_is_a_verifiable_es256_jwt() {
        let issuer = TokenIssuer::generate().unwrap();
        let access = [Access::parse("repository:x:pull").unwrap()];
        let token = issuer.token("alice", "svc", &access, 60);
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header["alg"], "ES256");
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["aud"], "svc");
        assert_eq!(claims["access"][0]["name"], "x");
        let sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        assert_eq!(sig.len(), 64);
        let verifier = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            ring::signature::KeyPair::public_key(&issuer.key)
                .as_ref()
                .to_vec(),
        );
        verifier
            .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig)
            .unwrap();
    }

    #[test]
    fn timestamp_format() {
        let s = chrono_like_now();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z'), "{s}");
    }
}
