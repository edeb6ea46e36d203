//! The control plane: API server, storage, scheduler and controllers.
//!
//! Built by the API server and scheduler/controllers issues.

pub mod cli;
