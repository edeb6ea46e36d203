//! The control plane: API server, storage, scheduler and controllers.
//!
//! Owns the Kubernetes API as served to kubectl and kube-rs clients; pure object logic
//! (selectors, patches, validation, printers) lives in `nodus_k8s`.

pub mod apiserver;
pub mod cli;
pub mod controllers;
pub mod healthz;
pub mod leaderelection;
pub mod pki;
pub mod scheduler;
pub mod storage;

pub use apiserver::server::{ControlPlaneConfig, ServerHandle, start};
