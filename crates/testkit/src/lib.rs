//! For tests only. Being written.
