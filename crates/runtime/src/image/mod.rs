//! The image service's machinery, from a reference string to an unpacked root filesystem.
//!
//! Data flow of a pull: [`reference`] normalises the name → [`hosts`] lists the endpoints
//! to try (mirrors from `certs.d/<host>/hosts.toml`, then the registry itself) →
//! [`distribution`] resolves the manifest and streams blobs → [`content`] stores each blob
//! by digest after verifying it → [`unpack`] applies each layer into a [`snapshot`] keyed by
//! its chain ID → [`store`] records the image (tags, digests, layers) atomically.
//! [`manager`] orchestrates all of it (and [`import`] for OCI archives, [`local`] for images
//! made from host files); [`error`] is what
//! callers see.

pub mod content;
pub mod digest;
pub mod distribution;
pub mod error;
pub mod hosts;
pub mod import;
pub mod local;
pub mod manager;
pub mod reference;
pub mod snapshot;
pub mod store;
pub mod unpack;

pub use error::{ErrorKind, ImageError};
pub use manager::ImageManager;
