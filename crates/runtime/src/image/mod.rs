//! The image service's machinery, from a reference string to an unpacked root filesystem.
//!
//! Data flow of a pull: [`reference`] normalises the name → [`hosts`] lists the endpoints
//! to try (mirrors from `certs.d/<host>/hosts.toml`, then the registry itself) →
//! [`distribution`] resolves the manifest and streams blobs → [`content`] stores each blob
//! by digest after verifying it → [`unpack`] applies each layer into a [`snapshot`] keyed by
//! its chain ID → [`store`] records the image (tags, digests, layers) atomically.

pub mod content;
pub mod digest;
pub mod distribution;
pub mod hosts;
pub mod reference;
pub mod snapshot;
pub mod unpack;
