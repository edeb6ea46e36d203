//! Leases for objects that expire, as kube-apiserver's etcd3 `leaseManager`: Events are
//! written with a lease of `--event-ttl`, so etcd itself deletes them when it ends. One lease
//! serves every write of a short window (5 % of the TTL, at most 60 s, at most 1,000 objects),
//! granted that much longer than the TTL, so a burst of Events costs one LeaseGrant and
//! none outlives its TTL by more than the window.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The share of the TTL a lease is reused for, and the most seconds and objects.
const REUSE_PERCENT: u64 = 5;
const MAX_REUSE_SECONDS: u64 = 60;
const MAX_ATTACHED: u64 = 1000;

struct Current {
    id: i64,
    expires: Instant,
    attached: u64,
}

pub(crate) struct LeaseManager {
    ttl: u64,
    current: Mutex<Option<Current>>,
}

impl LeaseManager {
    pub(crate) fn new(ttl: Duration) -> LeaseManager {
        LeaseManager {
            ttl: ttl.as_secs().max(1),
            current: Mutex::new(None),
        }
    }

    fn reuse_seconds(&self) -> u64 {
        (self.ttl * REUSE_PERCENT / 100).min(MAX_REUSE_SECONDS)
    }

    /// The lease a write at `now` attaches, or the TTL in seconds of the one to grant.
    pub(crate) fn reuse(&self, now: Instant) -> Result<i64, i64> {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cur.as_mut() {
            // Valid for the object's whole TTL, and not granted too long ago.
            let valid = now + Duration::from_secs(self.ttl) < c.expires;
            let fresh = now + Duration::from_secs(self.ttl + self.reuse_seconds()) >= c.expires;
            if valid && fresh && c.attached < MAX_ATTACHED {
                c.attached += 1;
                return Ok(c.id);
            }
        }
        Err((self.ttl + self.reuse_seconds()) as i64)
    }

    /// A lease of `ttl` seconds granted at `now`, attached to the write that asked for it.
    pub(crate) fn granted(&self, id: i64, ttl: i64, now: Instant) {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        *cur = Some(Current {
            id,
            expires: now + Duration::from_secs(ttl.max(0) as u64),
            attached: 1,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_serves_the_writes_of_its_window() {
        let m = LeaseManager::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        // Upstream's window for an hour: 5 % is 180 s, capped at 60 s.
        assert_eq!(m.reuse(t0), Err(3660));
        m.granted(7, 3660, t0);
        for (after, want) in [
            (0, Ok(7)),
            (30, Ok(7)),
            (59, Ok(7)),
            // An Event written now would outlive the lease's end.
            (61, Err(3660)),
        ] {
            assert_eq!(m.reuse(t0 + Duration::from_secs(after)), want, "{after}s");
        }
    }

    #[test]
    fn a_lease_holds_at_most_a_thousand_objects() {
        let m = LeaseManager::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        m.granted(1, 3660, t0);
        for _ in 1..MAX_ATTACHED {
            assert_eq!(m.reuse(t0), Ok(1));
        }
        assert_eq!(m.reuse(t0), Err(3660));
    }

    #[test]
    fn a_short_ttl_gets_a_lease_per_write() {
        let m = LeaseManager::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(m.reuse(t0), Err(10));
        m.granted(3, 10, t0);
        assert_eq!(m.reuse(t0), Err(10));
    }
}
