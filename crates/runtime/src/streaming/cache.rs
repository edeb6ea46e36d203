//! Single-use tokens for cached stream requests (the kubelet's `requestCache`): random,
//! URL-safe, valid for a fixed time, consumed by the first connection that presents them.

use super::Request;
use base64::Engine as _;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Too many requests are waiting for their connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("maximum number of in-flight requests exceeded")]
pub struct CacheFull;

/// Token length in random bytes (the kubelet's `tokenLen`).
const TOKEN_BYTES: usize = 8;

pub(crate) struct RequestCache {
    ttl: Duration,
    max: usize,
    entries: Mutex<HashMap<String, (Instant, Request)>>,
}

impl RequestCache {
    pub(crate) fn new(ttl: Duration, max: usize) -> RequestCache {
        RequestCache {
            ttl,
            max,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Request)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `req` and returns its token.
    pub(crate) fn insert(&self, req: Request) -> Result<String, CacheFull> {
        let now = Instant::now();
        let mut entries = self.lock();
        entries.retain(|_, (expires, _)| *expires > now);
        if entries.len() >= self.max {
            return Err(CacheFull);
        }
        let token = loop {
            let bytes: [u8; TOKEN_BYTES] = rand::random();
            let t = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
            if !entries.contains_key(&t) {
                break t;
            }
        };
        entries.insert(token.clone(), (now + self.ttl, req));
        Ok(token)
    }

    /// Takes the request of `token` if it exists and has not expired.
    pub(crate) fn consume(&self, token: &str) -> Option<Request> {
        let (expires, req) = self.lock().remove(token)?;
        (expires > Instant::now()).then_some(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streaming::PortForwardRequest;

    fn pf() -> Request {
        Request::PortForward(PortForwardRequest {
            sandbox_id: "s".into(),
            netns: None,
            ports: vec![],
        })
    }

    #[test]
    fn tokens_are_single_use_expire_and_are_bounded() {
        // The TTL only needs to outlast three inserts, also under the VM lane's emulation.
        let c = RequestCache::new(Duration::from_secs(2), 2);
        let a = c.insert(pf()).unwrap();
        assert_eq!(a.len(), 11, "8 random bytes, unpadded URL-safe base64");
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        let b = c.insert(pf()).unwrap();
        assert_ne!(a, b);
        assert_eq!(c.insert(pf()), Err(CacheFull));
        assert!(c.consume(&a).is_some());
        assert!(c.consume(&a).is_none(), "single use");
        assert!(c.consume("nope").is_none());
        std::thread::sleep(Duration::from_millis(2100));
        assert!(c.consume(&b).is_none(), "expired");
        // Expired entries no longer count against the limit.
        c.insert(pf()).unwrap();
        c.insert(pf()).unwrap();
    }
}
