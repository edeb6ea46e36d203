//! Images made on the node from host files, with no registry and no archive: how `nodus up`
//! packs its own binary (and etcd's) into the images of the control plane's static pods,
//! where kubeadm would pull `registry.k8s.io/kube-apiserver` and friends.
//!
//! One uncompressed layer (the files at the paths given, their parent directories and an
//! empty `/tmp`), an OCI config and manifest; the blobs go into the content store and the
//! image is recorded exactly as an imported one, so the kubelet and crictl see an ordinary
//! image. Building the same name again is a no-op while the image exists.

use super::digest::Digest;
use super::distribution::manifest::parse_manifest;
use super::error::{ErrorKind, ImageError};
use super::manager::ImageManager;
use super::reference::Reference;
use super::store::ImageRecord;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file of the host to put into an image.
#[derive(Clone, Debug)]
pub struct HostFile {
    /// Read through symbolic links: the image gets the file's content.
    pub source: PathBuf,
    /// Its absolute path inside the image.
    pub dest: String,
}

/// The OCI name of the machine's architecture.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn bad(name: &str, msg: impl std::fmt::Display) -> ImageError {
    ImageError::new(
        ErrorKind::InvalidArgument,
        format!("building image {name}: {msg}"),
    )
}

/// The layer: every parent directory once, then the files with their host modes.
fn layer_tar(name: &str, files: &[HostFile]) -> Result<Vec<u8>, ImageError> {
    let mut dirs = BTreeSet::from(["tmp".to_string()]);
    for f in files {
        let dest = f
            .dest
            .strip_prefix('/')
            .filter(|d| !d.is_empty() && !d.split('/').any(|c| c == ".." || c.is_empty()))
            .ok_or_else(|| bad(name, format!("{:?} is not an absolute file path", f.dest)))?;
        let mut parent = Path::new(dest).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.insert(p.to_string_lossy().into_owned());
            parent = p.parent();
        }
    }
    let mut ar = tar::Builder::new(Vec::new());
    for d in &dirs {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(if d == "tmp" { 0o1777 } else { 0o755 });
        h.set_size(0);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        ar.append_data(&mut h, format!("{d}/"), std::io::empty())
            .map_err(|e| bad(name, e))?;
    }
    for f in files {
        let file = std::fs::File::open(&f.source)
            .map_err(|e| bad(name, format!("{}: {e}", f.source.display())))?;
        let meta = file
            .metadata()
            .map_err(|e| bad(name, format!("{}: {e}", f.source.display())))?;
        if !meta.is_file() {
            return Err(bad(
                name,
                format!("{} is not a regular file", f.source.display()),
            ));
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777);
        h.set_size(meta.len());
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        ar.append_data(&mut h, f.dest.trim_start_matches('/'), file)
            .map_err(|e| bad(name, format!("{}: {e}", f.source.display())))?;
    }
    ar.into_inner().map_err(|e| bad(name, e))
}

impl ImageManager {
    /// Records an image `name` holding `files`, run as `entrypoint`; returns the existing
    /// image when `name` is already there (callers put a fingerprint of the files in the
    /// tag, so changed files make a new image).
    pub async fn build_from_host_files(
        self: &Arc<Self>,
        name: &str,
        files: &[HostFile],
        entrypoint: &[String],
    ) -> Result<ImageRecord, ImageError> {
        if let Some(found) = self.resolve(name)? {
            return Ok(found);
        }
        let reference = Reference::parse_normalized_named(name).map_err(|e| bad(name, e))?;
        let (n, f) = (name.to_string(), files.to_vec());
        let layer = tokio::task::spawn_blocking(move || layer_tar(&n, &f))
            .await
            .map_err(|e| bad(name, e))??;
        let layer_digest = self.content().put(&layer)?;
        let config = json!({
            "architecture": oci_arch(),
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Entrypoint": entrypoint,
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_digest.to_string()]},
            "history": [{"created_by": "nodus: host files", "comment": name}],
        });
        let config = serde_json::to_vec(&config).map_err(|e| bad(name, e))?;
        let config_digest = self.content().put(&config)?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest.to_string(),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest.to_string(),
                "size": layer.len(),
            }],
        });
        let manifest = serde_json::to_vec(&manifest).map_err(|e| bad(name, e))?;
        let manifest_digest: Digest = self.content().put(&manifest)?;
        let parsed = parse_manifest(&manifest).map_err(|e| bad(name, e))?;
        let record = self
            .register_local(
                vec![reference],
                &manifest_digest,
                vec![manifest_digest.clone()],
                &parsed,
            )
            .await?;
        tracing::info!(image = name, id = %record.id, "built image from host files");
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_holds_parents_files_and_tmp() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("tool");
        std::fs::write(&src, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let tar = layer_tar(
            "t",
            &[HostFile {
                source: src,
                dest: "/usr/local/bin/tool".into(),
            }],
        )
        .unwrap();
        let mut ar = tar::Archive::new(&tar[..]);
        let entries: Vec<(String, u32)> = ar
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                // Root's, as the unpacker checks every header's owner.
                assert_eq!(
                    (e.header().uid().unwrap(), e.header().gid().unwrap()),
                    (0, 0)
                );
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    e.header().mode().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            entries,
            vec![
                ("tmp/".to_string(), 0o1777),
                ("usr/".to_string(), 0o755),
                ("usr/local/".to_string(), 0o755),
                ("usr/local/bin/".to_string(), 0o755),
                ("usr/local/bin/tool".to_string(), 0o755),
            ]
        );
    }

    #[test]
    fn paths_outside_the_image_are_refused() {
        for dest in ["relative", "/", "/a/../b", "/a//b"] {
            let err = layer_tar(
                "t",
                &[HostFile {
                    source: "/bin/sh".into(),
                    dest: dest.into(),
                }],
            )
            .unwrap_err();
            assert!(
                err.to_string().contains("is not an absolute file path"),
                "{dest}: {err}"
            );
        }
    }
}
