//! The Pod Lifecycle Event Generator: how the kubelet notices that containers started,
//! died or vanished. Two kinds, as upstream: [`generic`] relists the runtime every second
//! and diffs; [`evented`] consumes the runtime's GetContainerEvents stream and keeps the
//! relist only as a slow backstop. Both feed the same channel and the same health check.

pub mod evented;
pub mod generic;

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    ContainerChanged,
    /// Something about the pod changed that is not one container (e.g. its sandbox).
    PodSync,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    pub pod_uid: String,
    pub kind: EventType,
    /// The container id, when the event is about one container.
    pub data: String,
}

/// upstream's relist threshold: a PLEG that has not completed a relist for this long makes
/// the kubelet unhealthy ("PLEG is not healthy").
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);

/// Liveness of the PLEG, shared between the relist/event loops and `/healthz`.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    /// The generic relist's threshold; the evented mode's is 10/3 of it (3m → 10m).
    base: Duration,
    state: Mutex<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    threshold: Duration,
    last_active: Option<Instant>,
    last_error: Option<String>,
}

impl Health {
    pub fn new(threshold: Duration) -> Health {
        Health {
            started: Instant::now(),
            base: threshold,
            state: Mutex::new(HealthState {
                threshold,
                ..Default::default()
            }),
        }
    }

    /// The evented PLEG relists every 300s and so tolerates 10 minutes (upstream's
    /// eventedPlegRelistThreshold) where the generic one tolerates 3.
    pub fn set_evented(&self, on: bool) {
        if let Ok(mut s) = self.state.lock() {
            s.threshold = if on { self.base * 10 / 3 } else { self.base };
        }
    }

    pub fn active(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.last_active = Some(Instant::now());
            s.last_error = None;
        }
    }

    pub fn failed(&self, err: String) {
        if let Ok(mut s) = self.state.lock() {
            s.last_error = Some(err);
        }
    }

    /// Seconds since the last successful relist (or event), for `kubelet_pleg_last_seen_seconds`.
    pub fn last_seen(&self) -> Option<Instant> {
        self.state.lock().ok().and_then(|s| s.last_active)
    }

    /// `Err` with upstream's message when the PLEG is stuck, plus the runtime's last error.
    pub fn check(&self) -> Result<(), String> {
        let s = self
            .state
            .lock()
            .map_err(|_| "PLEG state is poisoned".to_string())?;
        let since = s.last_active.unwrap_or(self.started);
        let elapsed = since.elapsed();
        if elapsed > s.threshold {
            let mut msg = format!(
                "PLEG is not healthy: pleg was last seen active {} ago; threshold is {}",
                go_duration(elapsed),
                go_duration(s.threshold)
            );
            if let Some(e) = &s.last_error {
                msg.push_str(&format!("; last relist error: {e}"));
            }
            return Err(msg);
        }
        Ok(())
    }
}

pub use nodus_k8s::duration::go_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_like_go() {
        assert_eq!(go_duration(Duration::from_secs(180)), "3m0s");
        assert_eq!(go_duration(Duration::from_millis(182_500)), "3m2.5s");
        assert_eq!(go_duration(Duration::from_millis(1200)), "1.2s");
    }

    #[test]
    fn unhealthy_after_threshold_with_reason() {
        let h = Health::new(Duration::from_millis(0));
        h.failed("connection refused".into());
        std::thread::sleep(Duration::from_millis(5));
        let e = h.check().unwrap_err();
        assert!(
            e.starts_with("PLEG is not healthy: pleg was last seen active"),
            "{e}"
        );
        assert!(e.contains("connection refused"), "{e}");
        let h = Health::new(Duration::from_secs(60));
        h.active();
        assert!(h.check().is_ok());
    }
}
