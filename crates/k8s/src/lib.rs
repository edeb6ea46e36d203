//! Pure Kubernetes API logic shared by the API server and the kubelet. No I/O.
//!
//! Modules:
//! - [`duration`]: Go duration strings as flags and config files write them.
//! - [`gvk`]: group/version/kind of objects.
//! - [`catalog`]: the built-in resources served, with upstream's names, verbs, subresources.
//! - [`cron`]: CronJob schedules and their next activation time.
//! - [`events`]: the event correlator (aggregation and spam filter) of every recorder.
//! - [`flowcontrol`]: API Priority and Fairness's mandatory and suggested configuration.
//! - [`quantity`]: `resource.Quantity` parsing and rounding.
//! - [`qos`]: the pod QoS class.
//! - [`resources`]: a pod's effective requests (init containers, sidecars, overhead).
//! - [`scheduling`]: taints against tolerations, node selectors and required node affinity.
//! - [`selector`]: label and field selectors, and the field-selectable fields per kind.
//! - [`managedfields`]: managed fields (`FieldsV1`) and server-side apply.
//! - [`patch`]: JSON merge patch, JSON patch and strategic merge patch.
//! - [`validation`]: field errors with upstream's texts, name validators, per-kind validation.
//! - [`defaults`]: upstream's API defaults per kind.
//! - [`strict`]: unknown-field detection and normalisation through the typed structs.
//! - [`status`]: `metav1.Status` error bodies.
//! - [`structural`]: CRD structural schemas: validation, pruning, defaulting.
//! - [`printers`]: server-side Table output for `kubectl get`.

pub mod catalog;
pub mod cron;
pub mod defaults;
pub mod duration;
pub mod events;
pub mod flowcontrol;
pub mod gvk;
pub mod intstr;
pub mod managedfields;
pub mod patch;
pub mod printers;
pub mod qos;
pub mod quantity;
pub mod resources;
pub mod scheduling;
pub mod selector;
pub mod status;
pub mod strict;
pub mod structural;
pub mod validation;

pub use gvk::Gvk;
