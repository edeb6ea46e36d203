//! The image manager: pulls, imports, removes and garbage-collects images, tying the
//! registry client, content store, unpacker, snapshotter and metadata store together.
//!
//! Ordering is what keeps the store consistent across crashes: blobs are committed only
//! after their digest is verified, snapshots only after their diffID is verified, and the
//! image record — the only thing that makes an image visible — last. Whatever a crash
//! leaves behind is unreferenced and removed by the garbage collection at the next start.

use super::content::ContentStore;
use super::digest::{Digest, chain_ids};
use super::distribution::{Credentials, RegistryClient, Resolved};
use super::error::{ErrorKind, ImageError};
use super::reference::Reference;
use super::snapshot::Snapshotter;
use super::store::{ImageRecord, ImageStore, LayerRecord};
use super::unpack::{Compression, apply_layer};
use crate::config::RuntimeConfig;
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;

/// Where the image subsystem keeps its state and how it reaches registries.
#[derive(Debug, Clone)]
pub struct ImageManagerConfig {
    pub root: PathBuf,
    pub hosts_dir: Option<PathBuf>,
    pub max_concurrent_downloads: usize,
}

impl ImageManagerConfig {
    pub fn new(root_dir: &Path, config: &RuntimeConfig) -> Self {
        Self {
            root: root_dir.to_path_buf(),
            hosts_dir: config.registry_config_dir.clone(),
            max_concurrent_downloads: config.max_concurrent_downloads,
        }
    }
}

type PullFuture = Shared<BoxFuture<'static, Result<ImageRecord, ImageError>>>;

/// Disk usage of the image filesystem, for ImageFsInfo.
#[derive(Debug, Clone, Copy)]
pub struct FsUsage {
    pub used_bytes: u64,
    pub inodes_used: u64,
}

pub struct ImageManager {
    root: PathBuf,
    content: ContentStore,
    snapshots: Snapshotter,
    store: Mutex<ImageStore>,
    registry: RegistryClient,
    max_concurrent_downloads: usize,
    /// In-flight pulls by normalised reference: a second identical pull joins the first.
    pulls: Mutex<HashMap<String, PullFuture>>,
    /// Blobs and snapshots held by in-flight pulls and imports, which GC must not touch
    /// before their image record exists (containerd's leases play this role).
    leases: Mutex<HashMap<Digest, usize>>,
    /// Images used by containers: these cannot be removed.
    in_use: Mutex<HashMap<Digest, usize>>,
}

/// Releases leases when a pull ends, however it ends.
struct LeaseGuard<'a> {
    mgr: &'a ImageManager,
    held: Vec<Digest>,
}

impl LeaseGuard<'_> {
    fn hold(&mut self, d: &Digest) {
        let mut l = self.mgr.leases.lock().unwrap_or_else(|p| p.into_inner());
        *l.entry(d.clone()).or_default() += 1;
        self.held.push(d.clone());
    }
}

impl Drop for LeaseGuard<'_> {
    fn drop(&mut self) {
        let mut l = self.mgr.leases.lock().unwrap_or_else(|p| p.into_inner());
        for d in self.held.drain(..) {
            if let Some(n) = l.get_mut(&d) {
                *n -= 1;
                if *n == 0 {
                    l.remove(&d);
                }
            }
        }
    }
}

/// The parts of an image config the runtime needs.
#[derive(Debug, serde::Deserialize)]
struct ConfigView {
    #[serde(default)]
    created: Option<String>,
    #[serde(default)]
    config: Option<ConfigInner>,
    rootfs: RootFs,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ConfigInner {
    #[serde(rename = "User", default)]
    user: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<Digest>,
}

fn parse_config(image: &str, bytes: &[u8]) -> Result<ConfigView, ImageError> {
    let c: ConfigView = serde_json::from_slice(bytes).map_err(|e| {
        ImageError::new(
            ErrorKind::InvalidArgument,
            format!("image {image}: invalid image config: {e}"),
        )
    })?;
    if c.rootfs.kind != "layers" {
        return Err(ImageError::new(
            ErrorKind::InvalidArgument,
            format!(
                "image {image}: unsupported rootfs type {:?} in image config",
                c.rootfs.kind
            ),
        ));
    }
    Ok(c)
}

impl ImageManager {
    /// Reads the config blob of `manifest` and checks it lists one diffID per layer.
    fn load_config(
        &self,
        image: &str,
        manifest: &super::distribution::Manifest,
    ) -> Result<ConfigView, ImageError> {
        let bytes = self
            .content
            .read(&manifest.config.digest)
            .map_err(ImageError::from)?;
        let config = parse_config(image, &bytes)?;
        if config.rootfs.diff_ids.len() != manifest.layers.len() {
            return Err(ImageError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "image {image}: manifest has {} layers but the config lists {} diff_ids",
                    manifest.layers.len(),
                    config.rootfs.diff_ids.len()
                ),
            ));
        }
        Ok(config)
    }
}

/// A layer to unpack: its descriptor and, for pulls, the download that produces its blob.
struct PendingLayer {
    digest: Digest,
    size: u64,
    media_type: String,
    download: Option<JoinHandle<Result<(), ImageError>>>,
}

impl ImageManager {
    /// Opens the stores under `root`, removing what an interrupted pull left behind.
    pub fn open(cfg: ImageManagerConfig) -> Result<Arc<Self>, ImageError> {
        let root = cfg.root.clone();
        std::fs::create_dir_all(&root)
            .map_err(|e| ImageError::internal(format!("creating {}: {e}", root.display())))?;
        let content = ContentStore::open(&root)
            .map_err(|e| ImageError::internal(format!("opening content store: {e}")))?;
        let snapshots = Snapshotter::open(&root)
            .map_err(|e| ImageError::internal(format!("opening snapshotter: {e}")))?;
        let store = ImageStore::open(&root.join("images"))
            .map_err(|e| ImageError::internal(e.to_string()))?;
        let registry = RegistryClient::new(cfg.hosts_dir.as_deref())
            .map_err(|e| ImageError::new(ErrorKind::InvalidArgument, e.to_string()))?;
        let mgr = Arc::new(Self {
            root,
            content,
            snapshots,
            store: Mutex::new(store),
            registry,
            max_concurrent_downloads: cfg.max_concurrent_downloads.max(1),
            pulls: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
            in_use: Mutex::new(HashMap::new()),
        });
        mgr.garbage_collect()?;
        Ok(mgr)
    }

    fn store(&self) -> std::sync::MutexGuard<'_, ImageStore> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn snapshotter(&self) -> &Snapshotter {
        &self.snapshots
    }

    /// Normalises what a CRI client sent: an image id, a tag or a digest reference.
    fn lookup_key(image: &str) -> Result<String, ImageError> {
        if let Some(id) = super::reference::looks_like_image_id(image) {
            return Ok(id.to_string());
        }
        let r = Reference::parse_normalized(image).map_err(|e| {
            ImageError::new(
                ErrorKind::InvalidArgument,
                format!("invalid image reference {image:?}: {e}"),
            )
        })?;
        Ok(r.to_string())
    }

    /// The image `image` names (id, tag or digest reference), if present.
    pub fn resolve(&self, image: &str) -> Result<Option<ImageRecord>, ImageError> {
        let key = Self::lookup_key(image)?;
        let mut s = self.store();
        s.reload_if_changed()
            .map_err(|e| ImageError::internal(e.to_string()))?;
        if let Some(r) = s.find(&key) {
            return Ok(Some(r.clone()));
        }
        // A bare short id prefix, as users type from `crictl images`.
        let hex = image.strip_prefix("sha256:").unwrap_or(image);
        if hex.len() >= 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            let matches: Vec<_> = s
                .list()
                .iter()
                .filter(|i| i.id.hex().starts_with(hex))
                .collect();
            if matches.len() == 1 {
                return Ok(Some(matches[0].clone()));
            }
        }
        Ok(None)
    }

    pub fn list(&self) -> Result<Vec<ImageRecord>, ImageError> {
        let mut s = self.store();
        s.reload_if_changed()
            .map_err(|e| ImageError::internal(e.to_string()))?;
        Ok(s.list().to_vec())
    }

    /// Reads the image's config blob (its OCI image configuration JSON).
    pub fn config_json(&self, img: &ImageRecord) -> Result<serde_json::Value, ImageError> {
        let bytes = self
            .content
            .read(&img.config)
            .map_err(|e| ImageError::internal(format!("reading config of {}: {e}", img.id)))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ImageError::internal(format!("config of {} is invalid: {e}", img.id)))
    }

    /// Pulls `image`, sharing the work with an identical pull already in flight.
    pub async fn pull(
        self: &Arc<Self>,
        image: &str,
        creds: Credentials,
    ) -> Result<ImageRecord, ImageError> {
        let reference = Reference::parse_normalized(image).map_err(|e| {
            ImageError::new(
                ErrorKind::InvalidArgument,
                format!("failed to pull and unpack image {image:?}: {e}"),
            )
        })?;
        let key = reference.to_string();
        let fut = {
            let mut pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
            pulls
                .entry(key.clone())
                .or_insert_with(|| {
                    let me = Arc::clone(self);
                    let r = reference.clone();
                    async move {
                        let res = me.do_pull(&r, &creds).await;
                        me.pulls
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&r.to_string());
                        res
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        fut.await
    }

    async fn do_pull(
        self: &Arc<Self>,
        reference: &Reference,
        creds: &Credentials,
    ) -> Result<ImageRecord, ImageError> {
        let name = reference.to_string();
        let ctx = format!("failed to pull and unpack image {name:?}");
        let started = std::time::Instant::now();
        let resolved: Resolved = self
            .registry
            .resolve(reference, creds)
            .await
            .map_err(|e| ImageError::from(e).context(&ctx))?;
        let mut lease = LeaseGuard {
            mgr: self,
            held: Vec::new(),
        };
        // Manifests are small and already verified by the resolver: keep them as blobs so
        // the image is self-describing on disk.
        let mut manifests = Vec::new();
        if let Some((digest, bytes)) = resolved.index() {
            lease.hold(digest);
            self.content
                .write_blob(digest, bytes)
                .map_err(|e| ImageError::from(e).context(&ctx))?;
            manifests.push(digest.clone());
        }
        let (mdigest, mbytes) = resolved.manifest_blob();
        lease.hold(mdigest);
        self.content
            .write_blob(mdigest, mbytes)
            .map_err(|e| ImageError::from(e).context(&ctx))?;
        manifests.push(mdigest.clone());

        let manifest = resolved.manifest();
        let config_desc = manifest.config.clone();
        lease.hold(&config_desc.digest);
        self.fetch_into_store(&resolved, &config_desc.digest, config_desc.size)
            .await
            .map_err(|e| e.context(&ctx))?;
        let config = self
            .load_config(&name, manifest)
            .map_err(|e| e.context(&ctx))?;
        let chains = chain_ids(&config.rootfs.diff_ids);
        let sem = Arc::new(tokio::sync::Semaphore::new(self.max_concurrent_downloads));
        let mut pending = Vec::new();
        for (layer, chain) in manifest.layers.iter().zip(&chains) {
            lease.hold(&layer.digest);
            lease.hold(chain);
            // A layer whose snapshot already exists needs no download (shared base layers).
            let download = if self.snapshots.exists(chain) || self.content.contains(&layer.digest) {
                None
            } else {
                let me = Arc::clone(self);
                let res = resolved.clone();
                let sem = Arc::clone(&sem);
                let (d, s) = (layer.digest.clone(), layer.size);
                Some(tokio::spawn(async move {
                    let _permit = sem
                        .acquire_owned()
                        .await
                        .map_err(|e| ImageError::internal(e.to_string()))?;
                    me.fetch_into_store(&res, &d, s).await
                }))
            };
            pending.push(PendingLayer {
                digest: layer.digest.clone(),
                size: layer.size,
                media_type: layer.media_type.clone(),
                download,
            });
        }
        let layers = self
            .unpack_layers(&name, pending, &config.rootfs.diff_ids)
            .await
            .map_err(|e| e.context(&ctx))?;

        let mut repo_tags = Vec::new();
        if reference.tag.is_some() || reference.digest.is_none() {
            repo_tags.push(name.clone());
        }
        let top = resolved.top_digest().clone();
        let repo_digests = vec![reference.with_digest(&top)];
        let size = config_desc.size
            + resolved.manifest_blob().1.len() as u64
            + resolved.index().map(|(_, b)| b.len() as u64).unwrap_or(0)
            + layers.iter().map(|l| l.size).sum::<u64>();
        let record = ImageRecord {
            id: config_desc.digest.clone(),
            repo_tags,
            repo_digests,
            manifests,
            config: config_desc.digest.clone(),
            layers,
            size,
            user: config.config.and_then(|c| c.user).unwrap_or_default(),
            pinned: false,
            created: config.created,
            annotations: Default::default(),
        };
        let record = self
            .store()
            .add(record)
            .map_err(|e| ImageError::internal(format!("{ctx}: {e}")))?;
        tracing::info!(
            image = %name,
            id = %record.id,
            repo_digest = %top,
            layers = record.layers.len(),
            size = record.size,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "pulled image"
        );
        drop(lease);
        Ok(record)
    }

    async fn fetch_into_store(
        &self,
        resolved: &Resolved,
        digest: &Digest,
        size: u64,
    ) -> Result<(), ImageError> {
        if self.content.contains(digest) {
            return Ok(());
        }
        let stream = self
            .registry
            .fetch_blob(resolved, digest, size)
            .await
            .map_err(ImageError::from)?;
        self.content
            .ingest(digest, Some(size), stream)
            .await
            .map_err(ImageError::from)?;
        Ok(())
    }

    /// Unpacks layers bottom-up, each as soon as its blob is there, verifying diffIDs.
    async fn unpack_layers(
        &self,
        image: &str,
        pending: Vec<PendingLayer>,
        diff_ids: &[Digest],
    ) -> Result<Vec<LayerRecord>, ImageError> {
        let chains = chain_ids(diff_ids);
        let mut out = Vec::with_capacity(pending.len());
        let mut handles: Vec<Option<JoinHandle<Result<(), ImageError>>>> =
            pending.iter().map(|_| None).collect();
        let mut layers = Vec::new();
        for (i, mut p) in pending.into_iter().enumerate() {
            handles[i] = p.download.take();
            layers.push(p);
        }
        let result = async {
            for (i, p) in layers.iter().enumerate() {
                let chain = &chains[i];
                if let Some(h) = handles[i].take() {
                    h.await
                        .map_err(|e| ImageError::internal(format!("download task failed: {e}")))??;
                }
                if !self.snapshots.exists(chain) {
                    let compression = Compression::from_media_type(&p.media_type).ok_or_else(|| {
                        ImageError::new(
                            ErrorKind::InvalidArgument,
                            format!(
                                "image {image}: layer {} has unsupported media type {:?}",
                                p.digest, p.media_type
                            ),
                        )
                    })?;
                    let blob = self.content.path(&p.digest);
                    let parents: Vec<PathBuf> = self.snapshots.lowerdirs(&chains[..i]);
                    let staging = self
                        .snapshots
                        .prepare()
                        .map_err(|e| ImageError::internal(format!("preparing snapshot: {e}")))?;
                    let dest = staging.path().to_path_buf();
                    let digest = p.digest.clone();
                    let stats = tokio::task::spawn_blocking(move || {
                        let f = std::fs::File::open(&blob)
                            .map_err(|e| format!("opening layer blob {}: {e}", blob.display()))?;
                        apply_layer(std::io::BufReader::with_capacity(1 << 20, f), compression, &dest, &parents)
                            .map_err(|e| format!("failed to extract layer {digest}: {e}"))
                    })
                    .await
                    .map_err(|e| ImageError::internal(format!("unpack task failed: {e}")))?
                    .map_err(ImageError::internal)?;
                    if stats.diff_id != diff_ids[i] {
                        return Err(ImageError::new(
                            ErrorKind::DataLoss,
                            format!(
                                "image {image}: layer {} unpacks to diffID {}, but the config says {}",
                                p.digest, stats.diff_id, diff_ids[i]
                            ),
                        ));
                    }
                    self.snapshots
                        .commit(staging, chain)
                        .map_err(|e| ImageError::internal(format!("committing snapshot {chain}: {e}")))?;
                }
                out.push(LayerRecord {
                    digest: p.digest.clone(),
                    size: p.size,
                    media_type: p.media_type.clone(),
                    diff_id: diff_ids[i].clone(),
                    chain_id: chain.clone(),
                });
            }
            Ok(())
        }
        .await;
        // On failure, stop the downloads still running: their blobs would only be garbage.
        for h in handles.into_iter().flatten() {
            h.abort();
        }
        result.map(|()| out)
    }

    /// Removes an image by id, tag or digest. Removing an absent image succeeds (the CRI
    /// contract); removing one a container uses fails.
    pub fn remove(&self, image: &str) -> Result<Option<ImageRecord>, ImageError> {
        let Some(rec) = self.resolve(image)? else {
            return Ok(None);
        };
        if self
            .in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&rec.id)
            .is_some_and(|n| *n > 0)
        {
            return Err(ImageError::new(
                ErrorKind::InUse,
                format!(
                    "image {image:?} ({}) is in use by a container; remove the container first",
                    rec.id
                ),
            ));
        }
        let removed = self
            .store()
            .remove(&rec.id)
            .map_err(|e| ImageError::internal(e.to_string()))?;
        self.garbage_collect()?;
        if let Some(r) = &removed {
            tracing::info!(image = %image, id = %r.id, "removed image");
        }
        Ok(removed)
    }

    /// Marks an image as used by a container (released with [`Self::release`]).
    pub fn acquire(&self, id: &Digest) {
        *self
            .in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.clone())
            .or_default() += 1;
    }

    pub fn release(&self, id: &Digest) {
        let mut m = self.in_use.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(id);
            }
        }
    }

    /// Deletes blobs and snapshots no image references and no pull holds.
    pub fn garbage_collect(&self) -> Result<(), ImageError> {
        let mut store = self.store();
        let _lock = store
            .lock()
            .map_err(|e| ImageError::internal(e.to_string()))?;
        store
            .reload_if_changed()
            .map_err(|e| ImageError::internal(e.to_string()))?;
        let (blobs, snaps) = store.referenced();
        let leased: HashSet<Digest> = self
            .leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        let mut removed = (0usize, 0usize);
        for d in self
            .snapshots
            .list()
            .map_err(|e| ImageError::internal(format!("listing snapshots: {e}")))?
        {
            if !snaps.contains(&d) && !leased.contains(&d) {
                self.snapshots
                    .remove(&d)
                    .map_err(|e| ImageError::internal(format!("removing snapshot {d}: {e}")))?;
                removed.1 += 1;
            }
        }
        for d in self
            .content
            .list()
            .map_err(|e| ImageError::internal(format!("listing blobs: {e}")))?
        {
            if !blobs.contains(&d) && !leased.contains(&d) {
                self.content
                    .delete(&d)
                    .map_err(|e| ImageError::internal(format!("removing blob {d}: {e}")))?;
                removed.0 += 1;
            }
        }
        if removed != (0, 0) {
            tracing::info!(
                blobs = removed.0,
                snapshots = removed.1,
                "garbage collected"
            );
        }
        Ok(())
    }

    pub fn fs_usage(&self) -> Result<FsUsage, ImageError> {
        let (sb, si) = self
            .snapshots
            .usage()
            .map_err(|e| ImageError::internal(format!("measuring snapshots: {e}")))?;
        let (cb, ci) = self
            .content
            .usage()
            .map_err(|e| ImageError::internal(format!("measuring content: {e}")))?;
        Ok(FsUsage {
            used_bytes: sb + cb,
            inodes_used: si + ci,
        })
    }

    /// The directory ImageFsInfo reports as the image filesystem's mountpoint.
    pub fn fs_mountpoint(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// Imports every image of an OCI archive (an OCI image layout in a tar).
    pub async fn import_archive(
        self: &Arc<Self>,
        path: &Path,
        name: Option<&str>,
    ) -> Result<Vec<ImageRecord>, ImageError> {
        super::import::import_archive(self, path, name).await
    }

    /// Unpacks and records an image whose blobs are all in the content store already.
    pub(crate) async fn register_local(
        &self,
        names: Vec<Reference>,
        top_digest: &Digest,
        manifests: Vec<Digest>,
        manifest: &super::distribution::Manifest,
    ) -> Result<ImageRecord, ImageError> {
        let display = names
            .first()
            .map(|r| r.to_string())
            .unwrap_or_else(|| top_digest.to_string());
        let mut lease = LeaseGuard {
            mgr: self,
            held: Vec::new(),
        };
        for d in &manifests {
            lease.hold(d);
        }
        let config = self.load_config(&display, manifest)?;
        let chains = chain_ids(&config.rootfs.diff_ids);
        let mut pending = Vec::new();
        for (l, c) in manifest.layers.iter().zip(&chains) {
            lease.hold(&l.digest);
            lease.hold(c);
            if !self.content.contains(&l.digest) && !self.snapshots.exists(c) {
                return Err(ImageError::new(
                    ErrorKind::NotFound,
                    format!("image {display}: layer blob {} is missing", l.digest),
                ));
            }
            pending.push(PendingLayer {
                digest: l.digest.clone(),
                size: l.size,
                media_type: l.media_type.clone(),
                download: None,
            });
        }
        let layers = self
            .unpack_layers(&display, pending, &config.rootfs.diff_ids)
            .await?;
        let size = manifest.config.size + layers.iter().map(|l| l.size).sum::<u64>();
        let record = ImageRecord {
            id: manifest.config.digest.clone(),
            repo_tags: names
                .iter()
                .filter(|r| r.digest.is_none())
                .map(|r| r.to_string())
                .collect(),
            repo_digests: names.iter().map(|r| r.with_digest(top_digest)).collect(),
            manifests,
            config: manifest.config.digest.clone(),
            layers,
            size,
            user: config.config.and_then(|c| c.user).unwrap_or_default(),
            pinned: false,
            created: config.created,
            annotations: Default::default(),
        };
        self.store()
            .add(record)
            .map_err(|e| ImageError::internal(e.to_string()))
    }

    pub(crate) fn content(&self) -> &ContentStore {
        &self.content
    }
}
