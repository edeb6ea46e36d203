//! Applying one image layer (a possibly compressed tar changeset) into an empty directory
//! that becomes an overlay snapshot, as containerd's overlayfs snapshotter does it
//! (`archive.Apply` with `OverlayConvertWhiteout` and `WithParents`).
//!
//! * Three threads form a pipeline: one decompresses the blob (zlib-rs / libzstd), one hashes
//!   the *uncompressed* stream into the layer's diffID, the caller's writes the files. The
//!   stream is read to its very end (past the tar's end-of-archive blocks), so the diffID
//!   covers all of it, as containerd's applier does.
//! * Whiteouts become overlayfs whiteouts: `.wh.NAME` → a 0:0 character device `NAME`;
//!   `DIR/.wh..wh..opq` → `trusted.overlay.opaque=y` on `DIR`; other `.wh..wh.*` entries are
//!   ignored.
//! * Safety: entry names are cleaned lexically (leading `/` dropped, `..` may not climb above
//!   the root: such an entry is an error naming it); parents are opened with
//!   `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and every entry is created with `*at`
//!   calls relative to its parent's descriptor, never following a symlink in the final
//!   component. A parent that is a symlink created by this same layer is resolved the way
//!   containerd does (`fs.RootPath`), with `RESOLVE_IN_ROOT`, i.e. contained in the layer
//!   directory; it can never lead outside it. Hard-link targets are resolved the same way.
//! * Parents missing from the tar are created with the mode, owner, times and xattrs of the
//!   directory in the topmost parent layer that has it (containerd's `mkparent`), else 0755.
//! * A hard link whose target is not in this layer is satisfied by copying the target up
//!   from the topmost parent layer that has it (honouring whiteouts and opaque directories).
//!
//! Nothing is fsynced here: the snapshotter's commit makes the directory visible atomically.

use super::digest::{Digest, Hasher};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, mpsc};

/// Size of the uncompressed chunks handed from the decompressing thread to the writer.
const CHUNK: usize = 256 * 1024;
/// Chunks in flight between the two threads.
const QUEUE: usize = 16;
/// Read buffer for the compressed blob.
const SOURCE_BUFFER: usize = 256 * 1024;
/// Open directory descriptors kept for the entries that follow.
const DIR_CACHE: usize = 256;

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const WHITEOUT_META_PREFIX: &[u8] = b".wh..wh.";
const WHITEOUT_OPAQUE: &[u8] = b".wh..wh..opq";
const OPAQUE_XATTR: &std::ffi::CStr = c"trusted.overlay.opaque";

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "uncompressed",
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        })
    }
}

impl Compression {
    /// The compression a layer media type declares: OCI `…layer.v1.tar[+gzip|+zstd]` (also
    /// the non-distributable variants) and Docker `…rootfs.diff.tar[.gzip|.zstd]` (also
    /// foreign layers). `None` for encrypted and unknown media types.
    pub fn from_media_type(media_type: &str) -> Option<Self> {
        let mt = media_type.split(';').next().unwrap_or_default().trim();
        let base = [
            "application/vnd.oci.image.layer.v1.tar",
            "application/vnd.oci.image.layer.nondistributable.v1.tar",
            "application/vnd.docker.image.rootfs.diff.tar",
            "application/vnd.docker.image.rootfs.foreign.diff.tar",
        ]
        .into_iter()
        .find(|b| mt.starts_with(b))?;
        match &mt[base.len()..] {
            "" => Some(Compression::None),
            "+gzip" | ".gzip" => Some(Compression::Gzip),
            "+zstd" | ".zstd" => Some(Compression::Zstd),
            _ => None,
        }
    }

    /// The compression the stream's magic bytes show; `None` for anything else.
    fn detect(head: &[u8]) -> Self {
        if head.starts_with(&[0x1f, 0x8b, 0x08]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// What applying a layer produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerStats {
    /// sha256 of the uncompressed tar stream; compare with the config's `rootfs.diff_ids`.
    pub diff_id: Digest,
    /// Length of the uncompressed tar stream.
    pub size: u64,
    /// Tar entries read (including whiteouts and skipped entries).
    pub entries: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("reading the {compression} layer blob failed: {source}")]
    Decompress {
        compression: Compression,
        #[source]
        source: io::Error,
    },
    #[error("the layer is not a valid tar stream: {0}")]
    Tar(#[source] io::Error),
    #[error("layer entry {entry:?} rejected: {reason}")]
    Unsafe { entry: String, reason: String },
    #[error("layer entry {entry:?}: unsupported tar entry type {kind}")]
    UnsupportedEntry { entry: String, kind: String },
    #[error("layer entry {entry:?}: {op}: {source}")]
    Entry {
        entry: String,
        op: String,
        #[source]
        source: io::Error,
    },
    #[error("unpacking into {}: {op}: {source}", path.display())]
    Dest {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Applies one layer read from `compressed` into the empty directory `dest`.
///
/// `parents` are the snapshot directories of the layers below, topmost first; they are only
/// read (for the metadata of parent directories the tar omits, and to copy up hard-link
/// targets). Blocking: call it from `spawn_blocking` or a thread of its own. On error `dest`
/// is left partly written; the caller discards it (a snapshotter staging directory).
///
/// `compression` is what the media type declares; as containerd's `DecompressStream` does,
/// the stream's magic bytes decide (a mismatch is logged).
pub fn apply_layer<R: Read + Send>(
    compressed: R,
    compression: Compression,
    dest: &Path,
    parents: &[PathBuf],
) -> Result<LayerStats, UnpackError> {
    let open_dir = |p: &Path| {
        File::open(p)
            .and_then(|f| {
                if f.metadata()?.is_dir() {
                    Ok(OwnedFd::from(f))
                } else {
                    Err(io::Error::from_raw_os_error(libc::ENOTDIR))
                }
            })
            .map_err(|source| UnpackError::Dest {
                op: "open directory",
                path: p.to_path_buf(),
                source,
            })
    };
    let root = open_dir(dest)?;
    let lowers = parents
        .iter()
        .map(|p| open_dir(p))
        .collect::<Result<Vec<_>, _>>()?;

    // Three threads: this one writes files, one decompresses, one hashes the diffID. Chunks
    // are shared (Arc) between the writer and the hasher and recycled to the decompressor.
    let (tx, rx) = mpsc::sync_channel::<io::Result<Chunk>>(QUEUE);
    let (hash_tx, hash_rx) = mpsc::sync_channel::<Chunk>(QUEUE);
    let (recycle_tx, recycle_rx) = mpsc::sync_channel::<Chunk>(2 * QUEUE + 4);
    let spawn_err = |source| UnpackError::Dest {
        op: "spawn unpack thread",
        path: dest.to_path_buf(),
        source,
    };
    std::thread::scope(|s| {
        let hasher = {
            let recycle = recycle_tx.clone();
            std::thread::Builder::new()
                .name("layer-diffid".into())
                .spawn_scoped(s, move || hash_chunks(hash_rx, recycle))
                .map_err(spawn_err)?
        };
        let producer = std::thread::Builder::new()
            .name("layer-decompress".into())
            .spawn_scoped(s, move || {
                produce(compressed, compression, tx, hash_tx, recycle_rx)
            })
            .map_err(spawn_err)?;
        let mut reader = ChunkReader {
            rx,
            recycle: recycle_tx,
            cur: Chunk::default(),
            pos: 0,
        };
        let mut applier = Applier {
            root: Rc::new(root),
            lowers,
            cache: HashMap::new(),
            dir_times: Vec::new(),
            buf: vec![0; CHUNK],
            entries: 0,
        };
        let applied = applier.run(&mut reader);
        // On error this hangs up on the decompressor, which then stops, and so the hasher.
        drop(reader);
        let panicked = |what: &str| UnpackError::Decompress {
            compression,
            source: io::Error::other(format!("{what} thread panicked")),
        };
        let produced = producer
            .join()
            .unwrap_or_else(|_| Err(panicked("decompression")));
        let hashed = hasher.join().map_err(|_| panicked("hashing"));
        match (applied, produced, hashed) {
            (Ok(()), Ok(()), Ok((diff_id, size))) => Ok(LayerStats {
                diff_id,
                size,
                entries: applier.entries,
            }),
            // A broken blob shows up in the tar reader too; the decompressor knows why.
            (Err(UnpackError::Tar(_)) | Ok(()), Err(e), _) => Err(e),
            (Err(e), _, _) => Err(e),
            (Ok(()), Ok(()), Err(e)) => Err(e),
        }
    })
}

/// A piece of the uncompressed stream, shared by the writer and the hasher.
type Chunk = Arc<Vec<u8>>;

/// The hashing thread: the diffID is the sha256 of the whole uncompressed stream.
fn hash_chunks(rx: mpsc::Receiver<Chunk>, recycle: mpsc::SyncSender<Chunk>) -> (Digest, u64) {
    let mut hasher = Hasher::new();
    for chunk in rx {
        hasher.update(&chunk);
        let _ = recycle.try_send(chunk);
    }
    let size = hasher.len();
    (hasher.finish(), size)
}

/// The decompressing thread: reads the blob, decompresses, hands chunks to the writer and
/// the hasher.
fn produce<R: Read>(
    compressed: R,
    declared: Compression,
    tx: mpsc::SyncSender<io::Result<Chunk>>,
    hash_tx: mpsc::SyncSender<Chunk>,
    recycle: mpsc::Receiver<Chunk>,
) -> Result<(), UnpackError> {
    let mut src = BufReader::with_capacity(SOURCE_BUFFER, compressed);
    let head = src.fill_buf().map_err(|source| UnpackError::Decompress {
        compression: declared,
        source,
    })?;
    let compression = Compression::detect(head);
    if compression != declared {
        tracing::warn!(%declared, detected = %compression, "layer compression differs from its media type; using the detected one");
    }
    let fail = |source: io::Error| UnpackError::Decompress {
        compression,
        source,
    };
    let mut decoder: Box<dyn Read> = match compression {
        Compression::None => Box::new(src),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(src)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(src).map_err(fail)?),
    };
    loop {
        // A chunk both the writer and the hasher are done with, else a new one.
        let mut buf = loop {
            match recycle.try_recv() {
                Ok(chunk) => match Arc::try_unwrap(chunk) {
                    Ok(buf) => break buf,
                    Err(_still_in_use) => continue,
                },
                Err(_) => break Vec::new(),
            }
        };
        buf.resize(CHUNK, 0);
        let mut filled = 0;
        let mut eof = false;
        while filled < CHUNK {
            match decoder.read(&mut buf[filled..]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                    return Err(fail(e));
                }
            }
        }
        buf.truncate(filled);
        if filled > 0 {
            let chunk = Arc::new(buf);
            if hash_tx.send(chunk.clone()).is_err() || tx.send(Ok(chunk)).is_err() {
                // The writer stopped (it reports why).
                return Err(fail(io::Error::from(io::ErrorKind::BrokenPipe)));
            }
        }
        if eof {
            return Ok(());
        }
    }
}

/// The writer's view of the uncompressed stream.
struct ChunkReader {
    rx: mpsc::Receiver<io::Result<Chunk>>,
    recycle: mpsc::SyncSender<Chunk>,
    cur: Chunk,
    pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.pos < self.cur.len() {
                let n = out.len().min(self.cur.len() - self.pos);
                out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            match self.rx.recv() {
                Ok(Ok(next)) => {
                    let old = std::mem::replace(&mut self.cur, next);
                    self.pos = 0;
                    let _ = self.recycle.try_send(old);
                }
                Ok(Err(e)) => return Err(e),
                Err(mpsc::RecvError) => return Ok(0),
            }
        }
    }
}

/// Timestamps to set on a node.
#[derive(Clone, Copy)]
struct Times {
    atime: TimeSpec,
    mtime: TimeSpec,
}

/// What a tar header says about a node.
struct Meta {
    uid: u32,
    gid: u32,
    mode: u32,
    times: Times,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn ts(sec: i64, nsec: i64) -> TimeSpec {
    // containerd's boundTime: times before the epoch become the epoch.
    if sec < 0 {
        TimeSpec::new(0, 0)
    } else {
        TimeSpec::new(sec, nsec)
    }
}

/// A PAX time (`1234567890.123456789`, possibly negative).
fn parse_pax_time(v: &[u8]) -> Option<(i64, i64)> {
    let s = std::str::from_utf8(v).ok()?;
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = sec.parse().ok()?;
    let mut nsec: i64 = 0;
    for (i, c) in frac.chars().take(9).enumerate() {
        nsec += i64::from(c.to_digit(10)?) * 10i64.pow(8 - i as u32);
    }
    if sec.starts_with('-') && nsec > 0 {
        return Some((secs - 1, 1_000_000_000 - nsec));
    }
    Some((secs, nsec))
}

/// Lexically cleans an entry name into a relative path without `.`/`..`/empty components.
/// `Ok(None)` is the root itself.
fn clean_path(raw: &[u8]) -> Result<Option<Vec<u8>>, &'static str> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for comp in raw.split(|b| *b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                if parts.pop().is_none() {
                    return Err("its path climbs out of the layer root with '..'");
                }
            }
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return Ok(None);
    }
    Ok(Some(parts.join(&b'/')))
}

/// `a/b/c` → (`a/b`, `c`); `c` → (``, `c`).
fn split(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|b| *b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&[], rel),
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

fn cstring(b: &[u8]) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn fsetxattr(fd: &impl AsRawFd, name: &[u8], value: &[u8]) -> io::Result<()> {
    let name = cstring(name)?;
    // SAFETY: valid fd, NUL-terminated name, value pointer/length from a slice.
    let r = unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// lsetxattr on `name` inside the directory `dirfd`, through `/proc/self/fd` (there is no
/// `lsetxattrat` before Linux 6.13); the last component is not followed.
fn lsetxattr_at(dirfd: &impl AsRawFd, name: &[u8], key: &[u8], value: &[u8]) -> io::Result<()> {
    let mut path = format!("/proc/self/fd/{}/", dirfd.as_raw_fd()).into_bytes();
    path.extend_from_slice(name);
    let path = cstring(&path)?;
    let key = cstring(key)?;
    // SAFETY: NUL-terminated strings, value from a slice.
    let r = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            key.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn fgetxattr(fd: &impl AsRawFd, name: &std::ffi::CStr) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: buffer pointer/length from a Vec.
        let n = unsafe {
            libc::fgetxattr(
                fd.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(Some(buf));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::ENOTSUP) => return Ok(None),
            Some(libc::ERANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            _ => return Err(e),
        }
    }
}

/// All xattrs of an open node except `trusted.*` (which containerd never copies up).
fn copyable_xattrs(fd: &impl AsRawFd) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut names = vec![0u8; 1024];
    loop {
        // SAFETY: buffer pointer/length from a Vec.
        let n = unsafe { libc::flistxattr(fd.as_raw_fd(), names.as_mut_ptr().cast(), names.len()) };
        if n >= 0 {
            names.truncate(n as usize);
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            Some(libc::ERANGE) if names.len() < 1 << 20 => names.resize(names.len() * 4, 0),
            _ => return Err(e),
        }
    }
    let mut out = Vec::new();
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        if name.starts_with(b"trusted.") {
            continue;
        }
        if let Some(v) = fgetxattr(fd, &cstring(name)?)? {
            out.push((name.to_vec(), v));
        }
    }
    Ok(out)
}

fn is_whiteout(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == 0
}

fn how(resolve: ResolveFlag) -> OpenHow {
    OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(resolve)
}

fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_XDEV
}

/// Where a node was found in the parent layers.
struct LowerNode {
    dir: OwnedFd,
    st: libc::stat,
}

/// Where a new node goes and how an error about it is named.
struct Target<'a> {
    entry: &'a str,
    parent: Rc<OwnedFd>,
    base: &'a [u8],
}

impl Target<'_> {
    fn err(&self, op: impl Into<String>) -> impl FnOnce(io::Error) -> UnpackError + '_ {
        let op = op.into();
        move |source| UnpackError::Entry {
            entry: self.entry.to_string(),
            op,
            source,
        }
    }
}

struct Applier {
    root: Rc<OwnedFd>,
    lowers: Vec<OwnedFd>,
    /// Open directories of this layer by relative path.
    cache: HashMap<Vec<u8>, Rc<OwnedFd>>,
    /// Directory times, set once all entries are written.
    dir_times: Vec<(Vec<u8>, Times)>,
    buf: Vec<u8>,
    entries: u64,
}

impl Applier {
    fn run(&mut self, reader: &mut ChunkReader) -> Result<(), UnpackError> {
        {
            let mut archive = tar::Archive::new(&mut *reader);
            for entry in archive.entries().map_err(UnpackError::Tar)? {
                let mut entry = entry.map_err(UnpackError::Tar)?;
                self.entries += 1;
                self.apply_entry(&mut entry)?;
            }
        }
        // Read whatever follows the end-of-archive marker, so the diffID covers it all.
        io::copy(reader, &mut io::sink()).map_err(UnpackError::Tar)?;
        self.finish_dirs()
    }

    fn apply_entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), UnpackError> {
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            tracing::debug!("PAX global extended header ignored");
            return Ok(());
        }
        let raw = entry.path_bytes().into_owned();
        let name = lossy(&raw);
        let rel = match clean_path(&raw) {
            Ok(Some(rel)) => rel,
            Ok(None) => {
                tracing::debug!(entry = %name, "entry resolves to the layer root; ignored");
                return Ok(());
            }
            Err(reason) => {
                return Err(UnpackError::Unsafe {
                    entry: name,
                    reason: reason.into(),
                });
            }
        };
        let meta = self.meta(entry, &name)?;
        let (parent_rel, base) = split(&rel);

        if base.starts_with(WHITEOUT_PREFIX) {
            return self.whiteout(&name, parent_rel, base, &meta);
        }

        let parent = self.dir_fd(parent_rel, &name)?;
        let t = Target {
            entry: &name,
            parent,
            base,
        };
        use tar::EntryType as E;
        match kind {
            E::Regular | E::Continuous | E::GNUSparse => self.regular(&t, entry, &meta),
            E::Directory => self.directory(&t, &rel, &meta),
            E::Symlink => {
                let target = entry.link_name_bytes().map(|c| c.into_owned());
                let target =
                    target
                        .filter(|t| !t.is_empty())
                        .ok_or_else(|| UnpackError::Unsafe {
                            entry: name.clone(),
                            reason: "symlink without a target".into(),
                        })?;
                self.symlink(&t, &target, &meta)
            }
            E::Link => {
                let raw_target = entry
                    .link_name_bytes()
                    .map(|c| c.into_owned())
                    .unwrap_or_default();
                let target = match clean_path(&raw_target) {
                    Ok(Some(t)) => t,
                    Ok(None) => {
                        return Err(UnpackError::Unsafe {
                            entry: name.clone(),
                            reason: "hard link to the layer root".into(),
                        });
                    }
                    Err(reason) => {
                        return Err(UnpackError::Unsafe {
                            entry: name.clone(),
                            reason: format!("hard link target {:?}: {reason}", lossy(&raw_target)),
                        });
                    }
                };
                self.hardlink(&t, &target, &meta)
            }
            E::Char | E::Block | E::Fifo => {
                let (major, minor) = if kind == E::Fifo {
                    (0, 0)
                } else {
                    let h = entry.header();
                    let major = h.device_major().map_err(UnpackError::Tar)?.unwrap_or(0);
                    let minor = h.device_minor().map_err(UnpackError::Tar)?.unwrap_or(0);
                    (major, minor)
                };
                let kind = match kind {
                    E::Char => SFlag::S_IFCHR,
                    E::Block => SFlag::S_IFBLK,
                    _ => SFlag::S_IFIFO,
                };
                self.special(
                    &t,
                    kind,
                    nix::sys::stat::makedev(major.into(), minor.into()),
                    &meta,
                )
            }
            other => Err(UnpackError::UnsupportedEntry {
                entry: name.clone(),
                kind: format!("{other:?}"),
            }),
        }
    }

    fn meta<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        name: &str,
    ) -> Result<Meta, UnpackError> {
        let h = entry.header();
        let bad = |what: &str, e: io::Error| UnpackError::Unsafe {
            entry: name.to_string(),
            reason: format!("bad {what} in header: {e}"),
        };
        let id = |v: u64, what: &str| {
            u32::try_from(v)
                .ok()
                .filter(|v| *v != u32::MAX)
                .ok_or_else(|| bad(what, io::Error::other(format!("{v} is out of range"))))
        };
        let uid = id(h.uid().map_err(|e| bad("uid", e))?, "uid")?;
        let gid = id(h.gid().map_err(|e| bad("gid", e))?, "gid")?;
        let mode = h.mode().map_err(|e| bad("mode", e))? & 0o7777;
        let mut mtime = (h.mtime().map_err(|e| bad("mtime", e))? as i64, 0i64);
        let mut atime = h
            .as_gnu()
            .and_then(|g| g.atime().ok())
            .map(|a| (a as i64, 0i64));
        let mut xattrs = Vec::new();
        if let Some(pax) = entry.pax_extensions().map_err(UnpackError::Tar)? {
            for ext in pax {
                let ext = ext.map_err(UnpackError::Tar)?;
                let key = ext.key_bytes();
                if let Some(x) = key.strip_prefix(b"SCHILY.xattr.") {
                    xattrs.push((x.to_vec(), ext.value_bytes().to_vec()));
                } else if key == b"mtime" {
                    if let Some(t) = parse_pax_time(ext.value_bytes()) {
                        mtime = t;
                    }
                } else if key == b"atime"
                    && let Some(t) = parse_pax_time(ext.value_bytes())
                {
                    atime = Some(t);
                }
            }
        }
        // containerd: atime = latest(atime, mtime).
        let atime = match atime {
            Some(a) if a > mtime => a,
            _ => mtime,
        };
        Ok(Meta {
            uid,
            gid,
            mode,
            times: Times {
                atime: ts(atime.0, atime.1),
                mtime: ts(mtime.0, mtime.1),
            },
            xattrs,
        })
    }

    // ---- directories of this layer -------------------------------------------------------

    fn cache_insert(&mut self, rel: &[u8], fd: Rc<OwnedFd>) {
        if self.cache.len() >= DIR_CACHE {
            self.cache.clear();
        }
        self.cache.insert(rel.to_vec(), fd);
    }

    /// An existing directory of this layer, or `None` if it does not exist.
    fn existing_dir(
        &mut self,
        rel: &[u8],
        entry: &str,
    ) -> Result<Option<Rc<OwnedFd>>, UnpackError> {
        if rel.is_empty() {
            return Ok(Some(self.root.clone()));
        }
        if let Some(fd) = self.cache.get(rel) {
            return Ok(Some(fd.clone()));
        }
        let fd = match openat2(&*self.root, rel, how(beneath())) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP | Errno::EXDEV) => {
                // A symlink this layer created: resolve it inside the layer, as containerd's
                // fs.RootPath does; it cannot leave the root.
                match openat2(
                    &*self.root,
                    rel,
                    how(ResolveFlag::RESOLVE_IN_ROOT
                        | ResolveFlag::RESOLVE_NO_MAGICLINKS
                        | ResolveFlag::RESOLVE_NO_XDEV),
                ) {
                    Ok(fd) => {
                        tracing::debug!(entry, dir = %lossy(rel), "parent resolved through a symlink inside the layer");
                        fd
                    }
                    Err(e) => {
                        return Err(UnpackError::Unsafe {
                            entry: entry.to_string(),
                            reason: format!(
                                "its parent {:?} goes through a symlink that does not resolve to a directory inside the layer ({})",
                                lossy(rel),
                                errno(e)
                            ),
                        });
                    }
                }
            }
            Err(e) => {
                return Err(UnpackError::Entry {
                    entry: entry.to_string(),
                    op: format!("open parent directory {:?}", lossy(rel)),
                    source: errno(e),
                });
            }
        };
        let fd = Rc::new(fd);
        self.cache_insert(rel, fd.clone());
        Ok(Some(fd))
    }

    /// The directory `rel` of this layer, created (with its parents) if missing.
    fn dir_fd(&mut self, rel: &[u8], entry: &str) -> Result<Rc<OwnedFd>, UnpackError> {
        if let Some(fd) = self.existing_dir(rel, entry)? {
            return Ok(fd);
        }
        // containerd's mkparent: create it like the parent layers have it.
        let (pp, base) = split(rel);
        let parent = self.dir_fd(pp, entry)?;
        let err = |op: &str| {
            let op = format!("{op} parent directory {:?}", lossy(rel));
            move |e: Errno| UnpackError::Entry {
                entry: entry.to_string(),
                op,
                source: errno(e),
            }
        };
        // Looked up before creating it, or the lookup would find this layer's new directory.
        let lower = self.lower_lookup(rel).map_err(|e| UnpackError::Entry {
            entry: entry.to_string(),
            op: format!("look up {:?} in the parent layers", lossy(rel)),
            source: e,
        })?;
        match nix::sys::stat::mkdirat(&*parent, base, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(err("create")(e)),
        }
        let fd = openat(
            &*parent,
            base,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(err("open"))?;
        match lower {
            Some(lower) if lower.st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                let src = openat(
                    &lower.dir,
                    split(rel).1,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(err("open parent layer's"))?;
                let st = &lower.st;
                nix::unistd::fchown(
                    &fd,
                    Some(Uid::from_raw(st.st_uid)),
                    Some(Gid::from_raw(st.st_gid)),
                )
                .map_err(err("chown"))?;
                nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(st.st_mode & 0o7777))
                    .map_err(err("chmod"))?;
                let xattrs = copyable_xattrs(&src).map_err(|e| {
                    err("read xattrs of")(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
                })?;
                for (k, v) in xattrs {
                    if let Err(e) = fsetxattr(&fd, &k, &v) {
                        tracing::debug!(entry, xattr = %lossy(&k), error = %e, "xattr of parent directory not copied");
                    }
                }
                self.dir_times.push((
                    rel.to_vec(),
                    Times {
                        atime: TimeSpec::new(st.st_atime, st.st_atime_nsec),
                        mtime: TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
                    },
                ));
            }
            _ => {
                // umask may have narrowed it.
                nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o755))
                    .map_err(err("chmod"))?;
                tracing::debug!(dir = %lossy(rel), "parent directory not in any layer: mode 0755");
            }
        }
        let fd = Rc::new(fd);
        self.cache_insert(rel, fd.clone());
        Ok(fd)
    }

    /// Looks `rel` up in the parent layers as overlayfs would see it below this layer:
    /// topmost first, stopping at whiteouts, non-directories and opaque directories on the
    /// way, and at this layer's own whiteouts and opaque markers.
    fn lower_lookup(&self, rel: &[u8]) -> io::Result<Option<LowerNode>> {
        let comps: Vec<&[u8]> = rel.split(|b| *b == b'/').collect();
        let layers = std::iter::once(&*self.root).chain(self.lowers.iter());
        for (layer_index, layer) in layers.enumerate() {
            let mut dir = layer.try_clone()?;
            let mut opaque = false;
            for (i, comp) in comps.iter().enumerate() {
                let st = match nix::sys::stat::fstatat(&dir, *comp, AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) => st,
                    Err(Errno::ENOENT) => break,
                    Err(e) => return Err(errno(e)),
                };
                if is_whiteout(&st) {
                    return Ok(None);
                }
                if i + 1 == comps.len() {
                    if layer_index == 0 {
                        // Present in this layer: not something to find below.
                        return Ok(None);
                    }
                    return Ok(Some(LowerNode { dir, st }));
                }
                if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    return Ok(None);
                }
                dir = openat(
                    &dir,
                    *comp,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(errno)?;
                if fgetxattr(&dir, OPAQUE_XATTR)?.as_deref() == Some(b"y") {
                    opaque = true;
                }
            }
            if opaque {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Removes whatever is at `t` (a file, a link, or a whole directory tree) so the entry
    /// can replace it, as containerd does.
    fn remove_existing(&mut self, t: &Target<'_>) -> Result<(), UnpackError> {
        self.cache.clear();
        remove_at(&t.parent, t.base).map_err(t.err("replace existing file"))
    }

    // ---- entries ----------------------------------------------------------------------

    fn whiteout(
        &mut self,
        name: &str,
        parent_rel: &[u8],
        base: &[u8],
        meta: &Meta,
    ) -> Result<(), UnpackError> {
        if base == WHITEOUT_OPAQUE {
            let dir = self.dir_fd(parent_rel, name)?;
            return fsetxattr(&*dir, OPAQUE_XATTR.to_bytes(), b"y").map_err(|source| {
                UnpackError::Entry {
                    entry: name.to_string(),
                    op: "mark directory opaque (trusted.overlay.opaque)".into(),
                    source,
                }
            });
        }
        if base.starts_with(WHITEOUT_META_PREFIX) {
            tracing::debug!(entry = name, "whiteout meta file ignored");
            return Ok(());
        }
        let hidden = &base[WHITEOUT_PREFIX.len()..];
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(UnpackError::Unsafe {
                entry: name.to_string(),
                reason: "invalid whiteout name".into(),
            });
        }
        let parent = self.dir_fd(parent_rel, name)?;
        let t = Target {
            entry: name,
            parent,
            base: hidden,
        };
        let mknod =
            || nix::sys::stat::mknodat(&*t.parent, hidden, SFlag::S_IFCHR, Mode::empty(), 0);
        match mknod() {
            Ok(()) => {}
            Err(Errno::EEXIST) => {
                self.remove_existing(&t)?;
                mknod().map_err(|e| t.err("create whiteout device")(errno(e)))?;
            }
            Err(e) => return Err(t.err("create whiteout device")(errno(e))),
        }
        nix::unistd::fchownat(
            &*t.parent,
            hidden,
            Some(Uid::from_raw(meta.uid)),
            Some(Gid::from_raw(meta.gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| t.err("chown whiteout")(errno(e)))
    }

    fn create_retry<T>(
        &mut self,
        t: &Target<'_>,
        op: &str,
        mut f: impl FnMut() -> Result<T, Errno>,
    ) -> Result<T, UnpackError> {
        match f() {
            Ok(v) => Ok(v),
            Err(Errno::EEXIST) => {
                self.remove_existing(t)?;
                f().map_err(|e| t.err(op)(errno(e)))
            }
            Err(e) => Err(t.err(op)(errno(e))),
        }
    }

    fn regular<R: Read>(
        &mut self,
        t: &Target<'_>,
        data: &mut tar::Entry<'_, R>,
        meta: &Meta,
    ) -> Result<(), UnpackError> {
        let fd = self.create_retry(t, "create file", || {
            openat(
                &*t.parent,
                t.base,
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )
        })?;
        let mut file = File::from(fd);
        loop {
            let n = match data.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(UnpackError::Tar(e)),
            };
            file.write_all(&self.buf[..n]).map_err(t.err("write"))?;
        }
        self.fd_meta(t, &file, meta)?;
        nix::sys::stat::futimens(&file, &meta.times.atime, &meta.times.mtime)
            .map_err(|e| t.err("set times")(errno(e)))
    }

    /// Owner, xattrs and mode (after chown, which clears setuid bits) through a descriptor.
    fn fd_meta(&self, t: &Target<'_>, fd: &impl AsFd, meta: &Meta) -> Result<(), UnpackError> {
        nix::unistd::fchown(
            fd,
            Some(Uid::from_raw(meta.uid)),
            Some(Gid::from_raw(meta.gid)),
        )
        .map_err(|e| t.err("chown")(errno(e)))?;
        for (k, v) in &meta.xattrs {
            if !xattr_allowed(t.entry, k) {
                continue;
            }
            if let Err(e) = fsetxattr(&fd.as_fd(), k, v) {
                xattr_error(t, k, e, true)?;
            }
        }
        nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(meta.mode))
            .map_err(|e| t.err("chmod")(errno(e)))
    }

    fn directory(&mut self, t: &Target<'_>, rel: &[u8], meta: &Meta) -> Result<(), UnpackError> {
        match nix::sys::stat::mkdirat(&*t.parent, t.base, Mode::from_bits_truncate(0o700)) {
            Ok(()) => {}
            Err(Errno::EEXIST) => {
                let st = nix::sys::stat::fstatat(&*t.parent, t.base, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(|e| t.err("stat")(errno(e)))?;
                if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    self.remove_existing(t)?;
                    nix::sys::stat::mkdirat(&*t.parent, t.base, Mode::from_bits_truncate(0o700))
                        .map_err(|e| t.err("create directory")(errno(e)))?;
                }
                // else: merge into the existing directory, applying this entry's metadata.
            }
            Err(e) => return Err(t.err("create directory")(errno(e))),
        }
        let fd = match self.cache.get(rel) {
            Some(fd) => fd.clone(),
            None => {
                let fd = openat(
                    &*t.parent,
                    t.base,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| t.err("open directory")(errno(e)))?;
                let fd = Rc::new(fd);
                self.cache_insert(rel, fd.clone());
                fd
            }
        };
        self.fd_meta(t, &*fd, meta)?;
        self.dir_times.push((rel.to_vec(), meta.times));
        Ok(())
    }

    fn symlink(&mut self, t: &Target<'_>, target: &[u8], meta: &Meta) -> Result<(), UnpackError> {
        self.create_retry(t, "create symlink", || {
            nix::unistd::symlinkat(target, &*t.parent, t.base)
        })?;
        self.path_meta(t, meta, false)
    }

    fn special(
        &mut self,
        t: &Target<'_>,
        kind: SFlag,
        dev: libc::dev_t,
        meta: &Meta,
    ) -> Result<(), UnpackError> {
        let mode = Mode::from_bits_truncate(meta.mode);
        self.create_retry(t, "create device node", || {
            nix::sys::stat::mknodat(&*t.parent, t.base, kind, mode, dev)
        })?;
        self.path_meta(t, meta, true)
    }

    /// Owner, xattrs, mode and times for nodes that cannot be opened (symlinks, devices).
    fn path_meta(&self, t: &Target<'_>, meta: &Meta, chmod: bool) -> Result<(), UnpackError> {
        nix::unistd::fchownat(
            &*t.parent,
            t.base,
            Some(Uid::from_raw(meta.uid)),
            Some(Gid::from_raw(meta.gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| t.err("chown")(errno(e)))?;
        for (k, v) in &meta.xattrs {
            if !xattr_allowed(t.entry, k) {
                continue;
            }
            if let Err(e) = lsetxattr_at(&*t.parent, t.base, k, v) {
                xattr_error(t, k, e, false)?;
            }
        }
        if chmod {
            nix::sys::stat::fchmodat(
                &*t.parent,
                t.base,
                Mode::from_bits_truncate(meta.mode),
                FchmodatFlags::FollowSymlink,
            )
            .map_err(|e| t.err("chmod")(errno(e)))?;
        }
        nix::sys::stat::utimensat(
            &*t.parent,
            t.base,
            &meta.times.atime,
            &meta.times.mtime,
            UtimensatFlags::NoFollowSymlink,
        )
        .map_err(|e| t.err("set times")(errno(e)))
    }

    fn hardlink(&mut self, t: &Target<'_>, target: &[u8], meta: &Meta) -> Result<(), UnpackError> {
        let (tparent_rel, tbase) = split(target);
        let link = |tparent: &OwnedFd| {
            nix::unistd::linkat(tparent, tbase, &*t.parent, t.base, AtFlags::empty())
        };
        let mut linked = false;
        if let Some(tparent) = self.existing_dir(tparent_rel, t.entry)? {
            match link(&tparent) {
                Ok(()) => linked = true,
                Err(Errno::EEXIST) => {
                    self.remove_existing(t)?;
                    match link(&tparent) {
                        Ok(()) => linked = true,
                        Err(Errno::ENOENT) => {}
                        Err(e) => {
                            return Err(t.err(format!("hard link to {:?}", lossy(target)))(errno(
                                e,
                            )));
                        }
                    }
                }
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(t.err(format!("hard link to {:?}", lossy(target)))(errno(e))),
            }
        }
        if !linked {
            // Not in this layer: copy it up from the parent layers, then link to the copy.
            let lower = self
                .lower_lookup(target)
                .map_err(t.err(format!(
                    "look up hard link target {:?} in the parent layers",
                    lossy(target)
                )))?
                .ok_or_else(|| UnpackError::Entry {
                    entry: t.entry.to_string(),
                    op: format!("hard link to {:?}", lossy(target)),
                    source: io::Error::new(
                        io::ErrorKind::NotFound,
                        "the target is neither in this layer nor in its parent layers",
                    ),
                })?;
            let tparent = self.dir_fd(tparent_rel, t.entry)?;
            let tt = Target {
                entry: t.entry,
                parent: tparent.clone(),
                base: tbase,
            };
            self.copy_up(&tt, &lower, tbase)?;
            link(&tparent)
                .map_err(|e| t.err(format!("hard link to {:?}", lossy(target)))(errno(e)))?;
        }
        // containerd applies the link header's metadata to the (shared) inode too.
        let st = nix::sys::stat::fstatat(&*t.parent, t.base, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| t.err("stat")(errno(e)))?;
        let is_symlink = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
        self.path_meta(t, meta, !is_symlink)
    }

    /// Copies the node `lower` (named `base` in `lower.dir`) into this layer at `t`.
    fn copy_up(
        &mut self,
        t: &Target<'_>,
        lower: &LowerNode,
        base: &[u8],
    ) -> Result<(), UnpackError> {
        let st = &lower.st;
        let uid = Some(Uid::from_raw(st.st_uid));
        let gid = Some(Gid::from_raw(st.st_gid));
        let mode = Mode::from_bits_truncate(st.st_mode & 0o7777);
        let times = Times {
            atime: TimeSpec::new(st.st_atime, st.st_atime_nsec),
            mtime: TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
        };
        let e = |op: &'static str| {
            move |e: Errno| t.err(format!("copy up from parent layer: {op}"))(errno(e))
        };
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {
                let src = openat(
                    &lower.dir,
                    base,
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(e("open"))?;
                let mut src = File::from(src);
                let dst = openat(
                    &*t.parent,
                    t.base,
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )
                .map_err(e("create"))?;
                let mut dst = File::from(dst);
                io::copy(&mut src, &mut dst).map_err(t.err("copy up from parent layer: copy"))?;
                nix::unistd::fchown(&dst, uid, gid).map_err(e("chown"))?;
                for (k, v) in copyable_xattrs(&src).map_err(t.err("copy up: read xattrs"))? {
                    if let Err(err) = fsetxattr(&dst, &k, &v) {
                        tracing::debug!(entry = t.entry, xattr = %lossy(&k), error = %err, "xattr not copied up");
                    }
                }
                nix::sys::stat::fchmod(&dst, mode).map_err(e("chmod"))?;
                nix::sys::stat::futimens(&dst, &times.atime, &times.mtime)
                    .map_err(e("set times"))?;
                Ok(())
            }
            libc::S_IFLNK => {
                let target = nix::fcntl::readlinkat(&lower.dir, base).map_err(e("readlink"))?;
                nix::unistd::symlinkat(target.as_bytes(), &*t.parent, t.base)
                    .map_err(e("symlink"))?;
                nix::unistd::fchownat(&*t.parent, t.base, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(e("chown"))?;
                nix::sys::stat::utimensat(
                    &*t.parent,
                    t.base,
                    &times.atime,
                    &times.mtime,
                    UtimensatFlags::NoFollowSymlink,
                )
                .map_err(e("set times"))
            }
            libc::S_IFCHR | libc::S_IFBLK | libc::S_IFIFO => {
                let kind = SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT);
                nix::sys::stat::mknodat(&*t.parent, t.base, kind, mode, st.st_rdev)
                    .map_err(e("mknod"))?;
                nix::unistd::fchownat(&*t.parent, t.base, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(e("chown"))?;
                nix::sys::stat::fchmodat(&*t.parent, t.base, mode, FchmodatFlags::FollowSymlink)
                    .map_err(e("chmod"))?;
                nix::sys::stat::utimensat(
                    &*t.parent,
                    t.base,
                    &times.atime,
                    &times.mtime,
                    UtimensatFlags::NoFollowSymlink,
                )
                .map_err(e("set times"))
            }
            _ => Err(t.err("hard link")(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the target in the parent layer is a directory or socket",
            ))),
        }
    }

    /// Sets directory times last, so creating their contents does not change them.
    fn finish_dirs(&mut self) -> Result<(), UnpackError> {
        let dir_times = std::mem::take(&mut self.dir_times);
        for (rel, times) in dir_times {
            let fd = match self.cache.get(&rel) {
                Some(fd) => fd.clone(),
                None => match openat2(&*self.root, rel.as_slice(), how(beneath())) {
                    Ok(fd) => Rc::new(fd),
                    // Replaced or removed by a later entry.
                    Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR | Errno::EXDEV) => continue,
                    Err(e) => {
                        return Err(UnpackError::Entry {
                            entry: lossy(&rel),
                            op: "open directory to set times".into(),
                            source: errno(e),
                        });
                    }
                },
            };
            nix::sys::stat::futimens(&*fd, &times.atime, &times.mtime).map_err(|e| {
                UnpackError::Entry {
                    entry: lossy(&rel),
                    op: "set directory times".into(),
                    source: errno(e),
                }
            })?;
        }
        Ok(())
    }
}

/// `trusted.overlay.*` from an archive would steer overlayfs itself (opaque, redirect,
/// metacopy); like containerd, never take it from a layer.
fn xattr_allowed(entry: &str, key: &[u8]) -> bool {
    if key.starts_with(b"trusted.overlay.") {
        tracing::warn!(entry, xattr = %lossy(key), "overlayfs xattr in layer ignored");
        return false;
    }
    true
}

/// containerd's rules for xattrs the filesystem refuses: unsupported → skipped with a
/// warning; `security.*` refused → skipped (debug); `user.*` on anything but files and
/// directories cannot exist → skipped; anything else fails the entry.
fn xattr_error(
    t: &Target<'_>,
    key: &[u8],
    e: io::Error,
    regular_or_dir: bool,
) -> Result<(), UnpackError> {
    let code = e.raw_os_error();
    if matches!(code, Some(libc::ENOTSUP)) {
        tracing::warn!(entry = t.entry, xattr = %lossy(key), error = %e, "xattr not supported by the filesystem; ignored");
        return Ok(());
    }
    if key.starts_with(b"security.") {
        tracing::debug!(entry = t.entry, xattr = %lossy(key), error = %e, "security xattr refused; ignored");
        return Ok(());
    }
    if key.starts_with(b"user.") && matches!(code, Some(libc::EPERM)) && !regular_or_dir {
        tracing::debug!(entry = t.entry, xattr = %lossy(key), "user xattr on a special file; ignored");
        return Ok(());
    }
    Err(t.err(format!("set xattr {}", lossy(key)))(e))
}

/// Removes `name` in `dir`: unlink, or a recursive delete for a directory; never follows
/// symlinks.
fn remove_at(dir: &OwnedFd, name: &[u8]) -> io::Result<()> {
    match nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => return Ok(()),
        Err(Errno::EISDIR) => {}
        Err(e) => return Err(errno(e)),
    }
    let sub = openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno)?;
    // Listing through /proc/self/fd reads the directory we hold open, not a path.
    let listing = std::fs::read_dir(format!("/proc/self/fd/{}", sub.as_raw_fd()))?;
    let mut names: Vec<Vec<u8>> = Vec::new();
    for e in listing {
        names.push(e?.file_name().as_bytes().to_vec());
    }
    for n in names {
        remove_at(&sub, &n)?;
    }
    nix::unistd::unlinkat(dir, name, UnlinkatFlags::RemoveDir).map_err(errno)
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Building layer tarballs for tests.

    pub struct Layer {
        b: tar::Builder<Vec<u8>>,
    }

    impl Default for Layer {
        fn default() -> Self {
            Self::new()
        }
    }

    fn header(kind: tar::EntryType, mode: u32, uid: u64, gid: u64, mtime: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_mtime(mtime);
        h.set_size(0);
        h
    }

    impl Layer {
        pub fn new() -> Self {
            Self {
                b: tar::Builder::new(Vec::new()),
            }
        }
        pub fn dir(mut self, path: &str) -> Self {
            let mut h = header(tar::EntryType::Directory, 0o755, 0, 0, 1_600_000_000);
            self.b.append_data(&mut h, path, &[][..]).unwrap();
            self
        }
        pub fn dir_full(mut self, path: &str, mode: u32, uid: u64, gid: u64, mtime: u64) -> Self {
            let mut h = header(tar::EntryType::Directory, mode, uid, gid, mtime);
            self.b.append_data(&mut h, path, &[][..]).unwrap();
            self
        }
        pub fn file(self, path: &str, data: &[u8]) -> Self {
            self.file_full(path, data, 0o644, 0, 0, 1_600_000_000)
        }
        pub fn file_full(
            mut self,
            path: &str,
            data: &[u8],
            mode: u32,
            uid: u64,
            gid: u64,
            mtime: u64,
        ) -> Self {
            let mut h = header(tar::EntryType::Regular, mode, uid, gid, mtime);
            h.set_size(data.len() as u64);
            self.b.append_data(&mut h, path, data).unwrap();
            self
        }
        pub fn symlink(mut self, path: &str, target: &str) -> Self {
            let mut h = header(tar::EntryType::Symlink, 0o777, 0, 0, 1_600_000_000);
            self.b.append_link(&mut h, path, target).unwrap();
            self
        }
        pub fn hardlink(mut self, path: &str, target: &str) -> Self {
            let mut h = header(tar::EntryType::Link, 0o644, 0, 0, 1_600_000_000);
            self.b.append_link(&mut h, path, target).unwrap();
            self
        }
        pub fn device(
            mut self,
            path: &str,
            kind: tar::EntryType,
            major: u32,
            minor: u32,
            mode: u32,
        ) -> Self {
            let mut h = header(kind, mode, 0, 0, 1_600_000_000);
            h.set_device_major(major).unwrap();
            h.set_device_minor(minor).unwrap();
            self.b.append_data(&mut h, path, &[][..]).unwrap();
            self
        }
        pub fn whiteout(self, path: &str) -> Self {
            let (dir, base) = path
                .rsplit_once('/')
                .map(|(d, b)| (format!("{d}/"), b))
                .unwrap_or((String::new(), path));
            self.file(&format!("{dir}.wh.{base}"), b"")
        }
        pub fn opaque(self, dir: &str) -> Self {
            self.file(&format!("{dir}/.wh..wh..opq"), b"")
        }
        pub fn pax(mut self, records: &[(&str, &[u8])]) -> Self {
            self.b
                .append_pax_extensions(records.iter().copied())
                .unwrap();
            self
        }
        /// An entry whose name is written raw into the header (no validation).
        pub fn raw(mut self, name: &[u8], kind: tar::EntryType, link: &[u8], data: &[u8]) -> Self {
            let mut h = header(kind, 0o644, 0, 0, 1_600_000_000);
            h.set_size(data.len() as u64);
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name);
            gnu.linkname[..link.len()].copy_from_slice(link);
            h.set_cksum();
            self.b.append(&h, data).unwrap();
            self
        }
        pub fn build(self) -> Vec<u8> {
            self.b.into_inner().unwrap()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::Layer;
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    fn apply(tar: &[u8], dest: &Path, parents: &[PathBuf]) -> Result<LayerStats, UnpackError> {
        apply_layer(tar, Compression::None, dest, parents)
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn xattr_of(p: &Path, k: &str) -> Option<Vec<u8>> {
        xattr::get_deref(p, k).ok().flatten()
    }

    #[test]
    fn media_types() {
        use Compression::*;
        for (mt, c) in [
            ("application/vnd.oci.image.layer.v1.tar", None),
            ("application/vnd.oci.image.layer.v1.tar+gzip", Gzip),
            ("application/vnd.oci.image.layer.v1.tar+zstd", Zstd),
            (
                "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
                Gzip,
            ),
            ("application/vnd.docker.image.rootfs.diff.tar.gzip", Gzip),
            (
                "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
                Gzip,
            ),
            ("application/vnd.docker.image.rootfs.diff.tar.zstd", Zstd),
            ("application/vnd.docker.image.rootfs.diff.tar", None),
        ] {
            assert_eq!(Compression::from_media_type(mt), Some(c), "{mt}");
        }
        for mt in [
            "application/vnd.oci.image.layer.v1.tar+gzip+encrypted",
            "application/vnd.oci.image.config.v1+json",
            "text/plain",
        ] {
            assert_eq!(Compression::from_media_type(mt), Option::None, "{mt}");
        }
    }

    #[test]
    fn clean_paths() {
        assert_eq!(clean_path(b"./a/b/").unwrap().unwrap(), b"a/b");
        assert_eq!(clean_path(b"/etc//passwd").unwrap().unwrap(), b"etc/passwd");
        assert_eq!(clean_path(b"a/../b").unwrap().unwrap(), b"b");
        assert_eq!(clean_path(b"./").unwrap(), None);
        assert!(clean_path(b"../x").is_err());
        assert!(clean_path(b"a/../../x").is_err());
        assert_eq!(parse_pax_time(b"1234.5"), Some((1234, 500_000_000)));
        assert_eq!(parse_pax_time(b"-1.25"), Some((-2, 750_000_000)));
        assert_eq!(parse_pax_time(b"7"), Some((7, 0)));
    }

    fn sample_layer() -> Vec<u8> {
        Layer::new()
            .dir_full("etc", 0o755, 0, 0, 1_500_000_000)
            .file_full("etc/passwd", b"root:x:0:0\n", 0o644, 0, 0, 1_500_000_001)
            .dir_full("home/user/", 0o750, 1000, 1000, 1_500_000_002)
            .file_full("home/user/notes", b"hello", 0o600, 1000, 100, 1_500_000_003)
            .file_full("bin/su", b"\x7fELF", 0o4755, 0, 0, 1_500_000_004)
            .dir_full("tmp", 0o1777, 0, 0, 1_500_000_005)
            .symlink("bin/sh", "/bin/busybox")
            .symlink("lib64", "lib")
            .file("bin/busybox", b"busybox binary")
            .hardlink("bin/ls", "bin/busybox")
            .raw(b"/bin/cat", tar::EntryType::Link, b"/bin/busybox", b"")
            .device("dev/null", tar::EntryType::Char, 1, 3, 0o666)
            .device("dev/loop0", tar::EntryType::Block, 7, 0, 0o660)
            .device("run/fifo", tar::EntryType::Fifo, 0, 0, 0o600)
            .pax(&[
                ("SCHILY.xattr.user.comment", b"layered"),
                ("SCHILY.xattr.trusted.overlay.redirect", b"/etc"),
                ("SCHILY.xattr.security.capability", b"\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
                ("mtime", b"1500000010.25"),
            ])
            .file("bin/ping", b"ping")
            .whiteout("etc/shadow")
            .opaque("var/cache")
            .file("var/cache/.wh..wh.plnk", b"")
            .build()
    }

    #[test]
    fn applies_a_layer() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let tar = sample_layer();
        let stats = apply(&tar, d, &[]).unwrap();
        assert_eq!(stats.diff_id, Digest::of(&tar));
        assert_eq!(stats.size, tar.len() as u64);

        assert_eq!(
            std::fs::read(d.join("etc/passwd")).unwrap(),
            b"root:x:0:0\n"
        );
        let m = std::fs::metadata(d.join("home/user/notes")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1000, 100, 0o600));
        assert_eq!(m.mtime(), 1_500_000_003);
        let m = std::fs::metadata(d.join("home/user")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1000, 1000, 0o750));
        assert_eq!(m.mtime(), 1_500_000_002, "dir mtime set after its contents");
        // A parent missing from the tar and from any parent layer: 0755.
        let m = std::fs::metadata(d.join("home")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o755);
        assert_eq!(
            std::fs::metadata(d.join("etc")).unwrap().mtime(),
            1_500_000_000
        );
        assert_eq!(
            std::fs::metadata(d.join("bin/su")).unwrap().mode() & 0o7777,
            0o4755
        );
        assert_eq!(
            std::fs::metadata(d.join("tmp")).unwrap().mode() & 0o7777,
            0o1777
        );

        assert_eq!(
            std::fs::read_link(d.join("bin/sh")).unwrap(),
            Path::new("/bin/busybox")
        );
        assert_eq!(
            std::fs::read_link(d.join("lib64")).unwrap(),
            Path::new("lib")
        );

        let bb = std::fs::metadata(d.join("bin/busybox")).unwrap();
        let ls = std::fs::metadata(d.join("bin/ls")).unwrap();
        let cat = std::fs::metadata(d.join("bin/cat")).unwrap();
        assert_eq!(bb.ino(), ls.ino());
        assert_eq!(bb.ino(), cat.ino());
        assert_eq!(bb.nlink(), 3);

        let null = std::fs::symlink_metadata(d.join("dev/null")).unwrap();
        assert!(null.file_type().is_char_device());
        assert_eq!(null.rdev(), nix::sys::stat::makedev(1, 3));
        assert_eq!(null.mode() & 0o7777, 0o666);
        let lp = std::fs::symlink_metadata(d.join("dev/loop0")).unwrap();
        assert!(lp.file_type().is_block_device());
        assert_eq!(lp.rdev(), nix::sys::stat::makedev(7, 0));
        assert!(
            std::fs::symlink_metadata(d.join("run/fifo"))
                .unwrap()
                .file_type()
                .is_fifo()
        );

        let ping = d.join("bin/ping");
        assert_eq!(
            xattr_of(&ping, "user.comment").as_deref(),
            Some(&b"layered"[..])
        );
        assert_eq!(xattr_of(&ping, "trusted.overlay.redirect"), None);
        assert!(xattr_of(&ping, "security.capability").is_some());
        let m = std::fs::metadata(&ping).unwrap();
        assert_eq!((m.mtime(), m.mtime_nsec()), (1_500_000_010, 250_000_000));

        let wh = std::fs::symlink_metadata(d.join("etc/shadow")).unwrap();
        assert!(wh.file_type().is_char_device());
        assert_eq!(wh.rdev(), 0);
        assert!(!d.join("etc/.wh.shadow").exists());
        assert_eq!(
            xattr_of(&d.join("var/cache"), "trusted.overlay.opaque").as_deref(),
            Some(&b"y"[..])
        );
        assert_eq!(std::fs::read_dir(d.join("var/cache")).unwrap().count(), 0);
    }

    #[test]
    fn gzip_zstd_and_trailing_data() {
        let mut tar = sample_layer();
        // Some writers pad the stream after the end-of-archive blocks; it is part of the diffID.
        tar.extend_from_slice(&[0u8; 10240]);
        let want = Digest::of(&tar);
        let gz = gzip(&tar);
        let zst = zstd::encode_all(&tar[..], 3).unwrap();
        for (blob, c) in [
            (gz.clone(), Compression::Gzip),
            (zst, Compression::Zstd),
            (tar.clone(), Compression::None),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let stats = apply_layer(&blob[..], c, dir.path(), &[]).unwrap();
            assert_eq!(stats.diff_id, want, "{c}");
            assert_eq!(stats.size, tar.len() as u64);
            assert_eq!(
                std::fs::read(dir.path().join("etc/passwd")).unwrap(),
                b"root:x:0:0\n"
            );
        }
        // Mislabelled: the magic bytes decide, as in containerd.
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            apply_layer(&gz[..], Compression::None, dir.path(), &[])
                .unwrap()
                .diff_id,
            want
        );
        // A corrupt gzip stream is an error naming the compression.
        let mut bad = gz.clone();
        let n = bad.len();
        bad[n / 2] ^= 0xff;
        bad[n / 2 + 1] ^= 0xff;
        let dir = tempfile::tempdir().unwrap();
        let e = apply_layer(&bad[..], Compression::Gzip, dir.path(), &[]).unwrap_err();
        assert!(
            matches!(e, UnpackError::Decompress { .. } | UnpackError::Tar(_)),
            "{e}"
        );
        let e = apply_layer(&gz[..gz.len() / 2], Compression::Gzip, dir.path(), &[]).unwrap_err();
        assert!(
            matches!(
                e,
                UnpackError::Decompress {
                    compression: Compression::Gzip,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn big_files_survive_the_pipeline() {
        let big: Vec<u8> = (0..5_000_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let mut l = Layer::new().file("big", &big);
        for i in 0..300 {
            l = l.file(&format!("d{}/f{i}", i % 7), format!("{i}").as_bytes());
        }
        let tar = l.build();
        let dir = tempfile::tempdir().unwrap();
        let stats = apply_layer(&gzip(&tar)[..], Compression::Gzip, dir.path(), &[]).unwrap();
        assert_eq!(stats.diff_id, Digest::of(&tar));
        assert_eq!(stats.entries, 301);
        assert_eq!(std::fs::read(dir.path().join("big")).unwrap(), big);
        assert_eq!(std::fs::read(dir.path().join("d5/f299")).unwrap(), b"299");
    }

    #[test]
    fn replaces_entries_within_a_layer() {
        let tar = Layer::new()
            .file("a", b"first")
            .file("a", b"second")
            .dir("d")
            .file("d/x", b"x")
            .file("d", b"now a file")
            .symlink("s", "/etc/passwd")
            .file("s", b"not through the link")
            .build();
        let dir = tempfile::tempdir().unwrap();
        apply(&tar, dir.path(), &[]).unwrap();
        assert_eq!(std::fs::read(dir.path().join("a")).unwrap(), b"second");
        assert_eq!(std::fs::read(dir.path().join("d")).unwrap(), b"now a file");
        assert!(
            std::fs::symlink_metadata(dir.path().join("s"))
                .unwrap()
                .is_file()
        );
        assert_ne!(
            std::fs::read(dir.path().join("s")).unwrap(),
            std::fs::read("/etc/passwd").unwrap_or_default()
        );
    }

    #[test]
    fn rejects_escapes() {
        let outside = tempfile::tempdir().unwrap();
        let o = outside.path().to_str().unwrap();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "dotdot",
                Layer::new()
                    .raw(b"../escaped", tar::EntryType::Regular, b"", b"x")
                    .build(),
            ),
            (
                "nested dotdot",
                Layer::new()
                    .raw(b"a/../../escaped", tar::EntryType::Regular, b"", b"x")
                    .build(),
            ),
            (
                "symlink parent",
                Layer::new()
                    .symlink("evil", o)
                    .file("evil/pwned", b"x")
                    .build(),
            ),
            (
                "relative symlink parent",
                Layer::new()
                    .symlink("evil", "../../../../../../../..")
                    .file("evil/pwned", b"x")
                    .build(),
            ),
            (
                "hardlink dotdot",
                Layer::new()
                    .raw(b"h", tar::EntryType::Link, b"../../etc/passwd", b"")
                    .build(),
            ),
            (
                "whiteout dotdot",
                Layer::new()
                    .raw(b"a/.wh..", tar::EntryType::Regular, b"", b"")
                    .build(),
            ),
        ];
        for (what, tar) in cases {
            let dir = tempfile::tempdir().unwrap();
            let dest = dir.path().join("dest");
            std::fs::create_dir(&dest).unwrap();
            let r = apply(&tar, &dest, &[]);
            assert!(
                !outside.path().join("pwned").exists(),
                "{what}: wrote outside"
            );
            assert!(
                !dir.path().join("escaped").exists(),
                "{what}: wrote outside"
            );
            match r {
                Err(e @ UnpackError::Unsafe { .. }) => {
                    let msg = e.to_string();
                    assert!(msg.contains("layer entry"), "{what}: {msg}");
                    assert!(!what.starts_with("relative"), "{what}: {msg}");
                }
                Err(e) => panic!("{what}: unexpected error {e}"),
                Ok(_) => {
                    // Contained: `evil -> ../../..` resolves to the layer root, as in
                    // containerd, so the file lands inside dest.
                    assert_eq!(what, "relative symlink parent", "accepted");
                    assert_eq!(std::fs::read(dest.join("pwned")).unwrap(), b"x");
                }
            }
        }
        // Absolute hard-link targets and absolute names are taken relative to the root.
        let dir = tempfile::tempdir().unwrap();
        let tar = Layer::new()
            .raw(b"/abs", tar::EntryType::Regular, b"", b"x")
            .raw(b"h", tar::EntryType::Link, b"/abs", b"")
            .build();
        apply(&tar, dir.path(), &[]).unwrap();
        assert_eq!(std::fs::read(dir.path().join("h")).unwrap(), b"x");
        // A symlinked parent pointing inside the layer is followed inside it (containerd).
        let dir = tempfile::tempdir().unwrap();
        let tar = Layer::new()
            .dir("real")
            .symlink("alias", "/real")
            .file("alias/f", b"in")
            .build();
        apply(&tar, dir.path(), &[]).unwrap();
        assert_eq!(std::fs::read(dir.path().join("real/f")).unwrap(), b"in");
        let meta = std::fs::symlink_metadata(dir.path().join("alias")).unwrap();
        assert!(meta.file_type().is_symlink());
    }

    #[test]
    fn parents_give_metadata_and_hardlink_targets() {
        let base = tempfile::tempdir().unwrap();
        let l1 = base.path().join("l1");
        let l2 = base.path().join("l2");
        let l3 = base.path().join("l3");
        for d in [&l1, &l2, &l3] {
            std::fs::create_dir(d).unwrap();
        }
        apply(
            &Layer::new()
                .dir_full("opt", 0o711, 5, 6, 1_400_000_000)
                .file_full("opt/tool", b"tool v1", 0o755, 7, 8, 1_400_000_001)
                .file("opt/gone", b"gone")
                .dir("hidden")
                .file("hidden/f", b"f")
                .build(),
            &l1,
            &[],
        )
        .unwrap();
        apply(
            &Layer::new().whiteout("opt/gone").opaque("hidden").build(),
            &l2,
            std::slice::from_ref(&l1),
        )
        .unwrap();
        // No entry for opt/: it is created like the parent layer has it.
        apply(
            &Layer::new()
                .file("opt/new", b"new")
                .hardlink("opt/tool2", "opt/tool")
                .build(),
            &l3,
            &[l2.clone(), l1.clone()],
        )
        .unwrap();
        let m = std::fs::metadata(l3.join("opt")).unwrap();
        assert_eq!(
            (m.mode() & 0o7777, m.uid(), m.gid(), m.mtime()),
            (0o711, 5, 6, 1_400_000_000)
        );
        let t = std::fs::metadata(l3.join("opt/tool")).unwrap();
        let t2 = std::fs::metadata(l3.join("opt/tool2")).unwrap();
        assert_eq!(t.ino(), t2.ino(), "copied up and linked");
        assert_eq!(std::fs::read(l3.join("opt/tool2")).unwrap(), b"tool v1");
        // Whiteouts and opaque directories in between hide the target.
        for (tar, what) in [
            (Layer::new().hardlink("x", "opt/gone").build(), "whiteout"),
            (Layer::new().hardlink("x", "hidden/f").build(), "opaque"),
            (Layer::new().hardlink("x", "nowhere").build(), "missing"),
        ] {
            let d = base.path().join(what);
            std::fs::create_dir(&d).unwrap();
            let e = apply(&tar, &d, &[l2.clone(), l1.clone()]).unwrap_err();
            assert!(e.to_string().contains("layer entry \"x\""), "{what}: {e}");
        }
    }
}
