//! Image configs, manifests and indexes, in OCI or Docker schema 2 flavour.

use std::collections::BTreeMap;

use anyhow::Result;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::layer::{Layer, LayerBuilder};
use super::layout::OciLayout;
use super::{CREATED, media_types, sha256_digest};

/// Which family of media types a manifest (and its config and layers) uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ManifestFormat {
    /// `application/vnd.oci.image.manifest.v1+json`, OCI index.
    #[default]
    Oci,
    /// `application/vnd.docker.distribution.manifest.v2+json`, Docker manifest list.
    Docker,
}

impl ManifestFormat {
    /// Media type of an image manifest.
    pub fn manifest_media_type(self) -> &'static str {
        match self {
            ManifestFormat::Oci => media_types::OCI_MANIFEST,
            ManifestFormat::Docker => media_types::DOCKER_MANIFEST,
        }
    }

    /// Media type of an index / manifest list.
    pub fn index_media_type(self) -> &'static str {
        match self {
            ManifestFormat::Oci => media_types::OCI_INDEX,
            ManifestFormat::Docker => media_types::DOCKER_MANIFEST_LIST,
        }
    }

    /// Media type of an image config.
    pub fn config_media_type(self) -> &'static str {
        match self {
            ManifestFormat::Oci => media_types::OCI_CONFIG,
            ManifestFormat::Docker => media_types::DOCKER_CONFIG,
        }
    }
}

/// An OS/architecture pair, as in image configs and index entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// linux/amd64.
    pub fn linux_amd64() -> Platform {
        Platform {
            architecture: "amd64".into(),
            os: "linux".into(),
            variant: None,
        }
    }

    /// linux/arm64/v8.
    pub fn linux_arm64() -> Platform {
        Platform {
            architecture: "arm64".into(),
            os: "linux".into(),
            variant: Some("v8".into()),
        }
    }
}

impl Default for Platform {
    fn default() -> Platform {
        Platform::linux_amd64()
    }
}

/// A content descriptor (`mediaType`, `digest`, `size`, optional platform and annotations).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType")]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The runtime part of an image config (`config` in the config JSON), Docker field names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(rename = "User", skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(
        rename = "ExposedPorts",
        skip_serializing_if = "BTreeMap::is_empty",
        default
    )]
    pub exposed_ports: BTreeMap<String, serde_json::Value>,
    #[serde(rename = "Env", skip_serializing_if = "Vec::is_empty", default)]
    pub env: Vec<String>,
    #[serde(rename = "Entrypoint", skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(
        rename = "Volumes",
        skip_serializing_if = "BTreeMap::is_empty",
        default
    )]
    pub volumes: BTreeMap<String, serde_json::Value>,
    #[serde(rename = "WorkingDir", skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(rename = "Labels", skip_serializing_if = "BTreeMap::is_empty", default)]
    pub labels: BTreeMap<String, String>,
    #[serde(rename = "StopSignal", skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
}

#[derive(Serialize)]
struct ConfigFile<'a> {
    created: &'a str,
    architecture: &'a str,
    os: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    variant: Option<&'a str>,
    config: &'a ImageConfig,
    rootfs: RootFs,
    history: Vec<History>,
}

#[derive(Serialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: &'static str,
    diff_ids: Vec<String>,
}

#[derive(Serialize)]
struct History {
    created: &'static str,
    created_by: String,
}

#[derive(Serialize)]
struct Manifest<'a> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Serialize)]
struct Index<'a> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    manifests: Vec<Descriptor>,
}

/// Builds an [`Image`]: runtime config, platform, manifest format and layers.
#[derive(Clone, Debug, Default)]
pub struct ImageBuilder {
    pub config: ImageConfig,
    pub platform: Platform,
    pub format: ManifestFormat,
    pub layers: Vec<LayerBuilder>,
}

impl ImageBuilder {
    /// An empty linux/amd64 OCI image.
    pub fn new() -> ImageBuilder {
        ImageBuilder::default()
    }

    /// Sets the manifest format.
    pub fn format(mut self, format: ManifestFormat) -> ImageBuilder {
        self.format = format;
        self
    }

    /// Sets the platform.
    pub fn platform(mut self, platform: Platform) -> ImageBuilder {
        self.platform = platform;
        self
    }

    /// Appends a layer (topmost last).
    pub fn layer(mut self, layer: LayerBuilder) -> ImageBuilder {
        self.layers.push(layer);
        self
    }

    /// Sets the compression of every layer added so far.
    pub fn compression(mut self, compression: super::Compression) -> ImageBuilder {
        self.layers = self
            .layers
            .into_iter()
            .map(|l| l.compression(compression))
            .collect();
        self
    }

    /// Sets `config.User` (`"1000"`, `"app"`, `"1000:1000"`, ...).
    pub fn user(mut self, user: impl Into<String>) -> ImageBuilder {
        self.config.user = Some(user.into());
        self
    }

    /// Appends `KEY=VALUE` to `config.Env`.
    pub fn env(mut self, kv: impl Into<String>) -> ImageBuilder {
        self.config.env.push(kv.into());
        self
    }

    /// Sets `config.Entrypoint`.
    pub fn entrypoint<S: Into<String>>(
        mut self,
        argv: impl IntoIterator<Item = S>,
    ) -> ImageBuilder {
        self.config.entrypoint = Some(argv.into_iter().map(Into::into).collect());
        self
    }

    /// Sets `config.Cmd`.
    pub fn cmd<S: Into<String>>(mut self, argv: impl IntoIterator<Item = S>) -> ImageBuilder {
        self.config.cmd = Some(argv.into_iter().map(Into::into).collect());
        self
    }

    /// Sets `config.WorkingDir`.
    pub fn working_dir(mut self, dir: impl Into<String>) -> ImageBuilder {
        self.config.working_dir = Some(dir.into());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> ImageBuilder {
        self.config.labels.insert(key.into(), value.into());
        self
    }

    /// Adds an image volume (`config.Volumes`).
    pub fn volume(mut self, path: impl Into<String>) -> ImageBuilder {
        self.config
            .volumes
            .insert(path.into(), serde_json::json!({}));
        self
    }

    /// Builds every layer, then the config and the manifest.
    pub fn build(&self) -> Result<Image> {
        // Layers are independent: build them on parallel threads (compression dominates).
        let layers = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .layers
                .iter()
                .map(|l| s.spawn(move || l.build()))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("layer build thread panicked"))
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(Image::assemble(
            self.format,
            self.platform.clone(),
            self.config.clone(),
            layers,
        ))
    }
}

/// A complete image: built layers, config blob and manifest, ready to push or write out.
#[derive(Clone, Debug)]
pub struct Image {
    pub format: ManifestFormat,
    pub platform: Platform,
    /// The runtime config as serialized into [`Image::config_blob`].
    pub config: ImageConfig,
    /// Layers, bottom first.
    pub layers: Vec<Layer>,
    /// The config JSON.
    pub config_blob: Bytes,
    pub config_digest: String,
    /// The manifest JSON.
    pub manifest: Bytes,
    pub manifest_digest: String,
}

impl Image {
    /// Serializes config and manifest for already-built layers.
    pub fn assemble(
        format: ManifestFormat,
        platform: Platform,
        config: ImageConfig,
        layers: Vec<Layer>,
    ) -> Image {
        let config_file = ConfigFile {
            created: CREATED,
            architecture: &platform.architecture,
            os: &platform.os,
            variant: platform.variant.as_deref(),
            config: &config,
            rootfs: RootFs {
                kind: "layers",
                diff_ids: layers.iter().map(|l| l.diff_id.clone()).collect(),
            },
            history: layers
                .iter()
                .enumerate()
                .map(|(i, l)| History {
                    created: CREATED,
                    created_by: l
                        .comment
                        .clone()
                        .unwrap_or_else(|| format!("testkit layer {i}")),
                })
                .collect(),
        };
        let config_blob = serde_json::to_vec(&config_file).expect("serialize image config");
        let config_digest = sha256_digest(&config_blob);
        let manifest = Manifest {
            schema_version: 2,
            media_type: format.manifest_media_type(),
            config: Descriptor {
                media_type: format.config_media_type().into(),
                digest: config_digest.clone(),
                size: config_blob.len() as u64,
                platform: None,
                annotations: None,
            },
            layers: layers
                .iter()
                .map(|l| Descriptor {
                    media_type: l.media_type(format).into(),
                    digest: l.digest.clone(),
                    size: l.size(),
                    platform: None,
                    annotations: None,
                })
                .collect(),
        };
        let manifest = serde_json::to_vec_pretty(&manifest).expect("serialize manifest");
        Image {
            format,
            platform,
            config,
            manifest_digest: sha256_digest(&manifest),
            manifest: manifest.into(),
            config_blob: config_blob.into(),
            config_digest,
            layers,
        }
    }

    /// The same image (same layers and config) with a manifest of another format. Layer
    /// digests do not change; config and manifest digests do.
    pub fn with_format(&self, format: ManifestFormat) -> Image {
        Image::assemble(
            format,
            self.platform.clone(),
            self.config.clone(),
            self.layers.clone(),
        )
    }

    /// Media type of the manifest.
    pub fn media_type(&self) -> &'static str {
        self.format.manifest_media_type()
    }

    /// Descriptor of the manifest, with platform (as listed in an index).
    pub fn descriptor(&self) -> Descriptor {
        Descriptor {
            media_type: self.media_type().into(),
            digest: self.manifest_digest.clone(),
            size: self.manifest.len() as u64,
            platform: Some(self.platform.clone()),
            annotations: None,
        }
    }

    /// `rootfs.diff_ids`, bottom layer first.
    pub fn diff_ids(&self) -> Vec<String> {
        self.layers.iter().map(|l| l.diff_id.clone()).collect()
    }

    /// Config and layer blobs (not the manifest) as `(digest, bytes)`, config first.
    pub fn blobs(&self) -> Vec<(String, Bytes)> {
        let mut out = vec![(self.config_digest.clone(), self.config_blob.clone())];
        for l in &self.layers {
            if !out.iter().any(|(d, _)| d == &l.digest) {
                out.push((l.digest.clone(), l.blob.clone()));
            }
        }
        out
    }

    /// Writes an OCI image layout directory holding this image as `name`
    /// (e.g. `docker.io/library/busybox:latest`). See [`OciLayout`].
    pub fn write_oci_layout(&self, dir: &std::path::Path, name: &str) -> Result<()> {
        OciLayout::new().image(self, name).write_dir(dir)
    }

    /// Writes an OCI archive (a tar of the layout) holding this image as `name`.
    pub fn write_oci_archive(&self, path: &std::path::Path, name: &str) -> Result<()> {
        OciLayout::new().image(self, name).write_archive(path)
    }
}

/// A multi-platform index (OCI index or Docker manifest list) and its child images.
#[derive(Clone, Debug)]
pub struct ImageIndex {
    pub format: ManifestFormat,
    pub images: Vec<Image>,
    /// The index JSON.
    pub manifest: Bytes,
    pub digest: String,
}

impl ImageIndex {
    /// An index of `images`, each listed with its platform. Children keep their own
    /// manifest format; pass children of the same format as the index for a valid result.
    pub fn new(format: ManifestFormat, images: Vec<Image>) -> ImageIndex {
        let index = Index {
            schema_version: 2,
            media_type: format.index_media_type(),
            manifests: images.iter().map(Image::descriptor).collect(),
        };
        let manifest = serde_json::to_vec_pretty(&index).expect("serialize index");
        ImageIndex {
            format,
            images,
            digest: sha256_digest(&manifest),
            manifest: manifest.into(),
        }
    }

    /// Media type of the index.
    pub fn media_type(&self) -> &'static str {
        self.format.index_media_type()
    }

    /// Descriptor of the index itself.
    pub fn descriptor(&self) -> Descriptor {
        Descriptor {
            media_type: self.media_type().into(),
            digest: self.digest.clone(),
            size: self.manifest.len() as u64,
            platform: None,
            annotations: None,
        }
    }

    /// The child image for `architecture` (e.g. "amd64", "arm64").
    pub fn image_for(&self, architecture: &str) -> Option<&Image> {
        self.images
            .iter()
            .find(|i| i.platform.architecture == architecture)
    }

    /// Writes an OCI image layout directory holding this index as `name`.
    pub fn write_oci_layout(&self, dir: &std::path::Path, name: &str) -> Result<()> {
        OciLayout::new().index(self, name).write_dir(dir)
    }

    /// Writes an OCI archive holding this index as `name`.
    pub fn write_oci_archive(&self, path: &std::path::Path, name: &str) -> Result<()> {
        OciLayout::new().index(self, name).write_archive(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::Compression;

    fn small(format: ManifestFormat) -> Image {
        ImageBuilder::new()
            .format(format)
            .layer(LayerBuilder::new().file("a", "1"))
            .layer(
                LayerBuilder::new()
                    .file("b", "2")
                    .compression(Compression::Zstd),
            )
            .layer(
                LayerBuilder::new()
                    .file("c", "3")
                    .compression(Compression::None),
            )
            .user("1000:1000")
            .env("PATH=/bin")
            .cmd(["sh"])
            .entrypoint(["/bin/busybox"])
            .working_dir("/tmp")
            .label("k", "v")
            .build()
            .unwrap()
    }

    #[test]
    fn manifest_and_config_are_consistent() {
        for format in [ManifestFormat::Oci, ManifestFormat::Docker] {
            let img = small(format);
            let m: serde_json::Value = serde_json::from_slice(&img.manifest).unwrap();
            assert_eq!(m["schemaVersion"], 2);
            assert_eq!(m["mediaType"], format.manifest_media_type());
            assert_eq!(m["config"]["mediaType"], format.config_media_type());
            assert_eq!(m["config"]["digest"], img.config_digest.as_str());
            assert_eq!(m["config"]["size"], img.config_blob.len() as u64);
            let layers = m["layers"].as_array().unwrap();
            assert_eq!(layers.len(), 3);
            for (d, l) in layers.iter().zip(&img.layers) {
                assert_eq!(d["digest"], l.digest.as_str());
                assert_eq!(d["size"], l.size());
                assert_eq!(d["mediaType"], l.media_type(format));
                assert_eq!(sha256_digest(&l.blob), l.digest);
            }
            let types: Vec<&str> = layers
                .iter()
                .map(|d| d["mediaType"].as_str().unwrap())
                .collect();
            match format {
                ManifestFormat::Oci => assert_eq!(
                    types,
                    [
                        media_types::OCI_LAYER_GZIP,
                        media_types::OCI_LAYER_ZSTD,
                        media_types::OCI_LAYER
                    ]
                ),
                ManifestFormat::Docker => assert_eq!(
                    types,
                    [
                        media_types::DOCKER_LAYER_GZIP,
                        media_types::DOCKER_LAYER_ZSTD,
                        media_types::DOCKER_LAYER
                    ]
                ),
            }
            let c: serde_json::Value = serde_json::from_slice(&img.config_blob).unwrap();
            assert_eq!(c["architecture"], "amd64");
            assert_eq!(c["os"], "linux");
            assert_eq!(c["config"]["User"], "1000:1000");
            assert_eq!(c["config"]["Cmd"], serde_json::json!(["sh"]));
            assert_eq!(
                c["config"]["Entrypoint"],
                serde_json::json!(["/bin/busybox"])
            );
            assert_eq!(c["config"]["WorkingDir"], "/tmp");
            assert_eq!(c["config"]["Labels"]["k"], "v");
            assert_eq!(c["rootfs"]["type"], "layers");
            assert_eq!(c["rootfs"]["diff_ids"], serde_json::json!(img.diff_ids()));
            assert_eq!(c["history"].as_array().unwrap().len(), 3);
            assert_eq!(sha256_digest(&img.manifest), img.manifest_digest);
        }
    }

    #[test]
    fn with_format_keeps_layers() {
        let oci = small(ManifestFormat::Oci);
        let docker = oci.with_format(ManifestFormat::Docker);
        assert_eq!(oci.diff_ids(), docker.diff_ids());
        assert_eq!(oci.config_digest, docker.config_digest);
        assert_ne!(oci.manifest_digest, docker.manifest_digest);
        assert_eq!(
            docker.manifest_digest,
            small(ManifestFormat::Docker).manifest_digest
        );
    }

    #[test]
    fn index_lists_platforms() {
        let amd = small(ManifestFormat::Oci);
        let arm = ImageBuilder::new()
            .platform(Platform::linux_arm64())
            .layer(LayerBuilder::new().file("arch", "arm64"))
            .build()
            .unwrap();
        let idx = ImageIndex::new(ManifestFormat::Oci, vec![amd.clone(), arm.clone()]);
        let v: serde_json::Value = serde_json::from_slice(&idx.manifest).unwrap();
        assert_eq!(v["mediaType"], media_types::OCI_INDEX);
        assert_eq!(v["manifests"][0]["digest"], amd.manifest_digest.as_str());
        assert_eq!(v["manifests"][0]["platform"]["architecture"], "amd64");
        assert_eq!(v["manifests"][1]["platform"]["architecture"], "arm64");
        assert_eq!(v["manifests"][1]["platform"]["variant"], "v8");
        assert_eq!(
            idx.image_for("arm64").unwrap().manifest_digest,
            arm.manifest_digest
        );
    }
}
