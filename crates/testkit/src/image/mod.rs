//! OCI images built offline from host files, byte-for-byte deterministic.
//!
//! Every tar entry gets a fixed mtime ([`MTIME`]) and empty user/group names, entries are
//! sorted by path (hard links after their targets), gzip headers carry no timestamp or file
//! name, and JSON documents are serialized from structs with a fixed field order. Building the
//! same image twice therefore yields the same layer, config and manifest digests.
//!
//! - [`layer`]: [`LayerBuilder`] and [`Entry`] (files, dirs, links, devices, whiteouts,
//!   xattrs) → a compressed [`Layer`] blob with its digest and diffID.
//! - [`manifest`]: [`Image`] (config + layers + manifest, OCI or Docker schema 2) and
//!   [`ImageIndex`] (OCI index or Docker manifest list).
//! - [`layout`]: OCI image layout directories and OCI archives (`ctr images import`,
//!   `skopeo copy oci-archive:`).
//! - ready-made images: [`mod@busybox`], [`whiteout`], [`large`], [`malicious`].

pub mod busybox;
pub mod large;
pub mod layer;
pub mod layout;
pub mod malicious;
pub mod manifest;
pub mod whiteout;

pub use busybox::{busybox, busybox_builder, busybox_multiplatform, busybox_with_user, pause};
pub use large::{large_image, large_image_builder};
pub use layer::{Compression, Entry, EntryKind, Layer, LayerBuilder};
pub use layout::OciLayout;
pub use malicious::{Malice, malicious_layer_image};
pub use manifest::{
    Descriptor, Image, ImageBuilder, ImageConfig, ImageIndex, ManifestFormat, Platform,
};
pub use whiteout::{check_whiteout_rootfs, whiteout_image, whiteout_image_builder};

/// The modification time of every tar entry and the `created` time of every config:
/// 2020-01-01T00:00:00Z.
pub const MTIME: u64 = 1_577_836_800;

/// [`MTIME`] as an RFC 3339 string, used in image configs.
pub const CREATED: &str = "2020-01-01T00:00:00Z";

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    // ring's assembly SHA-256 is ~30x faster than a debug-built pure-Rust one.
    format!(
        "sha256:{}",
        hex::encode(ring::digest::digest(&ring::digest::SHA256, data))
    )
}

/// OCI and Docker media types used by testkit.
pub mod media_types {
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
    pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    pub const DOCKER_MANIFEST_LIST: &str =
        "application/vnd.docker.distribution.manifest.list.v2+json";
    pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
    pub const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
    pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
    pub const DOCKER_LAYER_ZSTD: &str = "application/vnd.docker.image.rootfs.diff.tar.zstd";
}
