//! Importing OCI archives. Being written.
