//! Per-key exponential back-off (upstream's flowcontrol.Backoff): container restarts
//! (CrashLoopBackOff, 10s doubling to 5m) and image pulls (ImagePullBackOff).

use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Entry {
    backoff: Duration,
    last_update: Instant,
}

#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    /// Records another failure at `at` and returns the delay it now imposes. An entry left
    /// alone for twice the maximum starts over: a container that ran 10 minutes (at the
    /// default 5m cap) is no longer crash-looping.
    pub fn next(&mut self, key: &str, at: Instant) -> Duration {
        let (initial, max) = (self.initial, self.max);
        let e = self.entries.entry(key.to_string()).or_insert(Entry {
            backoff: Duration::ZERO,
            last_update: at,
        });
        if e.backoff.is_zero() || at.saturating_duration_since(e.last_update) > 2 * max {
            e.backoff = initial;
        } else {
            e.backoff = (e.backoff * 2).min(max);
        }
        e.last_update = at;
        e.backoff
    }

    /// Whether an event at `since` (e.g. the container's exit) is still inside the key's
    /// back-off window at `now`; returns the window.
    pub fn in_backoff_since(&self, key: &str, since: Instant, now: Instant) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if since.saturating_duration_since(e.last_update) > 2 * self.max {
            return None;
        }
        (now.saturating_duration_since(since) < e.backoff).then_some(e.backoff)
    }

    /// Whether `now` is inside the window that started at the key's last failure.
    pub fn in_backoff_since_update(&self, key: &str, now: Instant) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| now.saturating_duration_since(e.last_update) < e.backoff)
    }

    pub fn current(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.backoff)
    }

    pub fn reset(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Drops entries untouched for twice the maximum (upstream's GC).
    pub fn gc(&mut self, now: Instant) {
        let max = self.max;
        self.entries
            .retain(|_, e| now.saturating_duration_since(e.last_update) <= 2 * max);
    }

    /// Drops every key starting with `prefix` (a deleted pod's entries).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets_after_twice_the_cap() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let t0 = Instant::now();
        let secs: Vec<u64> = (0..7)
            .map(|i| b.next("k", t0 + Duration::from_secs(i)).as_secs())
            .collect();
        assert_eq!(secs, vec![10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(
            b.next("k", t0 + Duration::from_secs(6 + 601)).as_secs(),
            10,
            "a quiet 10 minutes resets the back-off"
        );
    }

    #[test]
    fn window_is_measured_from_the_event() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let t0 = Instant::now();
        assert!(b.in_backoff_since("k", t0, t0).is_none());
        b.next("k", t0);
        assert!(
            b.in_backoff_since("k", t0, t0 + Duration::from_secs(5))
                .is_some()
        );
        assert!(
            b.in_backoff_since("k", t0, t0 + Duration::from_secs(11))
                .is_none()
        );
    }
}
