//! The service-account token manager (upstream's pkg/kubelet/token): projected
//! `serviceAccountToken` volumes are rewritten at every pod sync, but a TokenRequest is sent
//! only when the cached token needs refreshing: past 80 % of its life, or older than 24 h
//! (the most any token is kept), each less a small random jitter so a node's pods do not all
//! refresh at once. If the API server cannot answer, a cached token that has not yet expired
//! is used, as upstream does. Tokens of a deleted pod are dropped with it; expired ones are
//! swept at each request.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// upstream's maxTTL: no token is kept longer than this from its issue time.
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// upstream's maxJitter.
const MAX_JITTER: Duration = Duration::from_secs(10);

/// What identifies one token: upstream's keyFunc (service account, namespace, audiences,
/// expiry and the bound object).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    service_account: String,
    audiences: Vec<String>,
    expiration_seconds: i64,
    bound_uid: String,
}

#[derive(Clone, Debug)]
struct Cached {
    token: String,
    /// When the API server said it expires.
    expires: SystemTime,
    /// The life the API server granted (it may extend the requested one).
    lifetime: Duration,
}

impl Cached {
    fn issued(&self) -> SystemTime {
        self.expires
            .checked_sub(self.lifetime)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

/// Whether a token must be requested again at `now` (upstream's requiresRefresh).
fn requires_refresh(c: &Cached, now: SystemTime, jitter: Duration) -> bool {
    if now + jitter >= c.issued() + MAX_TTL {
        return true;
    }
    // Refresh within the last 20 % of the life (plus the jitter).
    let fifth = c.lifetime / 5;
    now + jitter + fifth >= c.expires
}

/// Answers TokenRequests: the API server in the kubelet, a closure in unit tests.
pub(crate) trait Requester: Send + Sync {
    fn request<'a>(
        &'a self,
        namespace: &'a str,
        service_account: &'a str,
        req: TokenRequest,
    ) -> futures::future::BoxFuture<'a, Result<TokenRequest, String>>;
}

struct ApiRequester(kube::Client);

impl Requester for ApiRequester {
    fn request<'a>(
        &'a self,
        namespace: &'a str,
        service_account: &'a str,
        req: TokenRequest,
    ) -> futures::future::BoxFuture<'a, Result<TokenRequest, String>> {
        Box::pin(async move {
            let api: kube::Api<ServiceAccount> = kube::Api::namespaced(self.0.clone(), namespace);
            api.create_subresource(
                "token",
                service_account,
                &kube::api::PostParams::default(),
                &req,
            )
            .await
            .map_err(|e| e.to_string())
        })
    }
}

/// The kubelet's token cache.
pub struct Manager {
    requester: Box<dyn Requester>,
    cache: Mutex<HashMap<Key, Cached>>,
}

impl Manager {
    pub fn new(client: kube::Client) -> Manager {
        Self::with_requester(Box::new(ApiRequester(client)))
    }

    pub(crate) fn with_requester(requester: Box<dyn Requester>) -> Manager {
        Manager {
            requester,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The token for a projected source of pod `pod_uid` (upstream's
    /// GetServiceAccountToken), bound to the pod.
    pub async fn get(
        &self,
        namespace: &str,
        service_account: &str,
        pod_name: &str,
        pod_uid: &str,
        audiences: Vec<String>,
        expiration_seconds: i64,
    ) -> Result<String, String> {
        self.get_at(
            SystemTime::now(),
            jitter(),
            namespace,
            service_account,
            pod_name,
            pod_uid,
            audiences,
            expiration_seconds,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn get_at(
        &self,
        now: SystemTime,
        jitter: Duration,
        namespace: &str,
        service_account: &str,
        pod_name: &str,
        pod_uid: &str,
        audiences: Vec<String>,
        expiration_seconds: i64,
    ) -> Result<String, String> {
        let key = Key {
            namespace: namespace.into(),
            service_account: service_account.into(),
            audiences: audiences.clone(),
            expiration_seconds,
            bound_uid: pod_uid.into(),
        };
        let cached = self.cache.lock().ok().and_then(|mut c| {
            c.retain(|_, t| t.expires > now);
            c.get(&key).cloned()
        });
        if let Some(c) = &cached
            && !requires_refresh(c, now, jitter)
        {
            return Ok(c.token.clone());
        }
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences,
                expiration_seconds: Some(expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod_name.into()),
                    uid: Some(pod_uid.into()),
                }),
            },
            ..Default::default()
        };
        let answer = self
            .requester
            .request(namespace, service_account, req)
            .await
            .and_then(|tr| {
                let lifetime = tr.spec.expiration_seconds.unwrap_or(expiration_seconds);
                let status = tr
                    .status
                    .ok_or_else(|| "the answer had no status".to_string())?;
                let expires: SystemTime = status.expiration_timestamp.0.into();
                Ok(Cached {
                    token: status.token,
                    expires,
                    lifetime: Duration::from_secs(lifetime.max(0) as u64),
                })
            });
        match answer {
            Ok(fresh) => {
                let token = fresh.token.clone();
                if let Ok(mut c) = self.cache.lock() {
                    c.insert(key, fresh);
                }
                Ok(token)
            }
            // upstream: a refresh that fails keeps serving the old token until it expires.
            Err(e) => match cached {
                Some(c) => {
                    tracing::warn!(namespace, service_account, pod = pod_name, error = %e, "couldn't update the service account token; using the cached one until it expires");
                    Ok(c.token)
                }
                None => Err(format!("failed to fetch token: {e}")),
            },
        }
    }

    /// Forgets the tokens bound to pod `uid` (upstream's DeleteServiceAccountToken).
    pub fn delete_pod(&self, uid: &str) {
        if let Ok(mut c) = self.cache.lock() {
            c.retain(|k, _| k.bound_uid != uid);
        }
    }

    /// How many tokens are cached.
    pub fn len(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn jitter() -> Duration {
    use rand::Rng as _;
    Duration::from_millis(rand::rng().random_range(0..MAX_JITTER.as_millis() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::TokenRequestStatus;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Issues `t<n>` tokens living what was asked, from a clock the test sets; fails when
    /// told to.
    struct Issuer {
        now: Arc<Mutex<SystemTime>>,
        issued: Arc<AtomicUsize>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Requester for Issuer {
        fn request<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
            mut req: TokenRequest,
        ) -> futures::future::BoxFuture<'a, Result<TokenRequest, String>> {
            Box::pin(async move {
                if self.fail.load(Ordering::SeqCst) {
                    return Err("connection refused".into());
                }
                let n = self.issued.fetch_add(1, Ordering::SeqCst) + 1;
                let life = req.spec.expiration_seconds.unwrap_or(3600) as u64;
                let now = *self.now.lock().unwrap();
                req.status = Some(TokenRequestStatus {
                    token: format!("t{n}"),
                    expiration_timestamp: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        (now + Duration::from_secs(life)).try_into().unwrap(),
                    ),
                });
                Ok(req)
            })
        }
    }

    #[tokio::test]
    async fn refreshes_at_eighty_percent_and_at_twenty_four_hours() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let clock = Arc::new(Mutex::new(t0));
        let issued = Arc::new(AtomicUsize::new(0));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let m = Manager::with_requester(Box::new(Issuer {
            now: clock.clone(),
            issued: issued.clone(),
            fail: fail.clone(),
        }));
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let get = |now: SystemTime, life: i64, uid: &'static str| {
            *clock.lock().unwrap() = now;
            let m = &m;
            async move {
                m.get_at(now, Duration::ZERO, "ns", "sa", "p", uid, vec![], life)
                    .await
            }
        };
        // (seconds after t0, expected token) for a one-hour token: reused until 48 min.
        for (secs, want) in [
            (0, "t1"),
            (60, "t1"),
            (2879, "t1"),
            (2880, "t2"),
            (2900, "t2"),
        ] {
            assert_eq!(get(at(secs), 3600, "a").await.unwrap(), want, "at {secs}s");
        }
        // A 48-hour token is refreshed at 24 h although 80 % comes later.
        assert_eq!(get(at(0), 48 * 3600, "b").await.unwrap(), "t3");
        assert_eq!(get(at(23 * 3600), 48 * 3600, "b").await.unwrap(), "t3");
        assert_eq!(get(at(24 * 3600), 48 * 3600, "b").await.unwrap(), "t4");
        // Each pod has its own token; deleting the pod drops its tokens only.
        assert_eq!(get(at(24 * 3600), 48 * 3600, "c").await.unwrap(), "t5");
        m.delete_pod("c");
        assert_eq!(m.len(), 1, "a's token expired and was swept; b's stays");
        // A failing API server: the cached token serves until it expires, then the error.
        fail.store(true, Ordering::SeqCst);
        assert_eq!(get(at(44 * 3600), 48 * 3600, "b").await.unwrap(), "t4");
        let e = get(at(73 * 3600), 48 * 3600, "b").await.unwrap_err();
        assert!(
            e.starts_with("failed to fetch token: connection refused"),
            "{e}"
        );
        assert_eq!(issued.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn jitter_moves_the_refresh_earlier() {
        let c = Cached {
            token: String::new(),
            expires: SystemTime::UNIX_EPOCH + Duration::from_secs(3600),
            lifetime: Duration::from_secs(3600),
        };
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(2875);
        assert!(!requires_refresh(&c, t, Duration::ZERO));
        assert!(requires_refresh(&c, t, Duration::from_secs(5)));
    }
}
