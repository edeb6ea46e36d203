//! Image metadata: which images exist, under which tags and repo digests, made of which
//! layers. The blobs and snapshots themselves live in [`super::content`] and
//! [`super::snapshot`]; this is the index that names them.
//!
//! The index is one JSON file replaced atomically (write, fsync, rename, fsync dir), so a
//! crash leaves either the old or the new index, never a torn one. It is written last in a
//! pull, so an interrupted pull leaves no image visible. Writers from other processes
//! (`nodus runtime import` while the daemon runs) take an exclusive `flock` on `lock`; the
//! daemon notices their writes by the file's identity (inode, size, mtime) and reloads.

use super::digest::Digest;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const INDEX_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("image store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "image store index {path} is corrupt: {source}; move it aside to start with an empty store"
    )]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("image store index {path} has version {found}, this nodus understands {INDEX_VERSION}")]
    Version { path: PathBuf, found: u32 },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One layer of an image as the registry served it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRecord {
    pub digest: Digest,
    pub size: u64,
    pub media_type: String,
    pub diff_id: Digest,
    pub chain_id: Digest,
}

/// An image known to the runtime. Its id is the digest of its config blob, as in
/// containerd and Docker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    pub id: Digest,
    /// Full references, `docker.io/library/busybox:latest`.
    pub repo_tags: Vec<String>,
    /// `docker.io/library/busybox@sha256:…`: the digest the registry's tag pointed to
    /// (the index for multi-platform images).
    pub repo_digests: Vec<String>,
    /// Blobs that belong to the image besides config and layers: the platform manifest
    /// and, for multi-platform images, the index.
    pub manifests: Vec<Digest>,
    pub config: Digest,
    pub layers: Vec<LayerRecord>,
    /// Sum of the compressed blob sizes (config, manifests, layers), as containerd reports.
    pub size: u64,
    /// `config.User` of the image: what CRI reports as uid/username.
    pub user: String,
    pub pinned: bool,
    /// RFC 3339.
    pub created: Option<String>,
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl ImageRecord {
    pub fn chain_ids(&self) -> Vec<Digest> {
        self.layers.iter().map(|l| l.chain_id.clone()).collect()
    }

    /// Every blob digest this image needs kept.
    pub fn blobs(&self) -> impl Iterator<Item = &Digest> {
        self.manifests
            .iter()
            .chain(std::iter::once(&self.config))
            .chain(self.layers.iter().map(|l| &l.digest))
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct IndexFile {
    version: u32,
    images: Vec<ImageRecord>,
}

/// File identity used to notice writes by another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Stamp {
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

/// The image index and its on-disk file.
#[derive(Debug)]
pub struct ImageStore {
    dir: PathBuf,
    images: Vec<ImageRecord>,
    stamp: Option<Stamp>,
}

/// Holds the cross-process write lock; released on drop.
pub struct StoreLock {
    _lock: nix::fcntl::Flock<File>,
}

impl ImageStore {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let mut s = Self {
            dir: dir.to_path_buf(),
            images: Vec::new(),
            stamp: None,
        };
        s.reload_if_changed()?;
        Ok(s)
    }

    fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    /// Takes the exclusive cross-process lock for a read-modify-write.
    pub fn lock(&self) -> Result<StoreLock, StoreError> {
        let path = self.dir.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map(|l| StoreLock { _lock: l })
            .map_err(|(_, e)| StoreError::Io {
                path,
                source: std::io::Error::from(e),
            })
    }

    /// Re-reads the index when another process replaced it.
    pub fn reload_if_changed(&mut self) -> Result<(), StoreError> {
        let path = self.index_path();
        let stamp = match fs::metadata(&path) {
            Ok(m) => Some(Stamp {
                ino: m.ino(),
                size: m.size(),
                mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&path)(e)),
        };
        if stamp == self.stamp && (stamp.is_some() || self.images.is_empty()) {
            return Ok(());
        }
        self.images = match stamp {
            None => Vec::new(),
            Some(_) => {
                let data = fs::read(&path).map_err(io_err(&path))?;
                let file: IndexFile =
                    serde_json::from_slice(&data).map_err(|source| StoreError::Corrupt {
                        path: path.clone(),
                        source,
                    })?;
                if file.version != INDEX_VERSION {
                    return Err(StoreError::Version {
                        path,
                        found: file.version,
                    });
                }
                file.images
            }
        };
        self.stamp = stamp;
        Ok(())
    }

    fn persist(&mut self) -> Result<(), StoreError> {
        let path = self.index_path();
        let tmp = self.dir.join(format!(".index.json.{}", std::process::id()));
        let body = serde_json::to_vec_pretty(&IndexFile {
            version: INDEX_VERSION,
            images: self.images.clone(),
        })
        .map_err(|e| io_err(&path)(std::io::Error::other(e)))?;
        {
            let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
            f.write_all(&body).map_err(io_err(&tmp))?;
            f.sync_all().map_err(io_err(&tmp))?;
        }
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))?;
        self.stamp = None;
        self.reload_if_changed()
    }

    pub fn list(&self) -> &[ImageRecord] {
        &self.images
    }

    pub fn get(&self, id: &Digest) -> Option<&ImageRecord> {
        self.images.iter().find(|i| &i.id == id)
    }

    /// Finds an image by id (`sha256:…` or bare hex), full tag, or full repo digest.
    /// Callers normalise user input to full references first.
    pub fn find(&self, key: &str) -> Option<&ImageRecord> {
        let hex = key.strip_prefix("sha256:").unwrap_or(key);
        self.images.iter().find(|i| {
            i.id.hex() == hex
                || i.repo_tags.iter().any(|t| t == key)
                || i.repo_digests.iter().any(|d| d == key)
        })
    }

    /// Adds an image or merges tags into the existing image with the same id. A tag points
    /// at one image only: adding it here removes it from whichever image had it before (an
    /// image left with no tags stays, reachable by id and digest, as in containerd's CRI).
    pub fn add(&mut self, mut rec: ImageRecord) -> Result<ImageRecord, StoreError> {
        let _lock = self.lock()?;
        self.reload_if_changed()?;
        for other in self.images.iter_mut().filter(|i| i.id != rec.id) {
            other.repo_tags.retain(|t| !rec.repo_tags.contains(t));
        }
        let merged = match self.images.iter_mut().find(|i| i.id == rec.id) {
            Some(existing) => {
                let tags: BTreeSet<String> =
                    existing.repo_tags.drain(..).chain(rec.repo_tags).collect();
                let digests: BTreeSet<String> = existing
                    .repo_digests
                    .drain(..)
                    .chain(rec.repo_digests)
                    .collect();
                let manifests: BTreeSet<Digest> =
                    existing.manifests.drain(..).chain(rec.manifests).collect();
                existing.repo_tags = tags.into_iter().collect();
                existing.repo_digests = digests.into_iter().collect();
                existing.manifests = manifests.into_iter().collect();
                existing.pinned |= rec.pinned;
                existing.clone()
            }
            None => {
                rec.repo_tags.sort();
                rec.repo_tags.dedup();
                rec.repo_digests.sort();
                rec.repo_digests.dedup();
                self.images.push(rec.clone());
                rec
            }
        };
        self.persist()?;
        Ok(merged)
    }

    /// Removes an image by id. Returns the removed record, or None if it was not there.
    pub fn remove(&mut self, id: &Digest) -> Result<Option<ImageRecord>, StoreError> {
        let _lock = self.lock()?;
        self.reload_if_changed()?;
        let Some(pos) = self.images.iter().position(|i| &i.id == id) else {
            return Ok(None);
        };
        let rec = self.images.remove(pos);
        self.persist()?;
        Ok(Some(rec))
    }

    /// Blobs and snapshots still referenced by some image: what garbage collection keeps.
    pub fn referenced(&self) -> (HashSet<Digest>, HashSet<Digest>) {
        let blobs = self
            .images
            .iter()
            .flat_map(|i| i.blobs().cloned())
            .collect();
        let snaps = self.images.iter().flat_map(|i| i.chain_ids()).collect();
        (blobs, snaps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(cfg: &[u8], tag: &str) -> ImageRecord {
        let id = Digest::of(cfg);
        let layer = Digest::of(b"layer");
        ImageRecord {
            id: id.clone(),
            repo_tags: vec![tag.to_string()],
            repo_digests: vec![format!(
                "docker.io/library/x@{}",
                Digest::of(tag.as_bytes())
            )],
            manifests: vec![Digest::of(b"manifest")],
            config: id,
            layers: vec![LayerRecord {
                digest: layer.clone(),
                size: 5,
                media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
                diff_id: layer.clone(),
                chain_id: layer,
            }],
            size: 10,
            user: String::new(),
            pinned: false,
            created: None,
            annotations: Default::default(),
        }
    }

    #[test]
    fn tags_move_between_images_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ImageStore::open(dir.path()).unwrap();
        let a = s.add(rec(b"a", "docker.io/library/x:latest")).unwrap();
        let b = s.add(rec(b"b", "docker.io/library/x:latest")).unwrap();
        assert!(s.get(&a.id).unwrap().repo_tags.is_empty(), "tag moved to b");
        assert_eq!(
            s.find("docker.io/library/x:latest").unwrap().id,
            b.id,
            "tag resolves to the newest image"
        );
        let reopened = ImageStore::open(dir.path()).unwrap();
        assert_eq!(reopened.list().len(), 2);
        assert_eq!(reopened.find(b.id.hex()).unwrap().id, b.id);
    }

    #[test]
    fn another_writer_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let mut daemon = ImageStore::open(dir.path()).unwrap();
        let mut importer = ImageStore::open(dir.path()).unwrap();
        importer.add(rec(b"a", "docker.io/library/a:1")).unwrap();
        assert!(daemon.find("docker.io/library/a:1").is_none());
        daemon.reload_if_changed().unwrap();
        assert!(daemon.find("docker.io/library/a:1").is_some());
        // A write through the daemon keeps the importer's image.
        daemon.add(rec(b"b", "docker.io/library/b:1")).unwrap();
        assert_eq!(daemon.list().len(), 2);
    }

    #[test]
    fn corrupt_index_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("index.json"), b"{not json").unwrap();
        let err = ImageStore::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("corrupt"), "{err}");
    }
}
