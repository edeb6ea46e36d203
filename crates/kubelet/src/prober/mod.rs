//! Startup, liveness and readiness probes.
