//! upstream's EventCorrelator (client-go `tools/record`), for every recorder of nodus (the
//! control plane's controllers and scheduler, the kubelet): the aggregator, which folds an
//! object's events of one type and reason into a single "(combined from similar events)"
//! Event once ten different messages came within ten minutes, and the spam filter, a token
//! bucket per object (25 events at once, then one every five minutes), which drops the
//! rest. A ReplicaSet scaled to a hundred replicas gets nine "Created pod" events, one
//! combined event counting the next sixteen, and no more writes for that burst, as with
//! upstream's controller manager; a probe whose output changes at every failure gets nine
//! "Unhealthy" events and then one combined event that counts the rest.
//!
//! The recorders keep the third part, the logger that turns a repeat of an event (same
//! object, reason and message, or the same combined event) into a `count` bump of the
//! Event already written, since that one needs the API.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Distinct messages of one object, type and reason before they are combined.
const MAX_EVENTS: usize = 10;
/// How long an aggregation record lives without a new event.
const MAX_INTERVAL: Duration = Duration::from_secs(600);
/// Events an object may get at once, and the refill rate of that bucket.
const SPAM_BURST: f64 = 25.0;
const SPAM_QPS: f64 = 1.0 / 300.0;
/// Past this many tracked keys the tables start afresh (upstream keeps an LRU of 4096).
const MAX_KEYS: usize = 10_000;

/// What to write for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Write it with `message`; `combined` when it is the object's aggregate event, which
    /// later combined events bump.
    Record { message: String, combined: bool },
    /// The object's bucket is empty: drop it.
    Skip,
}

struct Aggregate {
    messages: HashSet<String>,
    last: Instant,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

#[derive(Default)]
pub struct Correlator {
    aggregates: HashMap<String, Aggregate>,
    buckets: HashMap<String, Bucket>,
}

impl Correlator {
    /// `object` identifies the involved object (kind, namespace, name, uid, apiVersion);
    /// `type_` is Normal or Warning.
    pub fn correlate(
        &mut self,
        object: &str,
        type_: &str,
        reason: &str,
        message: &str,
        now: Instant,
    ) -> Verdict {
        if self.aggregates.len() > MAX_KEYS {
            self.aggregates.clear();
        }
        if self.buckets.len() > MAX_KEYS {
            self.buckets.clear();
        }
        let record = self
            .aggregates
            .entry(format!("{object}\u{0}{type_}\u{0}{reason}"))
            .or_insert_with(|| Aggregate {
                messages: HashSet::new(),
                last: now,
            });
        if now.saturating_duration_since(record.last) > MAX_INTERVAL {
            record.messages.clear();
        }
        record.messages.insert(message.to_string());
        record.last = now;
        let verdict = if record.messages.len() < MAX_EVENTS {
            Verdict::Record {
                message: message.to_string(),
                combined: false,
            }
        } else {
            // Keep the set at its bound, as upstream's PopAny does.
            if let Some(any) = record.messages.iter().next().cloned() {
                record.messages.remove(&any);
            }
            Verdict::Record {
                message: format!("(combined from similar events): {message}"),
                combined: true,
            }
        };
        let bucket = self.buckets.entry(object.to_string()).or_insert(Bucket {
            tokens: SPAM_BURST,
            last: now,
        });
        let refill = now.saturating_duration_since(bucket.last).as_secs_f64() * SPAM_QPS;
        bucket.tokens = (bucket.tokens + refill).min(SPAM_BURST);
        bucket.last = now;
        if bucket.tokens < 1.0 {
            return Verdict::Skip;
        }
        bucket.tokens -= 1.0;
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(v: &[Verdict]) -> (usize, usize, usize) {
        let plain = v
            .iter()
            .filter(|x| {
                matches!(
                    x,
                    Verdict::Record {
                        combined: false,
                        ..
                    }
                )
            })
            .count();
        let combined = v
            .iter()
            .filter(|x| matches!(x, Verdict::Record { combined: true, .. }))
            .count();
        (plain, combined, v.len() - plain - combined)
    }

    #[test]
    fn bursts_are_combined_then_throttled_as_upstream() {
        // (events with distinct messages at once, expected plain / combined / skipped)
        let table = [
            (1, (1, 0, 0)),
            (9, (9, 0, 0)),
            (10, (9, 1, 0)),
            (25, (9, 16, 0)),
            (100, (9, 16, 75)),
        ];
        for (n, want) in table {
            let mut c = Correlator::default();
            let now = Instant::now();
            let v: Vec<Verdict> = (0..n)
                .map(|i| {
                    c.correlate(
                        "ReplicaSet/default/web/u1/apps/v1",
                        "Normal",
                        "SuccessfulCreate",
                        &format!("Created pod: web-{i}"),
                        now,
                    )
                })
                .collect();
            assert_eq!(kinds(&v), want, "{n} events");
        }
    }

    #[test]
    fn the_same_message_is_not_combined_and_objects_have_their_own_buckets() {
        let mut c = Correlator::default();
        let now = Instant::now();
        for _ in 0..20 {
            assert_eq!(
                c.correlate("Pod/default/a/u1/v1", "Warning", "BackOff", "same", now),
                Verdict::Record {
                    message: "same".into(),
                    combined: false
                }
            );
        }
        for i in 0..25 {
            let v = c.correlate(
                "Pod/default/b/u2/v1",
                "Normal",
                "Scheduled",
                &i.to_string(),
                now,
            );
            assert_ne!(v, Verdict::Skip, "another object's bucket is full");
        }
        let combined = c.correlate("Pod/default/b/u2/v1", "Normal", "Other", "x", now);
        assert_eq!(
            combined,
            Verdict::Skip,
            "the bucket is per object, not per reason"
        );
    }

    #[test]
    fn buckets_refill_one_event_per_five_minutes_and_aggregates_expire() {
        let mut c = Correlator::default();
        let t0 = Instant::now();
        for i in 0..25 {
            c.correlate("o", "Normal", "R", &i.to_string(), t0);
        }
        assert_eq!(c.correlate("o", "Normal", "R", "x", t0), Verdict::Skip);
        let later = t0 + Duration::from_secs(301);
        assert!(matches!(
            c.correlate("o", "Normal", "R", "y", later),
            Verdict::Record { combined: true, .. }
        ));
        assert_eq!(c.correlate("o", "Normal", "R", "z", later), Verdict::Skip);
        // Eleven minutes later the aggregation starts afresh: a plain event again.
        let much_later = t0 + Duration::from_secs(301 + 660);
        assert_eq!(
            c.correlate("o", "Normal", "R", "w", much_later),
            Verdict::Record {
                message: "w".into(),
                combined: false
            }
        );
    }
}
