//! The cgroup v1 and v2 driver: create/delete, limits, stats, PSI, freeze/kill.
//!
//! Owns the cgroup filesystem; knows nothing of pods. Built by the cgroups/QoS issue.
