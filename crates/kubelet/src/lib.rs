//! The kubelet: pod sources, syncLoop, PLEG, pod workers, SyncPod over the CRI, status,
//! probes, eviction, container manager, node status and lease, the :10250 server.
//!
//! Talks to containers only through the CRI. Built by the kubelet issues.
