//! How many pods the kubelet starts at once (`--max-parallel-pod-starts`), a nodus knob with
//! no upstream counterpart.
//!
//! A pod's start is CPU work on the node (namespaces, the CNI plugins, the rootfs mount, the
//! OCI runtime), and every started pod leaves about six lines in the node's mount table (its
//! namespace pins, `/dev/shm`, rootfs and projected volume), which runc reads in full several
//! times per container. With a hundred pods arriving at once and no bound, every sandbox is
//! set up first and every runc then reads the whole table; started a few at a time, each pod
//! goes from sandbox to running container before the next takes its place, so the table runc
//! reads is on average half as long, and the first pods run while the others wait.
//!
//! A permit is held through a pod's first sync (the one that creates its sandbox) and given
//! up before anything that waits on something other than this node's CPU: an image pull and
//! a postStart hook. It is never taken again in that sync.

use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The node-wide bound: `None` starts every pod at once.
pub(crate) fn limit(max: usize) -> Option<Arc<Semaphore>> {
    (max > 0).then(|| Arc::new(Semaphore::new(max)))
}

/// One pod's place among the pods starting; released when dropped.
#[derive(Default)]
pub(crate) struct StartPermit(Mutex<Option<OwnedSemaphorePermit>>);

impl StartPermit {
    /// Waits for a place when there is a bound.
    pub(crate) async fn acquire(bound: Option<&Arc<Semaphore>>) -> StartPermit {
        let Some(sem) = bound else {
            return StartPermit::default();
        };
        // The semaphore is never closed, so acquiring only waits.
        let permit = Arc::clone(sem).acquire_owned().await.ok();
        StartPermit(Mutex::new(permit))
    }

    /// Gives the place to the next pod; the rest of this sync goes on without one.
    pub(crate) fn release(&self) {
        if let Ok(mut p) = self.0.lock() {
            p.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_released_or_dropped_permit_lets_the_next_pod_start() {
        let bound = limit(1);
        let first = StartPermit::acquire(bound.as_ref()).await;
        let sem = bound.as_ref().expect("a bound");
        assert_eq!(sem.available_permits(), 0, "the one place is taken");
        first.release();
        assert_eq!(
            sem.available_permits(),
            1,
            "released before the pod's sync ends"
        );
        first.release();
        assert_eq!(
            sem.available_permits(),
            1,
            "a second release gives nothing back"
        );
        let second = StartPermit::acquire(bound.as_ref()).await;
        assert_eq!(sem.available_permits(), 0);
        drop(second);
        assert_eq!(sem.available_permits(), 1, "dropped with the sync");
        assert!(limit(0).is_none(), "0 means no bound");
    }
}
