//! OCI image layout directories and OCI archives.
//!
//! A layout holds `oci-layout`, `index.json` and `blobs/sha256/<hex>`. Each named entry in
//! `index.json` carries two annotations:
//!
//! - `org.opencontainers.image.ref.name`: the tag of the name (`latest` for
//!   `docker.io/library/busybox:latest`; the whole name when it has no tag), which is what
//!   `skopeo copy oci-archive:PATH:latest` selects;
//! - `io.containerd.image.name`: the full name, which `ctr images import` uses.
//!
//! The archive is a deterministic tar of that layout (`ctr images import FILE`,
//! `skopeo inspect oci-archive:FILE`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use bytes::Bytes;
use serde::Serialize;

use super::manifest::{Descriptor, Image, ImageIndex};
use super::{MTIME, media_types};

/// Annotation holding the reference name of a layout entry (the tag).
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Annotation holding the full image name, read by containerd's importer.
pub const CONTAINERD_NAME: &str = "io.containerd.image.name";

/// A set of named images and indexes to write as one OCI layout or archive.
#[derive(Clone, Debug, Default)]
pub struct OciLayout {
    entries: Vec<(Descriptor, String)>,
    blobs: BTreeMap<String, Bytes>,
}

#[derive(Serialize)]
struct IndexJson<'a> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    manifests: Vec<Descriptor>,
}

/// The `org.opencontainers.image.ref.name` value for a full image name: its tag, or the
/// name itself when it has none.
pub fn ref_name(name: &str) -> &str {
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.rfind(':') {
        Some(i) if !last.contains('@') => &last[i + 1..],
        _ => name,
    }
}

impl OciLayout {
    /// An empty layout.
    pub fn new() -> OciLayout {
        OciLayout::default()
    }

    fn add_image_blobs(&mut self, image: &Image) {
        self.blobs
            .insert(image.manifest_digest.clone(), image.manifest.clone());
        for (d, b) in image.blobs() {
            self.blobs.insert(d, b);
        }
    }

    /// Adds an image under `name` (e.g. `docker.io/library/busybox:latest`).
    pub fn image(mut self, image: &Image, name: &str) -> OciLayout {
        self.add_image_blobs(image);
        self.entries.push((image.descriptor(), name.to_string()));
        self
    }

    /// Adds an index (and all its child images) under `name`.
    pub fn index(mut self, index: &ImageIndex, name: &str) -> OciLayout {
        for image in &index.images {
            self.add_image_blobs(image);
        }
        self.blobs
            .insert(index.digest.clone(), index.manifest.clone());
        self.entries.push((index.descriptor(), name.to_string()));
        self
    }

    /// The `index.json` document.
    pub fn index_json(&self) -> Vec<u8> {
        let manifests = self
            .entries
            .iter()
            .map(|(desc, name)| {
                let mut d = desc.clone();
                d.platform = None;
                d.annotations = Some(BTreeMap::from([
                    (CONTAINERD_NAME.to_string(), name.clone()),
                    (REF_NAME.to_string(), ref_name(name).to_string()),
                ]));
                d
            })
            .collect();
        serde_json::to_vec_pretty(&IndexJson {
            schema_version: 2,
            media_type: media_types::OCI_INDEX,
            manifests,
        })
        .expect("serialize index.json")
    }

    fn files(&self) -> Vec<(String, Bytes)> {
        let mut out = vec![
            (
                "oci-layout".to_string(),
                Bytes::from_static(br#"{"imageLayoutVersion":"1.0.0"}"#),
            ),
            ("index.json".to_string(), Bytes::from(self.index_json())),
        ];
        for (digest, data) in &self.blobs {
            let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
            out.push((format!("blobs/sha256/{hex}"), data.clone()));
        }
        out
    }

    /// Writes the layout into `dir` (created if missing).
    pub fn write_dir(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir.join("blobs/sha256"))
            .with_context(|| format!("create {}", dir.display()))?;
        for (path, data) in self.files() {
            std::fs::write(dir.join(&path), &data)
                .with_context(|| format!("write {}", dir.join(&path).display()))?;
        }
        Ok(())
    }

    /// The layout as a tar stream (deterministic).
    pub fn archive(&self) -> Result<Vec<u8>> {
        let mut b = tar::Builder::new(Vec::new());
        for dir in ["blobs/", "blobs/sha256/"] {
            let mut h = tar::Header::new_ustar();
            h.set_path(dir)?;
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_mtime(MTIME);
            h.set_size(0);
            h.set_cksum();
            b.append(&h, &[][..])?;
        }
        for (path, data) in self.files() {
            let mut h = tar::Header::new_ustar();
            h.set_path(&path)?;
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_mtime(MTIME);
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append(&h, &data[..])?;
        }
        Ok(b.into_inner()?)
    }

    /// Writes the layout as an OCI archive file.
    pub fn write_archive(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.archive()?).with_context(|| format!("write {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_names() {
        assert_eq!(ref_name("docker.io/library/busybox:latest"), "latest");
        assert_eq!(ref_name("127.0.0.1:5000/app:v1"), "v1");
        assert_eq!(ref_name("127.0.0.1:5000/app"), "127.0.0.1:5000/app");
        assert_eq!(ref_name("busybox:1.35"), "1.35");
    }
}
