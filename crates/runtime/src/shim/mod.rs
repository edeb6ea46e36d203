//! The per-container shim. Being written.
