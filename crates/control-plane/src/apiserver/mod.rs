//! The API server: HTTPS serving, authentication and authorization, the REST handlers for
//! every catalogue resource, discovery and OpenAPI, `/metrics` and the `metrics.k8s.io` API, and the built-in cluster behaviour
//! (bootstrap objects, admission, garbage collection, namespace deletion).

pub mod admission;
pub mod aggregator;
pub(crate) mod apfconfig;
pub mod authn;
pub mod authz;
pub(crate) mod autoregister;
pub mod bootstrap;
pub mod controllers;
pub(crate) mod crd;
pub mod discovery;
mod inflight;
pub mod listers;
pub mod metrics;
pub mod metrics_api;
pub mod oidc;
pub mod openapi;
pub mod protobuf;
pub mod rest;
pub mod server;
pub mod state;
