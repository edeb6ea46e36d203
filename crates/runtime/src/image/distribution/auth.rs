//! Registry authentication: the CRI `AuthConfig` as [`Credentials`], `WWW-Authenticate`
//! challenges, and the bearer-token cache.
//!
//! Token requests follow the Docker token specification (distribution `docs/spec/auth`):
//! `GET <realm>?service=…&scope=…` with HTTP basic credentials when there are some
//! (anonymous otherwise), or `POST <realm>` with `grant_type=refresh_token` when an identity
//! token is given. (containerd POSTs `grant_type=password` for username/password first and
//! falls back to GET on 400/401/404/405; both are accepted by every registry that implements
//! the spec.) A `registry_token` is sent as the bearer token as is.

use super::super::digest::Digest;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Registry credentials as the CRI `AuthConfig` carries them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// base64 of `username:password`.
    pub auth: String,
    /// When set, the credentials are only for this registry host.
    pub server_address: String,
    /// An OAuth2 refresh token for the registry's token service.
    pub identity_token: String,
    /// A bearer token for the registry itself.
    pub registry_token: String,
}

impl Credentials {
    /// No credentials: anonymous access.
    pub fn anonymous() -> Self {
        Self::default()
    }

    pub fn is_anonymous(&self) -> bool {
        self.username.is_empty()
            && self.password.is_empty()
            && self.auth.is_empty()
            && self.identity_token.is_empty()
            && self.registry_token.is_empty()
    }

    /// The secret to present to `endpoint` (a host of `registry`), as containerd's CRI
    /// `ParseAuth` decides: nothing when `server_address` names another host; then username
    /// and password, the identity token, the decoded `auth`, the registry token.
    ///
    /// `server_address` may be a bare host or a URL; it matches the endpoint or the
    /// registry (containerd compares with the endpoint only; Docker Hub's names are one).
    pub(crate) fn secret_for(
        &self,
        endpoint: &str,
        registry: &str,
    ) -> Result<Option<Secret>, String> {
        if !self.server_address.is_empty() {
            let h = server_host(&self.server_address);
            if !same_registry(&h, endpoint) && !same_registry(&h, registry) {
                return Ok(None);
            }
        }
        if !self.username.is_empty() {
            return Ok(Some(Secret::Basic {
                username: self.username.clone(),
                password: self.password.clone(),
            }));
        }
        if !self.identity_token.is_empty() {
            return Ok(Some(Secret::IdentityToken(self.identity_token.clone())));
        }
        if !self.auth.is_empty() {
            use base64::Engine as _;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(self.auth.trim())
                .map_err(|e| format!("invalid auth in credentials: not base64: {e}"))?;
            let decoded = String::from_utf8(decoded)
                .map_err(|_| "invalid auth in credentials: not UTF-8".to_string())?;
            let Some((user, pass)) = decoded.split_once(':') else {
                return Err(
                    "invalid auth in credentials: expected base64 of \"user:password\"".into(),
                );
            };
            return Ok(Some(Secret::Basic {
                username: user.to_string(),
                password: pass.trim_matches('\0').to_string(),
            }));
        }
        if !self.registry_token.is_empty() {
            return Ok(Some(Secret::RegistryToken(self.registry_token.clone())));
        }
        Ok(None)
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |s: &str| if s.is_empty() { "" } else { "<redacted>" };
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &redact(&self.password))
            .field("auth", &redact(&self.auth))
            .field("server_address", &self.server_address)
            .field("identity_token", &redact(&self.identity_token))
            .field("registry_token", &redact(&self.registry_token))
            .finish()
    }
}

impl From<cri::runtime::v1::AuthConfig> for Credentials {
    fn from(a: cri::runtime::v1::AuthConfig) -> Self {
        Credentials {
            username: a.username,
            password: a.password,
            auth: a.auth,
            server_address: a.server_address,
            identity_token: a.identity_token,
            registry_token: a.registry_token,
        }
    }
}

/// `host[:port]` of a server address given as a host or a URL.
fn server_host(addr: &str) -> String {
    let with_scheme = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("https://{addr}")
    };
    match url::Url::parse(&with_scheme) {
        Ok(u) => match (u.host_str(), u.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            _ => addr.to_string(),
        },
        Err(_) => addr.trim_end_matches('/').to_string(),
    }
}

fn same_registry(a: &str, b: &str) -> bool {
    const HUB: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];
    a.eq_ignore_ascii_case(b) || (HUB.contains(&a) && HUB.contains(&b))
}

/// What is presented to a registry or its token service.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Secret {
    Basic { username: String, password: String },
    IdentityToken(String),
    RegistryToken(String),
}

impl Secret {
    /// A stable, non-reversible key for caches.
    fn fingerprint(&self) -> String {
        let s = match self {
            Secret::Basic { username, password } => format!("basic\0{username}\0{password}"),
            Secret::IdentityToken(t) => format!("identity\0{t}"),
            Secret::RegistryToken(t) => format!("registry\0{t}"),
        };
        Digest::of(s.as_bytes()).hex()[..32].to_string()
    }

    pub(crate) fn basic_header(&self) -> Option<String> {
        use base64::Engine as _;
        match self {
            Secret::Basic { username, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
            )),
            _ => None,
        }
    }
}

/// One challenge of a `WWW-Authenticate` header: the scheme (lowercased) and its parameters
/// (names lowercased, values unquoted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub scheme: String,
    pub params: BTreeMap<String, String>,
}

impl Challenge {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }
}

/// Parses `WWW-Authenticate` header values (RFC 7235): several challenges per value,
/// comma-separated parameters, quoted strings with backslash escapes, free whitespace.
pub fn parse_www_authenticate<'a>(values: impl IntoIterator<Item = &'a str>) -> Vec<Challenge> {
    let mut out = Vec::new();
    for v in values {
        parse_value(v, &mut out);
    }
    out
}

fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

fn parse_value(s: &str, out: &mut Vec<Challenge>) {
    let b: Vec<char> = s.chars().collect();
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && (b[*i] == ' ' || b[*i] == '\t') {
            *i += 1;
        }
    };
    let token = |i: &mut usize| -> String {
        let start = *i;
        while *i < b.len() && is_tchar(b[*i]) {
            *i += 1;
        }
        b[start..*i].iter().collect()
    };
    loop {
        // Skip empty list elements.
        while i < b.len() && (b[i] == ' ' || b[i] == '\t' || b[i] == ',') {
            i += 1;
        }
        if i >= b.len() {
            return;
        }
        let scheme = token(&mut i);
        if scheme.is_empty() {
            i += 1; // Not a token: skip the character and resynchronise.
            continue;
        }
        let mut ch = Challenge {
            scheme: scheme.to_ascii_lowercase(),
            params: BTreeMap::new(),
        };
        // A token68 (e.g. `Basic dXNlcjpw==`) right after the scheme.
        let mut k = i;
        skip_ws(&mut k);
        if k > i && k < b.len() && b[k] != ',' && looks_like_token68(&b, k) {
            i = k;
            while i < b.len() && b[i] != ',' {
                i += 1;
            }
        }
        // Parameters until the next challenge (a token not followed by '=').
        loop {
            while i < b.len() && (b[i] == ' ' || b[i] == '\t' || b[i] == ',') {
                i += 1;
            }
            if i >= b.len() {
                break;
            }
            let save = i;
            let name = token(&mut i);
            if name.is_empty() {
                i += 1; // Not a token: skip the character and resynchronise.
                continue;
            }
            let mut j = i;
            skip_ws(&mut j);
            if j >= b.len() || b[j] != '=' {
                i = save;
                break;
            }
            i = j + 1;
            skip_ws(&mut i);
            let value = if i < b.len() && b[i] == '"' {
                i += 1;
                let mut v = String::new();
                while i < b.len() && b[i] != '"' {
                    if b[i] == '\\' && i + 1 < b.len() {
                        i += 1;
                    }
                    v.push(b[i]);
                    i += 1;
                }
                i += 1; // closing quote (or end)
                v
            } else {
                let start = i;
                while i < b.len() && b[i] != ',' && b[i] != ' ' && b[i] != '\t' {
                    i += 1;
                }
                b[start..i].iter().collect()
            };
            ch.params.insert(name.to_ascii_lowercase(), value);
        }
        out.push(ch);
    }
}

/// A token68 right after the scheme: token68 characters then only '=' up to a ',' or the end.
fn looks_like_token68(b: &[char], start: usize) -> bool {
    let mut i = start;
    while i < b.len() && (b[i].is_ascii_alphanumeric() || "-._~+/".contains(b[i])) {
        i += 1;
    }
    if i < b.len() && b[i] != '=' {
        return false;
    }
    while i < b.len() && b[i] == '=' {
        i += 1;
    }
    let mut j = i;
    while j < b.len() && (b[j] == ' ' || b[j] == '\t') {
        j += 1;
    }
    j >= b.len() || b[j] == ','
}

/// Remembered challenges per registry host and bearer tokens per (realm, service, scopes,
/// credentials), so later requests authenticate up front instead of meeting a 401 each time.
#[derive(Default)]
pub(crate) struct AuthCache {
    challenges: Mutex<HashMap<String, Challenge>>,
    tokens: Mutex<HashMap<TokenKey, CachedToken>>,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct TokenKey {
    realm: String,
    service: String,
    scopes: String,
    who: String,
}

impl TokenKey {
    pub(crate) fn new(ch: &Challenge, scopes: &[String], secret: Option<&Secret>) -> Self {
        TokenKey {
            realm: ch.param("realm").unwrap_or_default().to_string(),
            service: ch.param("service").unwrap_or_default().to_string(),
            scopes: scopes.join(" "),
            who: secret.map(Secret::fingerprint).unwrap_or_default(),
        }
    }
}

struct CachedToken {
    token: String,
    expires: Instant,
}

impl AuthCache {
    /// The challenge last seen from `host` (without its request-specific `scope`).
    pub(crate) fn challenge(&self, host: &str) -> Option<Challenge> {
        lock(&self.challenges).get(host).cloned()
    }

    pub(crate) fn set_challenge(&self, host: &str, ch: &Challenge) {
        let mut ch = ch.clone();
        ch.params.remove("scope");
        ch.params.remove("error");
        ch.params.remove("error_description");
        lock(&self.challenges).insert(host.to_string(), ch);
    }

    pub(crate) fn token(&self, key: &TokenKey) -> Option<String> {
        let mut tokens = lock(&self.tokens);
        match tokens.get(key) {
            Some(t) if t.expires > Instant::now() => Some(t.token.clone()),
            Some(_) => {
                tokens.remove(key);
                None
            }
            None => None,
        }
    }

    /// Caches a token for `expires_in` (60s when the server does not say: the Docker token
    /// spec's default and minimum), less a margin for clock and transit.
    pub(crate) fn put_token(&self, key: TokenKey, token: String, expires_in: Option<u64>) {
        let secs = expires_in.unwrap_or(60).max(60);
        let life = Duration::from_secs(secs).saturating_sub(Duration::from_secs(secs / 10));
        let mut tokens = lock(&self.tokens);
        let now = Instant::now();
        tokens.retain(|_, t| t.expires > now);
        tokens.insert(
            key,
            CachedToken {
                token,
                expires: now + life,
            },
        );
    }

    pub(crate) fn forget_token(&self, key: &TokenKey) {
        lock(&self.tokens).remove(key);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The scopes of a token request for pulling `repository`, merged with the scope a challenge
/// asked for (sorted, deduplicated: containerd's `GetTokenScopes`).
pub(crate) fn pull_scopes(repository: &str, challenge: Option<&Challenge>) -> Vec<String> {
    let mut scopes = vec![format!("repository:{repository}:pull")];
    if let Some(s) = challenge.and_then(|c| c.param("scope")) {
        scopes.extend(s.split(' ').filter(|s| !s.is_empty()).map(str::to_string));
    }
    scopes.sort();
    scopes.dedup();
    scopes
}

/// A token endpoint's answer (`token` and `access_token` are synonyms; containerd prefers
/// `access_token` when both are present).
#[derive(serde::Deserialize)]
pub(crate) struct TokenResponse {
    #[serde(default)]
    pub token: String,
    #[serde(default)]
    pub access_token: String,
    #[serde(default)]
    pub expires_in: Option<u64>,
}

impl TokenResponse {
    pub(crate) fn into_token(self) -> Option<(String, Option<u64>)> {
        let t = if !self.access_token.is_empty() {
            self.access_token
        } else {
            self.token
        };
        (!t.is_empty()).then_some((t, self.expires_in.filter(|e| *e > 0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(scheme: &str, params: &[(&str, &str)]) -> Challenge {
        Challenge {
            scheme: scheme.into(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn parses_challenges() {
        assert_eq!(
            parse_www_authenticate([
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull""#
            ]),
            vec![ch(
                "bearer",
                &[
                    ("realm", "https://auth.docker.io/token"),
                    ("service", "registry.docker.io"),
                    ("scope", "repository:library/busybox:pull"),
                ]
            )]
        );
        assert_eq!(
            parse_www_authenticate([r#"Basic realm="Registry Realm""#]),
            vec![ch("basic", &[("realm", "Registry Realm")])]
        );
        // Whitespace, unquoted values, case, escapes, several challenges in one value.
        assert_eq!(
            parse_www_authenticate([
                r#"  BEARER  Realm = "http://a/t?x=1" , service=reg ,scope="repository:a:pull repository:b:pull",error="insufficient_scope", Basic realm="q\"uoted\\""#
            ]),
            vec![
                ch(
                    "bearer",
                    &[
                        ("realm", "http://a/t?x=1"),
                        ("service", "reg"),
                        ("scope", "repository:a:pull repository:b:pull"),
                        ("error", "insufficient_scope"),
                    ]
                ),
                ch("basic", &[("realm", "q\"uoted\\")]),
            ]
        );
        // Several header values, a token68 and a bare scheme.
        assert_eq!(
            parse_www_authenticate(["Negotiate abc+/9==, Basic", r#"Bearer realm="r""#]),
            vec![
                ch("negotiate", &[]),
                ch("basic", &[]),
                ch("bearer", &[("realm", "r")])
            ]
        );
        assert!(parse_www_authenticate([""]).is_empty());
        // Garbage does not panic.
        let _ = parse_www_authenticate([r#"=,="" Bearer realm="unterminated"#]);
    }

    #[test]
    fn scopes() {
        assert_eq!(
            pull_scopes("library/busybox", None),
            ["repository:library/busybox:pull"]
        );
        let c = ch(
            "bearer",
            &[("scope", "repository:library/busybox:pull repository:x:pull")],
        );
        assert_eq!(
            pull_scopes("library/busybox", Some(&c)),
            ["repository:library/busybox:pull", "repository:x:pull"]
        );
    }

    #[test]
    fn credentials_like_parse_auth() {
        let c = Credentials {
            username: "u".into(),
            password: "p".into(),
            ..Default::default()
        };
        assert!(
            matches!(c.secret_for("r.io", "r.io").unwrap(), Some(Secret::Basic { username, password }) if username == "u" && password == "p")
        );

        use base64::Engine as _;
        let c = Credentials {
            auth: base64::engine::general_purpose::STANDARD.encode("user:pa:ss\0"),
            ..Default::default()
        };
        assert!(
            matches!(c.secret_for("r.io", "r.io").unwrap(), Some(Secret::Basic { username, password }) if username == "user" && password == "pa:ss")
        );
        let c = Credentials {
            auth: base64::engine::general_purpose::STANDARD.encode("nocolon"),
            ..Default::default()
        };
        assert!(c.secret_for("r.io", "r.io").is_err());

        let c = Credentials {
            identity_token: "it".into(),
            registry_token: "rt".into(),
            ..Default::default()
        };
        assert!(
            matches!(c.secret_for("r.io", "r.io").unwrap(), Some(Secret::IdentityToken(t)) if t == "it")
        );
        let c = Credentials {
            registry_token: "rt".into(),
            ..Default::default()
        };
        assert!(
            matches!(c.secret_for("r.io", "r.io").unwrap(), Some(Secret::RegistryToken(t)) if t == "rt")
        );

        // server_address scopes the credentials.
        let c = Credentials {
            username: "u".into(),
            password: "p".into(),
            server_address: "https://127.0.0.1:5000/v2/".into(),
            ..Default::default()
        };
        assert!(
            c.secret_for("127.0.0.1:5000", "127.0.0.1:5000")
                .unwrap()
                .is_some()
        );
        assert!(c.secret_for("mirror.io", "other.io").unwrap().is_none());
        let c = Credentials {
            username: "u".into(),
            server_address: "index.docker.io".into(),
            ..Default::default()
        };
        assert!(
            c.secret_for("registry-1.docker.io", "docker.io")
                .unwrap()
                .is_some()
        );

        assert!(
            Credentials::anonymous()
                .secret_for("r.io", "r.io")
                .unwrap()
                .is_none()
        );
        let dbg = format!(
            "{:?}",
            Credentials {
                password: "hunter2".into(),
                ..Default::default()
            }
        );
        assert!(!dbg.contains("hunter2"));
    }

    #[test]
    fn token_cache() {
        let cache = AuthCache::default();
        let c = ch(
            "bearer",
            &[("realm", "r"), ("service", "s"), ("scope", "x")],
        );
        let k = TokenKey::new(&c, &pull_scopes("a", None), None);
        assert!(cache.token(&k).is_none());
        cache.put_token(k.clone(), "t".into(), Some(300));
        assert_eq!(cache.token(&k).as_deref(), Some("t"));
        let other = TokenKey::new(
            &c,
            &pull_scopes("a", None),
            Some(&Secret::RegistryToken("z".into())),
        );
        assert!(cache.token(&other).is_none());
        cache.forget_token(&k);
        assert!(cache.token(&k).is_none());

        cache.set_challenge("h", &c);
        let got = cache.challenge("h").unwrap();
        assert_eq!(got.param("realm"), Some("r"));
        assert_eq!(got.param("scope"), None);

        let t: TokenResponse =
            serde_json::from_str(r#"{"token":"a","access_token":"b","expires_in":0}"#).unwrap();
        assert_eq!(t.into_token(), Some(("b".to_string(), None)));
        let t: TokenResponse = serde_json::from_str(r#"{"token":"a","expires_in":120}"#).unwrap();
        assert_eq!(t.into_token(), Some(("a".to_string(), Some(120))));
        let t: TokenResponse = serde_json::from_str(r#"{}"#).unwrap();
        assert_eq!(t.into_token(), None);
    }
}
