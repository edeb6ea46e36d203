//! Upstream's etcd request metrics (apiserver/pkg/storage/etcd3/metrics):
//! `etcd_request_duration_seconds`, `etcd_requests_total` and `etcd_request_errors_total`,
//! each by `operation` and `type` (the resource as upstream names it: `pods`,
//! `deployments.apps`), recorded by the etcd store around each store operation.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use nodus_serving::prometheus::{self, Histogram, Kind};

/// upstream's etcd request latency buckets (seconds).
const BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

/// The store operations upstream's etcd3 store reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Operation {
    Get,
    List,
    Create,
    Update,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Get => "get",
            Operation::List => "list",
            Operation::Create => "create",
            Operation::Update => "update",
            Operation::Delete => "delete",
        }
    }
}

type Labels = (Operation, String);

#[derive(Default)]
pub(crate) struct RequestMetrics {
    durations: Mutex<BTreeMap<Labels, Histogram>>,
    totals: Mutex<BTreeMap<Labels, u64>>,
    errors: Mutex<BTreeMap<Labels, u64>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `type` label of a store key `/<group>/<resource>/…`: `pods` for the core group,
/// `<resource>.<group>` otherwise.
pub(crate) fn resource_type(key: &str) -> String {
    let mut parts = key.trim_start_matches('/').split('/');
    let group = parts.next().unwrap_or_default();
    let resource = parts.next().unwrap_or_default();
    match group {
        "core" | "" => resource.to_string(),
        g => format!("{resource}.{g}"),
    }
}

impl RequestMetrics {
    /// Records one operation on `key` that started at `started`.
    pub(crate) fn record<T, E>(
        &self,
        op: Operation,
        key: &str,
        started: Instant,
        result: &Result<T, E>,
    ) {
        let labels = (op, resource_type(key));
        lock(&self.durations)
            .entry(labels.clone())
            .or_insert_with(|| Histogram::new(BUCKETS))
            .observe(started.elapsed().as_secs_f64());
        if result.is_err() {
            *lock(&self.errors).entry(labels.clone()).or_default() += 1;
        }
        *lock(&self.totals).entry(labels).or_default() += 1;
    }

    /// The three families in the text format.
    pub(crate) fn encode(&self, out: &mut String) {
        let durations = lock(&self.durations);
        if !durations.is_empty() {
            prometheus::family(
                out,
                "etcd_request_duration_seconds",
                "[ALPHA] Etcd request latency in seconds for each operation and object type.",
                Kind::Histogram,
            );
            for ((op, ty), h) in durations.iter() {
                h.encode(
                    out,
                    "etcd_request_duration_seconds",
                    &[("operation", op.as_str()), ("type", ty)],
                );
            }
        }
        drop(durations);
        for (name, help, map) in [
            (
                "etcd_requests_total",
                "[ALPHA] Etcd request counts for each operation and object type.",
                &self.totals,
            ),
            (
                "etcd_request_errors_total",
                "[ALPHA] Etcd failed request counts for each operation and object type.",
                &self.errors,
            ),
        ] {
            let map = lock(map);
            if map.is_empty() {
                continue;
            }
            prometheus::family(out, name, help, Kind::Counter);
            for ((op, ty), n) in map.iter() {
                prometheus::sample(
                    out,
                    name,
                    &[("operation", op.as_str()), ("type", ty)],
                    *n as f64,
                    None,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_families_as_upstream() {
        assert_eq!(resource_type("/core/pods/default/a"), "pods");
        assert_eq!(resource_type("/apps/deployments/"), "deployments.apps");
        let m = RequestMetrics::default();
        let t = Instant::now();
        m.record::<(), ()>(Operation::Create, "/core/pods/default/a", t, &Ok(()));
        m.record::<(), ()>(Operation::Create, "/core/pods/default/b", t, &Err(()));
        let mut out = String::new();
        m.encode(&mut out);
        let samples = prometheus::parse(&out).expect("valid text format");
        let find = |name: &str| {
            samples
                .iter()
                .find(|s| {
                    s.name == name
                        && s.label("operation") == Some("create")
                        && s.label("type") == Some("pods")
                })
                .map(|s| s.value)
        };
        assert_eq!(find("etcd_requests_total"), Some(2.0));
        assert_eq!(find("etcd_request_errors_total"), Some(1.0));
        assert_eq!(find("etcd_request_duration_seconds_count"), Some(2.0));
    }
}
