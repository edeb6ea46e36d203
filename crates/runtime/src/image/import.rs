//! `nodus runtime import FILE`: loading images from an OCI archive (a tar of an OCI image
//! layout: `oci-layout`, `index.json`, `blobs/sha256/…`), the format `ctr images export`
//! and `skopeo copy … oci-archive:` write, so nodes can be seeded with no registry.
//!
//! Blobs stream from the tar into the content store, each verified against the digest its
//! file name claims; nothing becomes visible until every blob of an image is in and its
//! layers are unpacked, exactly as in a pull.

use super::digest::Digest;
use super::distribution::manifest::{
    ManifestKind, PlatformMatcher, classify, parse_index, parse_manifest, select_manifest,
};
use super::distribution::{Descriptor, Platform};
use super::error::{ErrorKind, ImageError};
use super::manager::ImageManager;
use super::reference::Reference;
use super::store::ImageRecord;
use bytes::Bytes;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// Annotation containerd writes with the full image name.
const CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The OCI annotation: a full reference or, as skopeo writes it, just a tag.
const OCI_REF_NAME: &str = "org.opencontainers.image.ref.name";

fn invalid(path: &Path, msg: impl std::fmt::Display) -> ImageError {
    ImageError::new(
        ErrorKind::InvalidArgument,
        format!("{} is not a usable OCI archive: {msg}", path.display()),
    )
}

/// Streams every blob of the archive into the content store; returns index.json's bytes.
async fn load_blobs(mgr: &Arc<ImageManager>, path: &Path) -> Result<Vec<u8>, ImageError> {
    let file = std::fs::File::open(path).map_err(|e| {
        ImageError::new(
            ErrorKind::NotFound,
            format!("opening {}: {e}", path.display()),
        )
    })?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Entry>(4);
    let p = path.to_path_buf();
    // The tar is read on a blocking thread; each blob's bytes are handed to the async
    // content store in chunks so a multi-GB layer never sits in memory.
    let reader = tokio::task::spawn_blocking(move || -> Result<Option<Vec<u8>>, ImageError> {
        let mut ar = tar::Archive::new(std::io::BufReader::with_capacity(1 << 20, file));
        let mut index = None;
        let mut saw_layout = false;
        for entry in ar.entries().map_err(|e| invalid(&p, e))? {
            let mut entry = entry.map_err(|e| invalid(&p, e))?;
            let name = entry
                .path()
                .map_err(|e| invalid(&p, e))?
                .to_string_lossy()
                .trim_start_matches("./")
                .to_string();
            if name == "index.json" {
                let mut b = Vec::new();
                entry
                    .by_ref()
                    .take(4 << 20)
                    .read_to_end(&mut b)
                    .map_err(|e| invalid(&p, e))?;
                index = Some(b);
            } else if name == "oci-layout" {
                saw_layout = true;
            } else if let Some(hex) = name.strip_prefix("blobs/sha256/") {
                if !entry.header().entry_type().is_file() {
                    continue;
                }
                let digest = Digest::from_hex(hex).map_err(|e| invalid(&p, e))?;
                let size = entry.size();
                let (ctx, crx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
                if tx
                    .blocking_send(Entry {
                        digest,
                        size,
                        chunks: crx,
                    })
                    .is_err()
                {
                    return Ok(None);
                }
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    match entry.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            // A closed channel means the store already had this blob.
                            if ctx
                                .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                                .is_err()
                            {
                                break;
                            }
                        }
                        Err(e) => {
                            let _ = ctx.blocking_send(Err(e));
                            break;
                        }
                    }
                }
            }
        }
        if !saw_layout && index.is_none() {
            return Err(invalid(
                &p,
                "no oci-layout or index.json inside (docker-save archives are not supported; convert with `skopeo copy docker-archive:F oci-archive:G`)",
            ));
        }
        index
            .map(Some)
            .ok_or_else(|| invalid(&p, "index.json is missing"))
    });
    while let Some(e) = rx.recv().await {
        let stream = tokio_stream::wrappers::ReceiverStream::new(e.chunks);
        mgr.content()
            .ingest(&e.digest, Some(e.size), stream)
            .await
            .map_err(|err| {
                ImageError::from(err).context(format!("importing {}", path.display()))
            })?;
    }
    reader
        .await
        .map_err(|e| ImageError::internal(format!("archive reader failed: {e}")))??
        .ok_or_else(|| ImageError::internal("archive reader stopped early"))
}

struct Entry {
    digest: Digest,
    size: u64,
    chunks: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

fn names_of(
    desc: &Descriptor,
    fallback: Option<&str>,
    path: &Path,
) -> Result<Vec<Reference>, ImageError> {
    let mut names = Vec::new();
    let candidates = [
        desc.annotations.get(CONTAINERD_NAME).map(String::as_str),
        desc.annotations.get(OCI_REF_NAME).map(String::as_str),
    ];
    for c in candidates.into_iter().flatten() {
        // A bare tag ("latest") is only meaningful with --name's repository.
        if let Ok(r) = Reference::parse_normalized(c)
            && (c.contains('/') || c.contains(':') || c.contains('@'))
        {
            names.push(r);
            break;
        }
    }
    if names.is_empty() {
        if let Some(n) = fallback {
            let tag = desc.annotations.get(OCI_REF_NAME).cloned();
            let mut r = Reference::parse_normalized_named(n).map_err(|e| {
                ImageError::new(ErrorKind::InvalidArgument, format!("--name {n:?}: {e}"))
            })?;
            if r.tag.is_none() && r.digest.is_none() {
                r = r
                    .with_tag(tag.as_deref().unwrap_or("latest"))
                    .map_err(|e| invalid(path, e))?;
            }
            names.push(r);
        } else {
            return Err(invalid(
                path,
                format!(
                    "manifest {} carries no image name (annotation {CONTAINERD_NAME} or a full {OCI_REF_NAME}); pass --name REPOSITORY",
                    desc.digest
                ),
            ));
        }
    }
    Ok(names)
}

/// Imports every image named in the archive's index.json.
pub async fn import_archive(
    mgr: &Arc<ImageManager>,
    path: &Path,
    name: Option<&str>,
) -> Result<Vec<ImageRecord>, ImageError> {
    let index_bytes = load_blobs(mgr, path).await?;
    let index = parse_index(&index_bytes).map_err(|e| invalid(path, format!("index.json: {e}")))?;
    if index.manifests.is_empty() {
        return Err(invalid(path, "index.json lists no images"));
    }
    let matcher = PlatformMatcher::only(&Platform::host());
    let mut out = Vec::new();
    for desc in &index.manifests {
        let names = names_of(desc, name, path)?;
        let bytes = mgr
            .content()
            .read(&desc.digest)
            .map_err(|e| invalid(path, e))?;
        let (kind, _) = classify(Some(&desc.media_type), &bytes).map_err(|e| invalid(path, e))?;
        let mut manifests = vec![desc.digest.clone()];
        let manifest_bytes = match kind {
            ManifestKind::Index => {
                let idx = parse_index(&bytes).map_err(|e| invalid(path, e))?;
                let chosen = select_manifest(&idx, &matcher).ok_or_else(|| {
                    ImageError::new(
                        ErrorKind::NotFound,
                        format!(
                            "{}: image {} has no manifest for platform {}: not found",
                            path.display(),
                            names[0],
                            matcher.platform()
                        ),
                    )
                })?;
                manifests.push(chosen.digest.clone());
                mgr.content()
                    .read(&chosen.digest)
                    .map_err(|e| invalid(path, e))?
            }
            _ => bytes,
        };
        let manifest = parse_manifest(&manifest_bytes).map_err(|e| invalid(path, e))?;
        let rec = mgr
            .register_local(names, &desc.digest, manifests, &manifest)
            .await
            .map_err(|e| e.context(format!("importing {}", path.display())))?;
        tracing::info!(archive = %path.display(), id = %rec.id, tags = ?rec.repo_tags, "imported image");
        out.push(rec);
    }
    Ok(out)
}
