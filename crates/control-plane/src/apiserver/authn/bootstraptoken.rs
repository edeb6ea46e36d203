//! Bootstrap tokens (upstream's `plugin/pkg/auth/authenticator/token/bootstrap` and
//! `k8s.io/cluster-bootstrap`): `<id>.<secret>` tokens kept as Secrets of type
//! `bootstrap.kubernetes.io/token` named `bootstrap-token-<id>` in kube-system. A valid,
//! unexpired token with `usage-bootstrap-authentication` authenticates as
//! `system:bootstrap:<id>` in `system:bootstrappers` plus its `auth-extra-groups`. The
//! token cleaner and bootstrap signer controllers read the same Secrets through
//! [`BootstrapToken`].

use base64::Engine;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::User;
use crate::apiserver::state::ApiState;

pub(crate) const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub(crate) const SECRET_PREFIX: &str = "bootstrap-token-";
pub(crate) const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers";
/// The extra group kubeadm gives the tokens it creates; the CSR approver's bootstrap policy
/// binds node client CSR creation and auto-approval to it.
pub const DEFAULT_NODE_TOKEN_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// A token's two halves, `[a-z0-9]{6}.[a-z0-9]{16}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenParts<'a> {
    pub id: &'a str,
    pub secret: &'a str,
}

fn lower_alnum(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Splits a bearer token of the bootstrap format; `None` for anything else (another
/// authenticator may own it).
pub fn parse_token(token: &str) -> Option<TokenParts<'_>> {
    let (id, secret) = token.split_once('.')?;
    (lower_alnum(id, 6) && lower_alnum(secret, 16)).then_some(TokenParts { id, secret })
}

/// Upstream's `BootstrapGroupPattern` for `auth-extra-groups`:
/// `system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]`.
pub fn valid_extra_group(g: &str) -> bool {
    let Some(rest) = g.strip_prefix("system:bootstrappers:") else {
        return false;
    };
    let Some(last) = rest.bytes().last() else {
        return false;
    };
    rest.len() <= 256
        && (last.is_ascii_lowercase() || last.is_ascii_digit())
        && rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
}

/// A generated token, as `kubeadm token generate`: 6 + 16 characters of `[a-z0-9]`.
pub fn generate_token() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let pick = |n: usize| -> String {
        (0..n)
            .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
            .collect()
    };
    format!("{}.{}", pick(6), pick(16))
}

/// A bootstrap token Secret's fields, decoded.
#[derive(Clone, Debug, Default)]
pub(crate) struct BootstrapToken {
    pub id: String,
    pub secret: String,
    pub expiration: Option<String>,
    pub usage_authentication: bool,
    pub usage_signing: bool,
    pub extra_groups: Vec<String>,
}

impl BootstrapToken {
    /// Reads a Secret of the bootstrap type named after its token id; `None` otherwise.
    pub fn from_secret(secret: &Value) -> Option<BootstrapToken> {
        if secret.get("type").and_then(Value::as_str) != Some(SECRET_TYPE) {
            return None;
        }
        let data = secret.get("data").and_then(Value::as_object)?;
        let field = |k: &str| -> Option<String> {
            let raw = data.get(k)?.as_str()?;
            let bytes = base64::engine::general_purpose::STANDARD.decode(raw).ok()?;
            String::from_utf8(bytes).ok()
        };
        let id = field("token-id")?;
        let name = secret.pointer("/metadata/name").and_then(Value::as_str)?;
        if name != format!("{SECRET_PREFIX}{id}") {
            return None;
        }
        Some(BootstrapToken {
            secret: field("token-secret")?,
            expiration: field("expiration").filter(|e| !e.is_empty()),
            usage_authentication: field("usage-bootstrap-authentication").as_deref()
                == Some("true"),
            usage_signing: field("usage-bootstrap-signing").as_deref() == Some("true"),
            extra_groups: field("auth-extra-groups")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(str::to_string)
                .collect(),
            id,
        })
    }

    /// Upstream treats an unparseable expiration as expired.
    pub fn expired(&self, now: Timestamp) -> bool {
        match &self.expiration {
            None => false,
            Some(e) => e.parse::<Timestamp>().map_or(true, |t| t <= now),
        }
    }

    /// The identity the token authenticates as; `None` when its extra groups are malformed.
    pub fn user(&self) -> Option<User> {
        let mut groups = vec![BOOTSTRAPPERS_GROUP.to_string()];
        for g in &self.extra_groups {
            if !valid_extra_group(g) {
                return None;
            }
            if !groups.contains(g) {
                groups.push(g.clone());
            }
        }
        groups.push("system:authenticated".into());
        Some(User {
            name: format!("system:bootstrap:{}", self.id),
            groups,
            ..Default::default()
        })
    }
}

/// HMAC-SHA256 (RFC 2104) over sha2, the one MAC the bootstrap signer needs.
fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// cluster-bootstrap's `ComputeDetachedSignature`: a compact JWS (HS256, `kid` the token
/// id, keyed by the token secret) of `content` with the payload left out:
/// `<header>..<signature>`.
pub fn compute_detached_signature(content: &str, token_id: &str, token_secret: &str) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    let header = B64.encode(format!(r#"{{"alg":"HS256","kid":"{token_id}"}}"#));
    let signing_input = format!("{header}.{}", B64.encode(content));
    let sig = hmac_sha256(token_secret.as_bytes(), signing_input.as_bytes());
    format!("{header}..{}", B64.encode(sig))
}

/// cluster-bootstrap's `DetachedTokenIsValid`: whether `detached` signs `content` with the
/// token.
pub fn detached_token_is_valid(
    detached: &str,
    content: &str,
    token_id: &str,
    token_secret: &str,
) -> bool {
    let want = compute_detached_signature(content, token_id, token_secret);
    constant_time_eq(want.as_bytes(), detached.as_bytes())
}

/// Compares without an early exit, so the time taken does not leak how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The bootstrap token authenticator: `None` (401) for a token of another format, an
/// unknown id, a wrong secret, an expired or deleted token, one not usable for
/// authentication, or malformed extra groups.
pub fn authenticate(st: &ApiState, token: &str) -> Option<User> {
    let parts = parse_token(token)?;
    let key = format!("/core/secrets/kube-system/{SECRET_PREFIX}{}", parts.id);
    let secret = st.store.get(&key).ok()??;
    if secret
        .object
        .pointer("/metadata/deletionTimestamp")
        .is_some()
    {
        return None;
    }
    let tok = BootstrapToken::from_secret(&secret.object)?;
    if !constant_time_eq(tok.secret.as_bytes(), parts.secret.as_bytes()) {
        tracing::debug!(token_id = parts.id, "bootstrap token secret does not match");
        return None;
    }
    if tok.expired(crate::apiserver::rest::now_ts()) {
        tracing::debug!(token_id = parts.id, "bootstrap token has expired");
        return None;
    }
    if !tok.usage_authentication {
        return None;
    }
    tok.user()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn token_format_is_six_dot_sixteen_lowercase_alnum() {
        let cases = [
            ("abcdef.0123456789abcdef", true),
            ("abcdef.0123456789abcde", false),
            ("ABCDEF.0123456789abcdef", false),
            ("abcdef0123456789abcdef", false),
            ("abcde.0123456789abcdefg", false),
            ("abcdef.0123456789abcdef.x", false),
            ("", false),
        ];
        for (t, ok) in cases {
            assert_eq!(parse_token(t).is_some(), ok, "{t}");
        }
        let t = generate_token();
        assert!(parse_token(&t).is_some(), "{t}");
    }

    #[test]
    fn extra_groups_must_be_under_system_bootstrappers() {
        for (g, ok) in [
            (DEFAULT_NODE_TOKEN_GROUP, true),
            ("system:bootstrappers:x", true),
            ("system:bootstrappers:", false),
            ("system:bootstrappers:x-", false),
            ("system:masters", false),
            ("system:bootstrappers:Upper", false),
        ] {
            assert_eq!(valid_extra_group(g), ok, "{g}");
        }
    }

    #[test]
    fn hmac_matches_rfc4231() {
        // RFC 4231 test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn detached_jws_round_trips_and_binds_content_and_token() {
        let sig = compute_detached_signature("kubeconfig", "abcdef", "0123456789abcdef");
        let (header, rest) = sig.split_once("..").unwrap();
        assert!(!rest.is_empty() && !rest.contains('.'));
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let h = URL_SAFE_NO_PAD.decode(header).unwrap();
        assert_eq!(
            String::from_utf8(h).unwrap(),
            r#"{"alg":"HS256","kid":"abcdef"}"#
        );
        assert!(detached_token_is_valid(
            &sig,
            "kubeconfig",
            "abcdef",
            "0123456789abcdef"
        ));
        assert!(!detached_token_is_valid(
            &sig,
            "kubeconfig2",
            "abcdef",
            "0123456789abcdef"
        ));
        assert!(!detached_token_is_valid(
            &sig,
            "kubeconfig",
            "abcdef",
            "0123456789abcdeg"
        ));
    }

    fn secret(fields: &[(&str, &str)]) -> Value {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let data: serde_json::Map<String, Value> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), json!(b64(v))))
            .collect();
        json!({"metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"},
            "type": SECRET_TYPE, "data": data})
    }

    #[test]
    fn secret_fields_decide_identity_and_expiry() {
        let s = secret(&[
            ("token-id", "abcdef"),
            ("token-secret", "0123456789abcdef"),
            ("usage-bootstrap-authentication", "true"),
            ("auth-extra-groups", DEFAULT_NODE_TOKEN_GROUP),
            ("expiration", "2030-01-01T00:00:00Z"),
        ]);
        let tok = BootstrapToken::from_secret(&s).unwrap();
        let u = tok.user().unwrap();
        assert_eq!(u.name, "system:bootstrap:abcdef");
        assert_eq!(
            u.groups,
            vec![
                "system:bootstrappers",
                DEFAULT_NODE_TOKEN_GROUP,
                "system:authenticated"
            ]
        );
        let before: Timestamp = "2029-12-31T23:59:59Z".parse().unwrap();
        let after: Timestamp = "2030-01-01T00:00:01Z".parse().unwrap();
        assert!(!tok.expired(before));
        assert!(tok.expired(after));
        let bad_time = secret(&[
            ("token-id", "abcdef"),
            ("token-secret", "x"),
            ("expiration", "soon"),
        ]);
        assert!(
            BootstrapToken::from_secret(&bad_time)
                .unwrap()
                .expired(before)
        );
        let bad_group = secret(&[
            ("token-id", "abcdef"),
            ("token-secret", "x"),
            ("auth-extra-groups", "system:masters"),
        ]);
        assert!(
            BootstrapToken::from_secret(&bad_group)
                .unwrap()
                .user()
                .is_none()
        );
        let other_id = secret(&[("token-id", "zzzzzz"), ("token-secret", "x")]);
        assert!(BootstrapToken::from_secret(&other_id).is_none());
    }
}
