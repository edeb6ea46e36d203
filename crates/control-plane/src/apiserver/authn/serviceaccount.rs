//! Service-account tokens: the JWTs the `serviceaccounts/token` subresource issues (signed
//! ES256 with the cluster's `sa.key`) and their authentication (signature, issuer,
//! audiences, lifetime, and that the service account and the object the token is bound to
//! still exist with the same uid), as kube-apiserver's `serviceaccount` token
//! authenticator. Also the key's JWKS for OIDC discovery.

use std::collections::BTreeMap;

use base64::Engine;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _,
    UnparsedPublicKey,
};
use serde_json::{Value, json};
use sha2::Digest;

use super::User;
use crate::apiserver::state::ApiState;

/// `--service-account-issuer` when not given (kubeadm's).
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Clock skew tolerated on `exp`, `nbf` and `iat` (go-jose's default leeway, which upstream
/// uses); also how long after its deletion time a bound object still vouches for a token.
const LEEWAY_SECS: i64 = 60;

/// The lifetime a kubelet asks for projected tokens; upstream extends such pod-bound tokens
/// to a year (`--service-account-extend-token-expiration`, on by default) and only warns
/// after the requested hour, so pods with old client libraries keep working.
pub const WARN_ONLY_EXPIRATION_SECS: i64 = 3607;
const EXTENDED_EXPIRATION_SECS: i64 = 365 * 24 * 3600;

/// The signing key pair and its key id.
pub struct Keys {
    pair: EcdsaKeyPair,
    kid: String,
}

fn b64url(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

fn b64url_decode(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .ok()
}

impl Keys {
    /// The key from its PKCS#8 DER (`sa.key`).
    pub fn from_pkcs8(der: &[u8]) -> Result<Keys, String> {
        let rng = ring::rand::SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der, &rng)
            .map_err(|e| format!("service-account key: {e}"))?;
        // Upstream's key id: the unpadded base64url SHA-256 of the public key's DER.
        let spki = crate::pki::p256_spki_der(pair.public_key().as_ref());
        let kid = b64url(&sha2::Sha256::digest(&spki));
        Ok(Keys { pair, kid })
    }

    /// A fresh key (tests and in-memory servers).
    pub fn generate() -> Keys {
        let rng = ring::rand::SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("P-256 key generation");
        Keys::from_pkcs8(doc.as_ref()).expect("a freshly generated key parses")
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// A compact JWS of `claims`.
    pub fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let rng = ring::rand::SystemRandom::new();
        let sig = self
            .pair
            .sign(&rng, input.as_bytes())
            .map(|s| b64url(s.as_ref()))
            .unwrap_or_default();
        format!("{input}.{sig}")
    }

    /// The claims of a token this key signed, or the reason it is not one.
    fn verify(&self, token: &str) -> Result<Value, String> {
        let crypto = || "go-jose/go-jose: error in cryptographic primitive".to_string();
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("failed to parse token".into());
        };
        let sig = b64url_decode(s).ok_or_else(crypto)?;
        let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, self.pair.public_key());
        public
            .verify(format!("{h}.{p}").as_bytes(), &sig)
            .map_err(|_| crypto())?;
        let header: Value = b64url_decode(h)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(crypto)?;
        if header.get("alg").and_then(Value::as_str) != Some("ES256") {
            return Err(crypto());
        }
        b64url_decode(p)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| "failed to parse claims".to_string())
    }

    /// The public key as a JSON Web Key Set (`/openid/v1/jwks`).
    pub fn jwks(&self) -> Value {
        let point = self.pair.public_key().as_ref();
        json!({"keys": [{
            "use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256",
            "x": b64url(&point[1..33]), "y": b64url(&point[33..65]),
        }]})
    }
}

/// A name and uid, as the `kubernetes.io` claim refers to objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

impl ObjectRef {
    fn of(obj: &Value) -> ObjectRef {
        let m = |f: &str| {
            obj.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        ObjectRef {
            name: m("name"),
            uid: m("uid"),
        }
    }
    fn to_json(&self) -> Value {
        json!({"name": self.name, "uid": self.uid})
    }
    fn from_json(v: Option<&Value>) -> Option<ObjectRef> {
        let v = v?;
        Some(ObjectRef {
            name: v.get("name")?.as_str()?.to_string(),
            uid: v
                .get("uid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        })
    }
}

/// What a service-account token says, public and private (`kubernetes.io`) claims.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claims {
    pub issuer: String,
    pub audiences: Vec<String>,
    pub issued_at: i64,
    pub not_before: i64,
    pub expires_at: i64,
    pub id: String,
    pub namespace: String,
    pub service_account: ObjectRef,
    pub pod: Option<ObjectRef>,
    pub secret: Option<ObjectRef>,
    pub node: Option<ObjectRef>,
    /// Upstream's `warnafter` for tokens whose lifetime was extended.
    pub warn_after: Option<i64>,
}

impl Claims {
    pub fn subject(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.service_account.name
        )
    }

    pub fn to_json(&self) -> Value {
        let mut k = json!({
            "namespace": self.namespace,
            "serviceaccount": self.service_account.to_json(),
        });
        if let Some(p) = &self.pod {
            k["pod"] = p.to_json();
        }
        if let Some(s) = &self.secret {
            k["secret"] = s.to_json();
        }
        if let Some(n) = &self.node {
            k["node"] = n.to_json();
        }
        if let Some(w) = self.warn_after {
            k["warnafter"] = json!(w);
        }
        json!({
            "aud": self.audiences, "exp": self.expires_at, "iat": self.issued_at,
            "iss": self.issuer, "jti": self.id, "kubernetes.io": k,
            "nbf": self.not_before, "sub": self.subject(),
        })
    }

    pub fn from_json(v: &Value) -> Option<Claims> {
        let k = v.get("kubernetes.io")?;
        let int = |f: &str| v.get(f).and_then(Value::as_i64).unwrap_or(0);
        let audiences = match v.get("aud") {
            Some(Value::String(a)) => vec![a.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        Some(Claims {
            issuer: v.get("iss")?.as_str()?.to_string(),
            audiences,
            issued_at: int("iat"),
            not_before: int("nbf"),
            expires_at: int("exp"),
            id: v
                .get("jti")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            namespace: k.get("namespace")?.as_str()?.to_string(),
            service_account: ObjectRef::from_json(k.get("serviceaccount"))?,
            pod: ObjectRef::from_json(k.get("pod")),
            secret: ObjectRef::from_json(k.get("secret")),
            node: ObjectRef::from_json(k.get("node")),
            warn_after: k.get("warnafter").and_then(Value::as_i64),
        })
    }

    /// The token's lifetime against `now` (seconds), with upstream's leeway and messages.
    pub fn check_time(&self, now: i64) -> Result<(), &'static str> {
        if self.not_before != 0 && now + LEEWAY_SECS < self.not_before {
            return Err("service account token is not valid yet");
        }
        if self.expires_at != 0 && now - LEEWAY_SECS > self.expires_at {
            return Err("service account token has expired");
        }
        if self.issued_at != 0 && now + LEEWAY_SECS < self.issued_at {
            return Err("service account token is issued in the future");
        }
        Ok(())
    }

    /// The user the token authenticates as.
    pub fn user(&self) -> User {
        let mut extra = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            if !v.is_empty() {
                extra.insert(format!("authentication.kubernetes.io/{k}"), vec![v.into()]);
            }
        };
        if let Some(p) = &self.pod {
            put("pod-name", &p.name);
            put("pod-uid", &p.uid);
        }
        if let Some(n) = &self.node {
            put("node-name", &n.name);
            put("node-uid", &n.uid);
        }
        if !self.id.is_empty() {
            put("credential-id", &format!("JTI={}", self.id));
        }
        User {
            name: self.subject(),
            uid: self.service_account.uid.clone(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", self.namespace),
                "system:authenticated".into(),
            ],
            extra,
        }
    }
}

/// The object a TokenRequest binds its token to.
#[derive(Clone, Debug)]
pub enum Bound {
    Pod(Value),
    Secret(Value),
    Node(Value),
}

/// What a TokenRequest asks for, defaults applied.
#[derive(Clone, Debug)]
pub struct TokenSpec {
    pub audiences: Vec<String>,
    pub expiration_seconds: i64,
    /// Whether every audience is one of the API server's own.
    pub kube_audiences: bool,
}

/// The claims of a new token for `sa` issued at `now`.
pub fn new_claims(
    issuer: &str,
    spec: TokenSpec,
    sa: &Value,
    bound: Option<&Bound>,
    node: Option<ObjectRef>,
    now: i64,
) -> Claims {
    let TokenSpec {
        audiences,
        expiration_seconds: expiration,
        kube_audiences,
    } = spec;
    let sa_ref = ObjectRef::of(sa);
    let namespace = sa
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let (pod, secret, node) = match bound {
        // A pod-bound token also names the pod's node; a secret-bound one no node.
        Some(Bound::Pod(p)) => (Some(ObjectRef::of(p)), None, node),
        Some(Bound::Secret(s)) => (None, Some(ObjectRef::of(s)), None),
        Some(Bound::Node(n)) => (None, None, Some(ObjectRef::of(n))),
        None => (None, None, None),
    };
    let (exp, warn_after) =
        if pod.is_some() && expiration == WARN_ONLY_EXPIRATION_SECS && kube_audiences {
            (EXTENDED_EXPIRATION_SECS, Some(now + expiration))
        } else {
            (expiration, None)
        };
    Claims {
        issuer: issuer.to_string(),
        audiences,
        issued_at: now,
        not_before: now,
        expires_at: now + exp,
        id: crate::apiserver::rest::new_uid(),
        namespace,
        service_account: sa_ref,
        node,
        pod,
        secret,
        warn_after,
    }
}

/// An authenticated token: the user and the audiences it was accepted for.
#[derive(Clone, Debug)]
pub struct Accepted {
    pub user: User,
    pub audiences: Vec<String>,
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quote_list(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| nodus_k8s::status::go_quote(s)).collect();
    format!("[{}]", items.join(" "))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Seconds since the epoch of an RFC 3339 time.
fn unix_of(ts: &str) -> Option<i64> {
    ts.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

/// Whether an object was deleted longer ago than the leeway.
fn deleted_before(obj: &Value, now: i64) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .and_then(unix_of)
        .is_some_and(|t| t + LEEWAY_SECS < now)
}

fn uid_of(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

const INVALIDATED: &str = "service account token has been invalidated";

/// Checks `token` if it is a service-account JWT of this issuer: `Ok(None)` when it is not
/// one (another authenticator's token), `Err` with upstream's reason when it is one but is
/// refused. `requested` is the audiences asked for (a TokenReview's); default the API
/// server's own.
pub fn authenticate(
    st: &ApiState,
    token: &str,
    requested: Option<&[String]>,
) -> Result<Option<Accepted>, String> {
    // Only tokens that look like ours (a JWT whose `iss` is this issuer) are this
    // authenticator's to refuse, as upstream's `hasCorrectIssuer`.
    let Some(payload) = token
        .split('.')
        .nth(1)
        .filter(|_| token.split('.').count() == 3)
        .and_then(b64url_decode)
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
    else {
        return Ok(None);
    };
    if payload.get("iss").and_then(Value::as_str) != Some(st.config.service_account_issuer.as_str())
    {
        return Ok(None);
    }
    let claims_json = st.sa_keys.verify(token)?;
    let claims = Claims::from_json(&claims_json)
        .ok_or_else(|| "service account token claims could not be validated".to_string())?;
    let implicit = &st.config.api_audiences;
    let requested = requested.unwrap_or(implicit);
    let token_auds = if claims.audiences.is_empty() {
        implicit.clone()
    } else {
        claims.audiences.clone()
    };
    let accepted: Vec<String> = token_auds
        .iter()
        .filter(|a| requested.contains(a))
        .cloned()
        .collect();
    if accepted.is_empty() {
        return Err(format!(
            "token audiences {} is invalid for the target audiences {}",
            go_quote_list(&token_auds),
            go_quote_list(requested)
        ));
    }
    let now = unix_now();
    claims.check_time(now)?;
    validate_objects(st, &claims, now)?;
    Ok(Some(Accepted {
        user: claims.user(),
        audiences: accepted,
    }))
}

/// The service account and the bound pod or secret must still exist, with the token's uids,
/// and not have been deleted (beyond the leeway).
fn validate_objects(st: &ApiState, c: &Claims, now: i64) -> Result<(), String> {
    let ns = &c.namespace;
    let get = |plural: &str, name: &str| {
        st.store
            .get(&format!("/core/{plural}/{ns}/{name}"))
            .map_err(|e| e.to_string())
            .map(|o| o.map(|s| s.object))
    };
    let sa_name = &c.service_account.name;
    let sa = get("serviceaccounts", sa_name)?.ok_or_else(|| {
        format!(
            "serviceaccounts {} not found",
            nodus_k8s::status::go_quote(sa_name)
        )
    })?;
    if uid_of(&sa) != c.service_account.uid {
        return Err(format!(
            "service account UID ({}) does not match claim ({})",
            uid_of(&sa),
            c.service_account.uid
        ));
    }
    if deleted_before(&sa, now) {
        return Err(format!("service account {ns}/{sa_name} has been deleted"));
    }
    if let Some(r) = &c.secret {
        let s = get("secrets", &r.name)?.ok_or(INVALIDATED)?;
        if uid_of(&s) != r.uid {
            return Err(format!(
                "secret UID ({}) does not match service account secret ref claim ({})",
                uid_of(&s),
                r.uid
            ));
        }
        if deleted_before(&s, now) {
            return Err(INVALIDATED.into());
        }
    }
    if let Some(r) = &c.pod {
        let p = get("pods", &r.name)?.ok_or(INVALIDATED)?;
        if uid_of(&p) != r.uid {
            return Err(format!(
                "pod UID ({}) does not match service account pod ref claim ({})",
                uid_of(&p),
                r.uid
            ));
        }
        if deleted_before(&p, now) {
            return Err(INVALIDATED.into());
        }
    }
    // A node-bound token lives as long as its Node; a pod-bound one only names the node.
    if let (None, Some(r)) = (&c.pod, &c.node) {
        let n = st
            .store
            .get(&format!("/core/nodes/{}", r.name))
            .map_err(|e| e.to_string())?
            .map(|o| o.object)
            .ok_or(INVALIDATED)?;
        if uid_of(&n) != r.uid {
            return Err(format!(
                "node UID ({}) does not match service account node ref claim ({})",
                uid_of(&n),
                r.uid
            ));
        }
        if deleted_before(&n, now) {
            return Err(INVALIDATED.into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa() -> Value {
        json!({"metadata": {"name": "builder", "namespace": "ci", "uid": "sa-uid"}})
    }

    fn spec(audiences: Vec<String>, expiration_seconds: i64, kube_audiences: bool) -> TokenSpec {
        TokenSpec {
            audiences,
            expiration_seconds,
            kube_audiences,
        }
    }

    fn pod() -> Value {
        json!({"metadata": {"name": "web", "namespace": "ci", "uid": "pod-uid"}})
    }

    #[test]
    fn claims_carry_the_bound_pod_and_node_and_round_trip() {
        let bound = Bound::Pod(pod());
        let node = ObjectRef {
            name: "n1".into(),
            uid: "node-uid".into(),
        };
        let c = new_claims(
            DEFAULT_ISSUER,
            spec(vec!["vault".into()], 600, false),
            &sa(),
            Some(&bound),
            Some(node),
            1_000,
        );
        let v = c.to_json();
        assert_eq!(v["sub"], "system:serviceaccount:ci:builder");
        assert_eq!(v["aud"], json!(["vault"]));
        assert_eq!(
            (v["iat"].clone(), v["nbf"].clone()),
            (json!(1000), json!(1000))
        );
        assert_eq!(v["exp"], 1600);
        assert_eq!(
            v["kubernetes.io"]["pod"],
            json!({"name": "web", "uid": "pod-uid"})
        );
        assert_eq!(v["kubernetes.io"]["node"]["name"], "n1");
        assert_eq!(v["kubernetes.io"]["serviceaccount"]["uid"], "sa-uid");
        assert_eq!(Claims::from_json(&v).as_ref(), Some(&c));
        let u = c.user();
        assert_eq!(u.name, "system:serviceaccount:ci:builder");
        assert_eq!(u.uid, "sa-uid");
        assert_eq!(
            u.groups,
            vec![
                "system:serviceaccounts",
                "system:serviceaccounts:ci",
                "system:authenticated"
            ]
        );
        assert_eq!(
            u.extra["authentication.kubernetes.io/pod-uid"],
            vec!["pod-uid"]
        );
        assert_eq!(
            u.extra["authentication.kubernetes.io/credential-id"],
            vec![format!("JTI={}", c.id)]
        );
    }

    #[test]
    fn kubelet_tokens_are_extended_only_when_pod_bound_for_the_api() {
        let bound = Bound::Pod(pod());
        let aud = vec![DEFAULT_ISSUER.to_string()];
        let c = new_claims(
            DEFAULT_ISSUER,
            spec(aud.clone(), 3607, true),
            &sa(),
            Some(&bound),
            None,
            0,
        );
        assert_eq!(
            (c.expires_at, c.warn_after),
            (EXTENDED_EXPIRATION_SECS, Some(3607))
        );
        let c = new_claims(
            DEFAULT_ISSUER,
            spec(aud.clone(), 3607, true),
            &sa(),
            None,
            None,
            0,
        );
        assert_eq!((c.expires_at, c.warn_after), (3607, None));
        let c = new_claims(
            DEFAULT_ISSUER,
            spec(aud, 3607, false),
            &sa(),
            Some(&bound),
            None,
            0,
        );
        assert_eq!(c.expires_at, 3607);
    }

    #[test]
    fn lifetime_is_checked_with_a_minute_of_leeway() {
        let c = Claims {
            issued_at: 1000,
            not_before: 1000,
            expires_at: 2000,
            ..Default::default()
        };
        assert_eq!(c.check_time(1500), Ok(()));
        assert_eq!(c.check_time(2060), Ok(()));
        assert_eq!(c.check_time(2061), Err("service account token has expired"));
        assert_eq!(c.check_time(940), Ok(()));
        assert_eq!(
            c.check_time(939),
            Err("service account token is not valid yet")
        );
    }

    #[test]
    fn signatures_verify_and_tampering_is_caught() {
        let keys = Keys::generate();
        let claims = json!({"iss": DEFAULT_ISSUER, "sub": "x"});
        let tok = keys.sign(&claims);
        assert_eq!(keys.verify(&tok), Ok(claims));
        let mut parts: Vec<&str> = tok.split('.').collect();
        let forged = b64url(
            json!({"iss": DEFAULT_ISSUER, "sub": "y"})
                .to_string()
                .as_bytes(),
        );
        parts[1] = &forged;
        assert!(
            keys.verify(&parts.join("."))
                .unwrap_err()
                .contains("cryptographic")
        );
        assert!(Keys::generate().verify(&tok).is_err());
        assert_eq!(keys.jwks()["keys"][0]["kid"], keys.kid());
    }

    #[test]
    fn audiences_are_quoted_like_go() {
        assert_eq!(go_quote_list(&["a".into(), "b".into()]), r#"["a" "b"]"#);
    }
}
