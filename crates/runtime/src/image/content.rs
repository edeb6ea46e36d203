//! The content store: blobs (manifests, configs, layers) addressed by their sha256 digest.
//!
//! Layout under `<root>/content`, as containerd's `content/local` store:
//!
//! ```text
//! blobs/sha256/<hex>   committed blobs, immutable, always complete and verified
//! ingest/              downloads in progress (removed at open: leftovers of a crash)
//! ```
//!
//! A blob becomes visible only by an atomic rename after its size and digest were checked
//! and its data fsynced, so a reader never sees a half-written or unverified blob. Concurrent
//! ingests of one digest are serialised by a per-digest lock: the second waits for the first
//! and then finds the blob present instead of downloading it again.

use super::digest::{Digest, Hasher};
use super::snapshot::disk_usage;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Boxed error of a blob source (usually the network).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Largest blob [`ContentStore::read`] loads into memory. Manifests are limited to 4 MiB by
/// registries and containerd; configs of images with long histories reach a few MiB.
pub const MAX_READ: u64 = 64 << 20;

/// Writes to disk are issued in chunks of at least this size.
const WRITE_CHUNK: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    #[error(
        "blob {expected}: the received content has digest {actual}; the registry or mirror \
         served different data than the manifest names (retry, or check the mirror)"
    )]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error("blob {digest}: size is {actual} bytes but the descriptor says {expected} bytes")]
    SizeMismatch {
        digest: Digest,
        expected: u64,
        actual: u64,
    },
    #[error(
        "blob {digest}: the stream ended after {actual} of {expected} bytes (connection \
         dropped?); retry the pull"
    )]
    Truncated {
        digest: Digest,
        expected: u64,
        actual: u64,
    },
    #[error("blob {digest}: reading from the source failed: {source}")]
    Source {
        digest: Digest,
        #[source]
        source: BoxError,
    },
    #[error("blob {0} is not in the content store")]
    NotFound(Digest),
    #[error(
        "blob {digest} is {size} bytes, more than the {limit}-byte limit for reading it into \
         memory"
    )]
    TooLarge {
        digest: Digest,
        size: u64,
        limit: u64,
    },
    #[error("content store: {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ContentError + 'a {
    move |source| ContentError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

type LockMap = Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>;

/// The blob store. Cheap to clone; clones share the per-digest locks.
#[derive(Clone)]
pub struct ContentStore {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    blobs: PathBuf,
    ingest: PathBuf,
    locks: LockMap,
}

/// Holds the per-digest ingest lock; removes the map entry when the last user is gone.
struct DigestLock<'a> {
    map: &'a LockMap,
    digest: Digest,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for DigestLock<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lock) = map.get(&self.digest)
            && Arc::strong_count(lock) == 1
        {
            map.remove(&self.digest);
        }
    }
}

enum Chunk {
    Data(Bytes),
    Finish,
}

impl ContentStore {
    /// Opens (creating if needed) the store under `<root>/content` and deletes the partial
    /// downloads a crash may have left in `ingest/`.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, ContentError> {
        let root = root.as_ref().join("content");
        let blobs = root.join("blobs").join("sha256");
        let ingest = root.join("ingest");
        std::fs::create_dir_all(&blobs).map_err(io_err("create", &blobs))?;
        if ingest.exists() {
            std::fs::remove_dir_all(&ingest).map_err(io_err("clean up", &ingest))?;
        }
        std::fs::create_dir_all(&ingest).map_err(io_err("create", &ingest))?;
        Ok(Self {
            inner: Arc::new(Inner {
                root,
                blobs,
                ingest,
                locks: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The store's directory (`<root>/content`).
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Where the blob lives (or would live) on disk.
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.inner.blobs.join(digest.hex())
    }

    pub fn contains(&self, digest: &Digest) -> bool {
        std::fs::symlink_metadata(self.path(digest)).is_ok_and(|m| m.is_file())
    }

    /// The size of a committed blob.
    pub fn size(&self, digest: &Digest) -> Result<u64, ContentError> {
        let path = self.path(digest);
        match std::fs::symlink_metadata(&path) {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(ContentError::NotFound(digest.clone()))
            }
            Err(e) => Err(io_err("stat", &path)(e)),
        }
    }

    /// Opens a committed blob for streaming (layers).
    pub fn open_blob(&self, digest: &Digest) -> Result<File, ContentError> {
        let path = self.path(digest);
        File::open(&path).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                ContentError::NotFound(digest.clone())
            } else {
                io_err("open", &path)(e)
            }
        })
    }

    /// Reads a whole blob into memory (manifests, indexes, configs), refusing blobs larger
    /// than [`MAX_READ`], and re-verifies its digest (cheap at these sizes, and it catches
    /// on-disk corruption before a bad manifest is trusted).
    pub fn read(&self, digest: &Digest) -> Result<Vec<u8>, ContentError> {
        self.read_limited(digest, MAX_READ)
    }

    /// [`read`](Self::read) with a caller-chosen size limit.
    pub fn read_limited(&self, digest: &Digest, limit: u64) -> Result<Vec<u8>, ContentError> {
        let path = self.path(digest);
        let mut file = self.open_blob(digest)?;
        let size = file.metadata().map_err(io_err("stat", &path))?.len();
        if size > limit {
            return Err(ContentError::TooLarge {
                digest: digest.clone(),
                size,
                limit,
            });
        }
        let mut data = Vec::with_capacity(size as usize);
        Read::by_ref(&mut file)
            .take(limit + 1)
            .read_to_end(&mut data)
            .map_err(io_err("read", &path))?;
        if data.len() as u64 > limit {
            return Err(ContentError::TooLarge {
                digest: digest.clone(),
                size: data.len() as u64,
                limit,
            });
        }
        let actual = Digest::of(&data);
        if &actual != digest {
            return Err(ContentError::DigestMismatch {
                expected: digest.clone(),
                actual,
            });
        }
        Ok(data)
    }

    /// Stores `data` under its own digest and returns that digest.
    pub fn put(&self, data: &[u8]) -> Result<Digest, ContentError> {
        let digest = Digest::of(data);
        self.commit_bytes(&digest, data)?;
        Ok(digest)
    }

    /// Stores `data` after checking that it has the digest `expected`.
    pub fn write_blob(&self, expected: &Digest, data: &[u8]) -> Result<(), ContentError> {
        let actual = Digest::of(data);
        if &actual != expected {
            return Err(ContentError::DigestMismatch {
                expected: expected.clone(),
                actual,
            });
        }
        self.commit_bytes(expected, data)
    }

    fn commit_bytes(&self, digest: &Digest, data: &[u8]) -> Result<(), ContentError> {
        if self.contains(digest) {
            return Ok(());
        }
        let mut tmp = self.temp_file(digest)?;
        let tmp_path = tmp.path().to_path_buf();
        tmp.write_all(data).map_err(io_err("write", &tmp_path))?;
        self.commit_temp(tmp, digest)
    }

    fn temp_file(&self, digest: &Digest) -> Result<tempfile::NamedTempFile, ContentError> {
        tempfile::Builder::new()
            .prefix(&format!("{}.", digest.hex()))
            .tempfile_in(&self.inner.ingest)
            .map_err(io_err("create ingest file in", &self.inner.ingest))
    }

    /// fsync, rename into `blobs/sha256/<hex>`, fsync the directory.
    fn commit_temp(
        &self,
        tmp: tempfile::NamedTempFile,
        digest: &Digest,
    ) -> Result<(), ContentError> {
        let tmp_path = tmp.path().to_path_buf();
        tmp.as_file()
            .sync_all()
            .map_err(io_err("fsync", &tmp_path))?;
        let dest = self.path(digest);
        // Read-only like containerd's committed blobs: nothing should ever modify them.
        let _ = tmp
            .as_file()
            .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o444));
        tmp.persist(&dest)
            .map_err(|e| io_err("commit", &dest)(e.error))?;
        sync_dir(&self.inner.blobs)
    }

    /// Downloads a blob from `stream` into the store.
    ///
    /// The data is hashed and written to an ingest file off the async runtime; the size is
    /// checked as it arrives (more bytes than `expected_size` stop the download at once) and
    /// at the end, then the digest; the file is fsynced and renamed into place. If the blob is
    /// already present, the stream is not polled at all. Concurrent ingests of one digest
    /// download it once. Dropping the future abandons the download and removes its file.
    /// Returns the blob's size.
    pub async fn ingest<S, E>(
        &self,
        expected: &Digest,
        expected_size: Option<u64>,
        stream: S,
    ) -> Result<u64, ContentError>
    where
        S: Stream<Item = Result<Bytes, E>>,
        E: Into<BoxError>,
    {
        if let Some(size) = self.present(expected, expected_size)? {
            return Ok(size);
        }
        let _lock = self.lock(expected).await;
        if let Some(size) = self.present(expected, expected_size)? {
            tracing::debug!(digest = %expected, "blob already ingested by a concurrent pull");
            return Ok(size);
        }

        let tmp = self.temp_file(expected)?;
        let (tx, rx) = mpsc::channel::<Chunk>(4);
        let this = self.clone();
        let digest = expected.clone();
        let writer =
            tokio::task::spawn_blocking(move || this.write_ingest(tmp, rx, &digest, expected_size));

        let blob = self.path(expected);
        let mut stream = std::pin::pin!(stream);
        let mut received: u64 = 0;
        let mut pending = BytesMut::new();
        while let Some(item) = stream.next().await {
            let data = item.map_err(|e| ContentError::Source {
                digest: expected.clone(),
                source: e.into(),
            })?;
            received += data.len() as u64;
            if let Some(size) = expected_size
                && received > size
            {
                return Err(ContentError::SizeMismatch {
                    digest: expected.clone(),
                    expected: size,
                    actual: received,
                });
            }
            if pending.is_empty() && data.len() >= WRITE_CHUNK {
                send(&tx, Chunk::Data(data), &blob).await?;
                continue;
            }
            pending.extend_from_slice(&data);
            if pending.len() >= WRITE_CHUNK {
                send(&tx, Chunk::Data(pending.split().freeze()), &blob).await?;
            }
        }
        if let Some(size) = expected_size
            && received < size
        {
            return Err(ContentError::Truncated {
                digest: expected.clone(),
                expected: size,
                actual: received,
            });
        }
        if !pending.is_empty() {
            send(&tx, Chunk::Data(pending.freeze()), &blob).await?;
        }
        send(&tx, Chunk::Finish, &blob).await?;
        drop(tx);
        match writer.await {
            Ok(r) => r,
            Err(e) => Err(ContentError::Io {
                op: "write (task failed)",
                path: blob,
                source: io::Error::other(e.to_string()),
            }),
        }
    }

    fn present(
        &self,
        digest: &Digest,
        expected_size: Option<u64>,
    ) -> Result<Option<u64>, ContentError> {
        match self.size(digest) {
            Ok(size) => match expected_size {
                Some(e) if e != size => Err(ContentError::SizeMismatch {
                    digest: digest.clone(),
                    expected: e,
                    actual: size,
                }),
                _ => Ok(Some(size)),
            },
            Err(ContentError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn lock(&self, digest: &Digest) -> DigestLock<'_> {
        let mutex = {
            let mut map = self.inner.locks.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(digest.clone()).or_default().clone()
        };
        let guard = mutex.lock_owned().await;
        DigestLock {
            map: &self.inner.locks,
            digest: digest.clone(),
            guard: Some(guard),
        }
    }

    /// The blocking half of [`ingest`](Self::ingest): hash, write, verify, commit.
    fn write_ingest(
        &self,
        mut tmp: tempfile::NamedTempFile,
        mut rx: mpsc::Receiver<Chunk>,
        expected: &Digest,
        expected_size: Option<u64>,
    ) -> Result<u64, ContentError> {
        let tmp_path = tmp.path().to_path_buf();
        let mut hasher = Hasher::new();
        loop {
            match rx.blocking_recv() {
                Some(Chunk::Data(data)) => {
                    hasher.update(&data);
                    tmp.write_all(&data).map_err(io_err("write", &tmp_path))?;
                }
                Some(Chunk::Finish) => break,
                // The download was abandoned: the temp file is removed on drop.
                None => {
                    return Err(ContentError::Io {
                        op: "ingest abandoned",
                        path: tmp_path,
                        source: io::Error::from(io::ErrorKind::Interrupted),
                    });
                }
            }
        }
        let size = hasher.len();
        if let Some(e) = expected_size
            && e != size
        {
            return Err(ContentError::SizeMismatch {
                digest: expected.clone(),
                expected: e,
                actual: size,
            });
        }
        let actual = hasher.finish();
        if &actual != expected {
            return Err(ContentError::DigestMismatch {
                expected: expected.clone(),
                actual,
            });
        }
        self.commit_temp(tmp, expected)?;
        tracing::debug!(digest = %expected, size, "blob committed");
        Ok(size)
    }

    /// Deletes a blob. Returns whether it existed.
    pub fn delete(&self, digest: &Digest) -> Result<bool, ContentError> {
        let path = self.path(digest);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err("delete", &path)(e)),
        }
    }

    /// The digests of all committed blobs (names that are not valid digests are skipped).
    pub fn list(&self) -> Result<Vec<Digest>, ContentError> {
        let dir = &self.inner.blobs;
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io_err("list", dir))? {
            let entry = entry.map_err(io_err("list", dir))?;
            if let Some(digest) = entry
                .file_name()
                .to_str()
                .and_then(|n| Digest::from_hex(n).ok())
            {
                out.push(digest);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Disk space (bytes of allocated blocks) and inodes used by the store.
    pub fn usage(&self) -> Result<(u64, u64), ContentError> {
        disk_usage(&self.inner.root).map_err(io_err("measure", &self.inner.root))
    }
}

async fn send(tx: &mpsc::Sender<Chunk>, chunk: Chunk, blob: &Path) -> Result<(), ContentError> {
    // The writer only hangs up after an error it reports through its join handle; this
    // path is reached only if it panicked or was cancelled.
    tx.send(chunk).await.map_err(|_| ContentError::Io {
        op: "write (writer stopped)",
        path: blob.to_path_buf(),
        source: io::Error::from(io::ErrorKind::BrokenPipe),
    })
}

/// fsync a directory so a rename into it survives a crash.
pub(super) fn sync_dir(dir: &Path) -> Result<(), ContentError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;

    fn chunks(data: &[u8], n: usize) -> Vec<Result<Bytes, io::Error>> {
        data.chunks(n)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect()
    }

    fn ingest_files(store: &ContentStore) -> usize {
        std::fs::read_dir(&store.inner.ingest).unwrap().count()
    }

    #[tokio::test]
    async fn ingest_verifies_and_commits() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let d = Digest::of(&data);
        let n = store
            .ingest(
                &d,
                Some(data.len() as u64),
                stream::iter(chunks(&data, 16 * 1024)),
            )
            .await
            .unwrap();
        assert_eq!(n, data.len() as u64);
        assert!(store.contains(&d));
        assert_eq!(store.size(&d).unwrap(), data.len() as u64);
        assert_eq!(store.read(&d).unwrap(), data);
        assert_eq!(
            store.path(&d),
            dir.path().join("content/blobs/sha256").join(d.hex())
        );
        assert_eq!(ingest_files(&store), 0);

        // Present: the stream is not even polled.
        let n = store
            .ingest(
                &d,
                None,
                stream::iter(vec![Err::<Bytes, _>(io::Error::other("must not be read"))]),
            )
            .await
            .unwrap();
        assert_eq!(n, data.len() as u64);

        let mut f = store.open_blob(&d).unwrap();
        let mut back = Vec::new();
        f.read_to_end(&mut back).unwrap();
        assert_eq!(back, data);
        assert!(matches!(
            store.read_limited(&d, 100),
            Err(ContentError::TooLarge { .. })
        ));
    }

    #[tokio::test]
    async fn ingest_rejects_bad_content() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let data = b"hello world".to_vec();
        let d = Digest::of(&data);

        let wrong = Digest::of(b"other");
        let err = store
            .ingest(&wrong, None, stream::iter(chunks(&data, 3)))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ContentError::DigestMismatch { expected, actual } if *expected == wrong && *actual == d),
            "{err}"
        );
        assert!(err.to_string().contains(&wrong.to_string()));

        let err = store
            .ingest(&d, Some(5), stream::iter(chunks(&data, 3)))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ContentError::SizeMismatch { expected: 5, .. }),
            "{err}"
        );

        let err = store
            .ingest(&d, Some(20), stream::iter(chunks(&data, 3)))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ContentError::Truncated {
                    expected: 20,
                    actual: 11,
                    ..
                }
            ),
            "{err}"
        );

        let mut items = chunks(&data, 3);
        items.insert(2, Err(io::Error::other("connection reset")));
        let err = store
            .ingest(&d, None, stream::iter(items))
            .await
            .unwrap_err();
        assert!(matches!(err, ContentError::Source { .. }), "{err}");
        assert!(err.to_string().contains("connection reset"), "{err}");

        // Give the abandoned writers a moment to clean up after themselves.
        for _ in 0..100 {
            if ingest_files(&store) == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(ingest_files(&store), 0);
        assert!(!store.contains(&d));
        assert!(matches!(store.size(&d), Err(ContentError::NotFound(_))));
    }

    #[tokio::test]
    async fn concurrent_ingests_download_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let data: Vec<u8> = vec![7u8; 200_000];
        let d = Digest::of(&data);
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mk = |polls: Arc<std::sync::atomic::AtomicUsize>| {
            let data = data.clone();
            stream::iter(chunks(&data, 1000)).then(move |c| {
                let polls = polls.clone();
                async move {
                    polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    c
                }
            })
        };
        let (a, b) = tokio::join!(
            store.ingest(&d, Some(data.len() as u64), mk(polls.clone())),
            store.ingest(&d, Some(data.len() as u64), mk(polls.clone())),
        );
        assert_eq!(a.unwrap(), 200_000);
        assert_eq!(b.unwrap(), 200_000);
        assert_eq!(polls.load(std::sync::atomic::Ordering::SeqCst), 200);
        assert!(store.inner.locks.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn dropped_ingest_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let d = Digest::of(b"never finished");
        let s = stream::iter(vec![Ok::<_, io::Error>(Bytes::from_static(b"never"))])
            .chain(stream::pending());
        let r = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            store.ingest(&d, None, s),
        )
        .await;
        assert!(r.is_err());
        for _ in 0..100 {
            if ingest_files(&store) == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(ingest_files(&store), 0);
        assert!(!store.contains(&d));
    }

    #[test]
    fn blobs_put_list_delete_and_crash_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let a = store.put(b"{\"a\":1}").unwrap();
        let b = Digest::of(b"bbb");
        store.write_blob(&b, b"bbb").unwrap();
        assert!(matches!(
            store.write_blob(&b, b"ccc"),
            Err(ContentError::DigestMismatch { .. })
        ));
        let mut want = vec![a.clone(), b.clone()];
        want.sort();
        assert_eq!(store.list().unwrap(), want);
        let (bytes, inodes) = store.usage().unwrap();
        assert!(bytes > 0 && inodes >= 2, "{bytes} {inodes}");

        assert!(store.delete(&a).unwrap());
        assert!(!store.delete(&a).unwrap());
        assert!(matches!(store.read(&a), Err(ContentError::NotFound(_))));

        std::fs::write(store.inner.ingest.join("partial"), b"half").unwrap();
        drop(store);
        let store = ContentStore::open(dir.path()).unwrap();
        assert_eq!(ingest_files(&store), 0);
        assert!(store.contains(&b));
    }
}
