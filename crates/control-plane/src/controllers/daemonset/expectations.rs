//! Expectations (upstream's ControllerExpectations, by pod name): the pods a DaemonSet's
//! last pass created or deleted whose watch events have not arrived yet. While any are
//! outstanding the informer cache is behind our own writes, so the controller does not
//! create or delete on its word (that is how a slow watch would make duplicates); a
//! relist, or five minutes without the event, clears them.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Upstream's ExpectationsTimeout.
const TIMEOUT: Duration = Duration::from_secs(5 * 60);

#[derive(Default)]
struct Pending {
    adds: HashSet<String>,
    deletes: HashSet<String>,
    since: Option<Instant>,
}

#[derive(Default)]
pub(crate) struct Expectations {
    by_ds: HashMap<String, Pending>,
}

impl Expectations {
    pub(crate) fn expect_add(&mut self, ds: &str, pod: &str, now: Instant) {
        let p = self.by_ds.entry(ds.to_string()).or_default();
        p.adds.insert(pod.to_string());
        p.since = Some(now);
    }

    pub(crate) fn expect_delete(&mut self, ds: &str, pod: &str, now: Instant) {
        let p = self.by_ds.entry(ds.to_string()).or_default();
        p.deletes.insert(pod.to_string());
        p.since = Some(now);
    }

    /// The watch showed `pod` (of `ds`) added.
    pub(crate) fn observed_add(&mut self, ds: &str, pod: &str) {
        if let Some(p) = self.by_ds.get_mut(ds) {
            p.adds.remove(pod);
        }
    }

    /// The watch showed `pod` deleted, or marked for deletion.
    pub(crate) fn observed_delete(&mut self, ds: &str, pod: &str) {
        if let Some(p) = self.by_ds.get_mut(ds) {
            p.deletes.remove(pod);
        }
    }

    pub(crate) fn satisfied(&self, ds: &str, now: Instant) -> bool {
        match self.by_ds.get(ds) {
            None => true,
            Some(p) => {
                (p.adds.is_empty() && p.deletes.is_empty())
                    || p.since
                        .is_some_and(|s| now.saturating_duration_since(s) > TIMEOUT)
            }
        }
    }

    pub(crate) fn forget(&mut self, ds: &str) {
        self.by_ds.remove(ds);
    }

    pub(crate) fn clear(&mut self) {
        self.by_ds.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn satisfied_once_every_write_is_observed_or_timed_out() {
        let t0 = Instant::now();
        let mut e = Expectations::default();
        assert!(e.satisfied("ds", t0));
        e.expect_add("ds", "ds-a", t0);
        e.expect_delete("ds", "ds-b", t0);
        assert!(!e.satisfied("ds", t0));
        assert!(e.satisfied("other", t0));
        e.observed_add("ds", "ds-a");
        assert!(!e.satisfied("ds", t0));
        e.observed_delete("ds", "ds-b");
        assert!(e.satisfied("ds", t0));
        e.expect_add("ds", "ds-c", t0);
        assert!(!e.satisfied("ds", t0 + Duration::from_secs(60)));
        assert!(e.satisfied("ds", t0 + TIMEOUT + Duration::from_secs(1)));
        e.forget("ds");
        assert!(e.satisfied("ds", t0));
    }
}
