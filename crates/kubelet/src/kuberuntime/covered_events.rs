//! PLEG events a sync has already covered: the started events of app and ephemeral
//! containers this kubelet made itself.
//!
//! The sync that creates and starts a container reads the pod back from the runtime once
//! StartContainer has returned, and its status is computed from that read, so the runtime's
//! STARTED event for that container, which the runtime sends before StartContainer
//! returns, tells the kubelet nothing it does not know, as long as nothing waits for that
//! start: init containers are never covered, since a sidecar's start (an init container
//! with `restartPolicy: Always`) is what lets the next container start. Upstream's kubelet syncs the pod
//! again on it, cheaply, from its pod cache; this kubelet reads the runtime on every sync
//! (four CRI calls for a one-container pod), so it lets the event go. Every other event —
//! a container that stopped, vanished or went unknown, one made by someone else, anything
//! the generic relist finds after a kubelet restart — still syncs the pod.

use crate::pleg::{EventType, PodLifecycleEvent};
use std::collections::HashSet;
use std::sync::Mutex;

#[derive(Default)]
pub struct CoveredEvents {
    /// Ids of containers this kubelet created, until they stop or vanish.
    created_here: Mutex<HashSet<String>>,
}

impl CoveredEvents {
    /// A sync created container `id` and will read the pod back after starting it.
    pub fn created(&self, id: &str) {
        if let Ok(mut s) = self.created_here.lock() {
            s.insert(id.to_string());
        }
    }

    /// Whether `ev` needs no sync of its own. A stopped or removed container is forgotten:
    /// it never starts again (a restart is a new container).
    pub fn covers(&self, ev: &PodLifecycleEvent) -> bool {
        let Ok(mut s) = self.created_here.lock() else {
            return false;
        };
        match ev.kind {
            EventType::ContainerStarted => s.contains(&ev.data),
            EventType::ContainerDied | EventType::ContainerRemoved => {
                s.remove(&ev.data);
                false
            }
            EventType::ContainerChanged | EventType::PodSync => false,
        }
    }

    /// Keeps only the containers the runtime still has (the housekeeping's listing), so a
    /// container whose stop event was lost is not remembered for ever.
    pub fn retain(&self, live: &HashSet<&str>) {
        if let Ok(mut s) = self.created_here.lock() {
            s.retain(|id| live.contains(id.as_str()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: EventType, id: &str) -> PodLifecycleEvent {
        PodLifecycleEvent {
            pod_uid: "uid-1".into(),
            kind,
            data: id.into(),
        }
    }

    #[test]
    fn only_started_events_of_containers_made_here_are_covered() {
        let c = CoveredEvents::default();
        c.created("mine");
        let cases = [
            (EventType::ContainerStarted, "mine", true),
            // A container gone unknown is news to the sync that made it.
            (EventType::ContainerChanged, "mine", false),
            // The same event twice (the evented stream and a relist) is covered twice.
            (EventType::ContainerStarted, "mine", true),
            (EventType::ContainerStarted, "theirs", false),
            (EventType::ContainerChanged, "theirs", false),
            (EventType::PodSync, "mine", false),
            (EventType::ContainerDied, "mine", false),
            // Stopped once, the container is forgotten: nothing of it is covered again.
            (EventType::ContainerStarted, "mine", false),
            (EventType::ContainerRemoved, "mine", false),
        ];
        for (kind, id, want) in cases {
            assert_eq!(c.covers(&ev(kind, id)), want, "{kind:?} of {id}");
        }
    }

    #[test]
    fn containers_the_runtime_no_longer_lists_are_forgotten() {
        let c = CoveredEvents::default();
        c.created("a");
        c.created("b");
        c.retain(&HashSet::from(["b"]));
        assert!(!c.covers(&ev(EventType::ContainerStarted, "a")));
        assert!(c.covers(&ev(EventType::ContainerStarted, "b")));
    }
}
