//! Containers: the OCI bundle built from a CRI ContainerConfig ([`spec`]), and their
//! lifecycle and persisted state.

pub mod image_sub_path;
pub mod monitor;
pub mod rootfs;
pub mod spec;
