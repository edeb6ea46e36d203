//! Pure helpers over Kubernetes API types: quantities, QoS class, conditions, selectors.
//!
//! Owns no I/O. Filled in by the kubelet and control-plane issues.
