//! Back-off for replacing failed daemon pods (upstream's failedPodsBackoff: 1 s doubling to
//! 15 min per DaemonSet and node), so a pod the kubelet keeps rejecting is not recreated
//! in a hot loop.

use std::collections::HashMap;
use std::time::{Duration, Instant};

const INITIAL: Duration = Duration::from_secs(1);
const MAX: Duration = Duration::from_secs(15 * 60);

#[derive(Default)]
pub(crate) struct Backoff {
    /// key → (current delay, when it was last moved on).
    entries: HashMap<String, (Duration, Instant)>,
}

impl Backoff {
    /// Still waiting out the delay since the last failure: how much longer.
    pub(crate) fn remaining(&self, key: &str, now: Instant) -> Option<Duration> {
        let (delay, since) = self.entries.get(key)?;
        let elapsed = now.saturating_duration_since(*since);
        (elapsed < *delay).then(|| *delay - elapsed)
    }

    /// Records a failure: the first (or one after a long quiet spell) waits 1 s, each next
    /// one twice as long, up to 15 min.
    pub(crate) fn next(&mut self, key: &str, now: Instant) {
        let e = self
            .entries
            .entry(key.to_string())
            .or_insert((Duration::ZERO, now));
        let expired = now.saturating_duration_since(e.1) > 2 * MAX;
        e.0 = if e.0.is_zero() || expired {
            INITIAL
        } else {
            (e.0 * 2).min(MAX)
        };
        e.1 = now;
    }

    /// Forgets entries quiet for long enough that they would start over anyway.
    pub(crate) fn gc(&mut self, now: Instant) {
        self.entries
            .retain(|_, (_, since)| now.saturating_duration_since(*since) <= 2 * MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        assert_eq!(b.remaining("k", t0), None);
        b.next("k", t0);
        assert_eq!(b.remaining("k", t0), Some(INITIAL));
        assert_eq!(b.remaining("k", t0 + INITIAL), None);
        let t1 = t0 + Duration::from_secs(1);
        b.next("k", t1);
        assert_eq!(b.remaining("k", t1), Some(Duration::from_secs(2)));
        let mut t = t1;
        for _ in 0..20 {
            t += Duration::from_secs(1);
            b.next("k", t);
        }
        assert_eq!(b.remaining("k", t), Some(MAX));
        assert_eq!(b.remaining("other", t), None);
        let later = t + 3 * MAX;
        b.next("k", later);
        assert_eq!(b.remaining("k", later), Some(INITIAL));
    }
}
