//! Layer tarballs: [`Entry`] values collected by a [`LayerBuilder`] and written as a
//! deterministic tar, then compressed into a [`Layer`] blob.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use anyhow::{Context, Result};
use bytes::Bytes;

use super::{MTIME, ManifestFormat, media_types, sha256_digest};

/// How a layer blob is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// Plain tar (`...layer.v1.tar`).
    None,
    /// gzip, default level, no timestamp or file name in the header (`...tar+gzip`).
    #[default]
    Gzip,
    /// zstd level 3 (`...tar+zstd`).
    Zstd,
}

/// Where a regular file's bytes come from.
#[derive(Clone, Debug)]
pub enum Content {
    /// Bytes given by the test.
    Bytes(Bytes),
    /// A host file, read when the layer is built. Its permission bits are the default mode.
    Host(PathBuf),
}

/// What a tar entry is.
#[derive(Clone, Debug)]
pub enum EntryKind {
    /// A regular file.
    File(Content),
    /// A directory (written with a trailing `/`).
    Dir,
    /// A symbolic link to `target` (written verbatim, may be absolute or contain `..`).
    Symlink(String),
    /// A hard link to the earlier entry `target` (a path inside the layer).
    Hardlink(String),
    /// A character device.
    CharDevice { major: u32, minor: u32 },
    /// A block device.
    BlockDevice { major: u32, minor: u32 },
    /// A named pipe.
    Fifo,
}

/// One tar entry: path, kind, mode, owner, xattrs.
///
/// Paths are written verbatim (a leading `/` or `..` is kept, which is how
/// [`malicious`](super::malicious) layers are made); use relative paths such as `bin/sh`.
/// Defaults: mode 0644 for files and devices, 0755 for dirs, 0777 for links, the host mode
/// for [`Entry::host_file`]; owner 0:0; mtime [`MTIME`].
#[derive(Clone, Debug)]
pub struct Entry {
    pub path: String,
    pub kind: EntryKind,
    pub mode: Option<u32>,
    pub uid: u64,
    pub gid: u64,
    pub xattrs: BTreeMap<String, Vec<u8>>,
    pub mtime: u64,
}

impl Entry {
    fn new(path: impl Into<String>, kind: EntryKind) -> Entry {
        Entry {
            path: path.into(),
            kind,
            mode: None,
            uid: 0,
            gid: 0,
            xattrs: BTreeMap::new(),
            mtime: MTIME,
        }
    }

    /// A regular file holding `data`.
    pub fn file(path: impl Into<String>, data: impl Into<Bytes>) -> Entry {
        Entry::new(path, EntryKind::File(Content::Bytes(data.into())))
    }

    /// A regular file with the contents (and, unless overridden, the permission bits) of the
    /// host file `host`, read at build time.
    pub fn host_file(path: impl Into<String>, host: impl Into<PathBuf>) -> Entry {
        Entry::new(path, EntryKind::File(Content::Host(host.into())))
    }

    /// A directory.
    pub fn dir(path: impl Into<String>) -> Entry {
        Entry::new(path, EntryKind::Dir)
    }

    /// A symbolic link `path -> target`.
    pub fn symlink(path: impl Into<String>, target: impl Into<String>) -> Entry {
        Entry::new(path, EntryKind::Symlink(target.into()))
    }

    /// A hard link `path` to the entry `target` of the same layer.
    pub fn hardlink(path: impl Into<String>, target: impl Into<String>) -> Entry {
        Entry::new(path, EntryKind::Hardlink(target.into()))
    }

    /// A character device.
    pub fn char_device(path: impl Into<String>, major: u32, minor: u32) -> Entry {
        Entry::new(path, EntryKind::CharDevice { major, minor })
    }

    /// A block device.
    pub fn block_device(path: impl Into<String>, major: u32, minor: u32) -> Entry {
        Entry::new(path, EntryKind::BlockDevice { major, minor })
    }

    /// A named pipe.
    pub fn fifo(path: impl Into<String>) -> Entry {
        Entry::new(path, EntryKind::Fifo)
    }

    /// An OCI whiteout deleting `path` from lower layers: an empty file `dir/.wh.name`.
    pub fn whiteout(path: &str) -> Entry {
        let path = path.trim_end_matches('/');
        let (dir, name) = match path.rfind('/') {
            Some(i) => (&path[..=i], &path[i + 1..]),
            None => ("", path),
        };
        Entry::file(format!("{dir}.wh.{name}"), Bytes::new())
    }

    /// An OCI opaque-directory marker: an empty file `dir/.wh..wh..opq`, hiding everything
    /// lower layers put in `dir`.
    pub fn opaque(dir: &str) -> Entry {
        Entry::file(
            format!("{}/.wh..wh..opq", dir.trim_end_matches('/')),
            Bytes::new(),
        )
    }

    /// Sets the permission bits (including setuid/setgid/sticky, e.g. `0o1777`).
    pub fn mode(mut self, mode: u32) -> Entry {
        self.mode = Some(mode);
        self
    }

    /// Sets the owner.
    pub fn owner(mut self, uid: u64, gid: u64) -> Entry {
        self.uid = uid;
        self.gid = gid;
        self
    }

    /// Adds an extended attribute, written as a PAX `SCHILY.xattr.<name>` record.
    pub fn xattr(mut self, name: &str, value: impl AsRef<[u8]>) -> Entry {
        self.xattrs
            .insert(name.to_string(), value.as_ref().to_vec());
        self
    }

    /// Sets the modification time (seconds since the epoch).
    pub fn mtime(mut self, mtime: u64) -> Entry {
        self.mtime = mtime;
        self
    }

    fn is_hardlink(&self) -> bool {
        matches!(self.kind, EntryKind::Hardlink(_))
    }
}

/// Collects [`Entry`] values and builds a [`Layer`].
///
/// Unless [`LayerBuilder::preserve_order`] is set, entries are written sorted by path, with
/// all hard links after all other entries (so a link never precedes its target). Parent
/// directories are not added implicitly.
///
/// ```
/// use testkit::image::{Compression, Entry, LayerBuilder};
/// let layer = LayerBuilder::new()
///     .dir("etc")
///     .file("etc/hostname", "box\n")
///     .entry(Entry::file("etc/secret", "s").mode(0o600).owner(1000, 1000))
///     .compression(Compression::Zstd)
///     .build()
///     .unwrap();
/// assert!(layer.digest.starts_with("sha256:"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct LayerBuilder {
    entries: Vec<Entry>,
    compression: Compression,
    level: Option<u32>,
    preserve_order: bool,
    comment: Option<String>,
}

impl LayerBuilder {
    /// An empty, gzip-compressed layer.
    pub fn new() -> LayerBuilder {
        LayerBuilder::default()
    }

    /// Sets the compression (default gzip).
    pub fn compression(mut self, compression: Compression) -> LayerBuilder {
        self.compression = compression;
        self
    }

    /// Sets the gzip (0–9) or zstd (1–22) level; default gzip 6, zstd 3.
    pub fn compression_level(mut self, level: u32) -> LayerBuilder {
        self.level = Some(level);
        self
    }

    /// Writes entries in insertion order instead of sorting them (for hand-crafted
    /// orderings such as "symlink, then a file written through it").
    pub fn preserve_order(mut self) -> LayerBuilder {
        self.preserve_order = true;
        self
    }

    /// Sets the `created_by` text of this layer's history entry in the image config.
    pub fn comment(mut self, comment: impl Into<String>) -> LayerBuilder {
        self.comment = Some(comment.into());
        self
    }

    /// Adds an entry.
    pub fn entry(mut self, entry: Entry) -> LayerBuilder {
        self.entries.push(entry);
        self
    }

    /// Adds an entry (by reference, for loops).
    pub fn push(&mut self, entry: Entry) -> &mut LayerBuilder {
        self.entries.push(entry);
        self
    }

    /// Adds a regular file.
    pub fn file(self, path: impl Into<String>, data: impl Into<Bytes>) -> LayerBuilder {
        self.entry(Entry::file(path, data))
    }

    /// Adds a regular file copied from the host file `host`.
    pub fn host_file(self, path: impl Into<String>, host: impl Into<PathBuf>) -> LayerBuilder {
        self.entry(Entry::host_file(path, host))
    }

    /// Adds a directory.
    pub fn dir(self, path: impl Into<String>) -> LayerBuilder {
        self.entry(Entry::dir(path))
    }

    /// Adds a symbolic link.
    pub fn symlink(self, path: impl Into<String>, target: impl Into<String>) -> LayerBuilder {
        self.entry(Entry::symlink(path, target))
    }

    /// Adds a hard link.
    pub fn hardlink(self, path: impl Into<String>, target: impl Into<String>) -> LayerBuilder {
        self.entry(Entry::hardlink(path, target))
    }

    /// Adds a whiteout for `path`.
    pub fn whiteout(self, path: &str) -> LayerBuilder {
        self.entry(Entry::whiteout(path))
    }

    /// Marks `dir` opaque.
    pub fn opaque(self, dir: &str) -> LayerBuilder {
        self.entry(Entry::opaque(dir))
    }

    /// The entries added so far, in insertion order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The uncompressed tar stream (deterministic).
    pub fn tar(&self) -> Result<Vec<u8>> {
        let mut order: Vec<&Entry> = self.entries.iter().collect();
        if !self.preserve_order {
            order.sort_by(|a, b| {
                (a.is_hardlink(), a.path.as_str()).cmp(&(b.is_hardlink(), b.path.as_str()))
            });
        }
        let mut builder = tar::Builder::new(Vec::new());
        for entry in order {
            // Real tar writers give a hard link's header the metadata of the inode it
            // shares, and unpackers (containerd's among them) apply it to that inode.
            let resolved;
            let entry = match (&entry.kind, entry.mode) {
                (EntryKind::Hardlink(target), None) => {
                    match self.entries.iter().find(|t| &t.path == target) {
                        Some(t) => {
                            resolved = Entry {
                                mode: t.mode.or(Some(inode_mode(t)?)),
                                uid: t.uid,
                                gid: t.gid,
                                ..entry.clone()
                            };
                            &resolved
                        }
                        None => entry,
                    }
                }
                _ => entry,
            };
            write_entry(&mut builder, entry)
                .with_context(|| format!("write tar entry {:?}", entry.path))?;
        }
        Ok(builder.into_inner()?)
    }

    /// Writes the tar, compresses it and digests both forms.
    pub fn build(&self) -> Result<Layer> {
        let tar = self.tar()?;
        Ok(Layer::from_tar_with_level(
            &tar,
            self.compression,
            self.level,
            self.comment.clone(),
        ))
    }
}

fn set_raw(slot: &mut [u8], value: &[u8]) {
    let n = value.len().min(slot.len());
    slot.fill(0);
    slot[..n].copy_from_slice(&value[..n]);
}

/// The mode an entry without an explicit one gets.
fn inode_mode(e: &Entry) -> Result<u32> {
    Ok(match &e.kind {
        EntryKind::File(Content::Host(p)) => {
            std::fs::metadata(p)
                .with_context(|| format!("stat host file {}", p.display()))?
                .permissions()
                .mode()
                & 0o7777
        }
        EntryKind::File(Content::Bytes(_)) => 0o644,
        EntryKind::Dir => 0o755,
        EntryKind::Symlink(_) | EntryKind::Hardlink(_) => 0o777,
        _ => 0o644,
    })
}

fn write_entry(builder: &mut tar::Builder<Vec<u8>>, e: &Entry) -> Result<()> {
    let mut name = e.path.clone();
    if matches!(e.kind, EntryKind::Dir) && !name.ends_with('/') {
        name.push('/');
    }
    let host_data;
    let (data, default_mode): (&[u8], u32) = match &e.kind {
        EntryKind::File(Content::Bytes(b)) => (b, 0o644),
        EntryKind::File(Content::Host(p)) => {
            host_data =
                std::fs::read(p).with_context(|| format!("read host file {}", p.display()))?;
            let mode = std::fs::metadata(p)?.permissions().mode() & 0o7777;
            (&host_data, mode)
        }
        EntryKind::Dir => (&[], 0o755),
        EntryKind::Symlink(_) | EntryKind::Hardlink(_) => (&[], 0o777),
        EntryKind::CharDevice { .. } | EntryKind::BlockDevice { .. } | EntryKind::Fifo => {
            (&[], 0o644)
        }
    };
    let link = match &e.kind {
        EntryKind::Symlink(t) | EntryKind::Hardlink(t) => Some(t.as_str()),
        _ => None,
    };

    let mut pax: Vec<(String, Vec<u8>)> = Vec::new();
    if name.len() > 100 {
        pax.push(("path".into(), name.as_bytes().to_vec()));
    }
    if let Some(l) = link.filter(|l| l.len() > 100) {
        pax.push(("linkpath".into(), l.as_bytes().to_vec()));
    }
    const MAX_ID: u64 = 0o7777777;
    if e.uid > MAX_ID {
        pax.push(("uid".into(), e.uid.to_string().into_bytes()));
    }
    if e.gid > MAX_ID {
        pax.push(("gid".into(), e.gid.to_string().into_bytes()));
    }
    for (k, v) in &e.xattrs {
        pax.push((format!("SCHILY.xattr.{k}"), v.clone()));
    }
    if !pax.is_empty() {
        builder.append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
    }

    let mut h = tar::Header::new_ustar();
    set_raw(&mut h.as_old_mut().name, name.as_bytes());
    if let Some(l) = link {
        set_raw(&mut h.as_old_mut().linkname, l.as_bytes());
    }
    h.set_mode(e.mode.unwrap_or(default_mode));
    h.set_uid(e.uid.min(MAX_ID));
    h.set_gid(e.gid.min(MAX_ID));
    h.set_mtime(e.mtime);
    h.set_size(data.len() as u64);
    h.set_entry_type(match &e.kind {
        EntryKind::File(_) => tar::EntryType::Regular,
        EntryKind::Dir => tar::EntryType::Directory,
        EntryKind::Symlink(_) => tar::EntryType::Symlink,
        EntryKind::Hardlink(_) => tar::EntryType::Link,
        EntryKind::CharDevice { .. } => tar::EntryType::Char,
        EntryKind::BlockDevice { .. } => tar::EntryType::Block,
        EntryKind::Fifo => tar::EntryType::Fifo,
    });
    match e.kind {
        EntryKind::CharDevice { major, minor } | EntryKind::BlockDevice { major, minor } => {
            h.set_device_major(major)?;
            h.set_device_minor(minor)?;
        }
        _ => {
            h.set_device_major(0)?;
            h.set_device_minor(0)?;
        }
    }
    h.set_cksum();
    builder.append(&h, data)?;
    Ok(())
}

/// A built layer: the compressed blob as a registry stores it, plus its identities.
#[derive(Clone, Debug)]
pub struct Layer {
    /// The blob bytes (compressed unless [`Compression::None`]).
    pub blob: Bytes,
    /// `sha256:` digest of [`Layer::blob`]: what manifests reference.
    pub digest: String,
    /// `sha256:` digest of the uncompressed tar: what `rootfs.diff_ids` lists.
    pub diff_id: String,
    /// Length of the uncompressed tar.
    pub uncompressed_size: u64,
    pub compression: Compression,
    /// `created_by` of this layer's history entry.
    pub comment: Option<String>,
}

impl Layer {
    /// Compresses an uncompressed tar stream into a layer.
    pub fn from_tar(tar: &[u8], compression: Compression, comment: Option<String>) -> Layer {
        Layer::from_tar_with_level(tar, compression, None, comment)
    }

    /// [`Layer::from_tar`] with an explicit compression level (`None`: gzip 6, zstd 3).
    pub fn from_tar_with_level(
        tar: &[u8],
        compression: Compression,
        level: Option<u32>,
        comment: Option<String>,
    ) -> Layer {
        let blob: Vec<u8> = match compression {
            Compression::None => tar.to_vec(),
            Compression::Gzip => {
                let mut enc = flate2::GzBuilder::new().write(
                    Vec::new(),
                    flate2::Compression::new(level.unwrap_or(6).min(9)),
                );
                enc.write_all(tar).expect("gzip into memory");
                enc.finish().expect("gzip into memory")
            }
            Compression::Zstd => {
                zstd::stream::encode_all(tar, level.unwrap_or(3) as i32).expect("zstd into memory")
            }
        };
        Layer {
            digest: sha256_digest(&blob),
            diff_id: sha256_digest(tar),
            uncompressed_size: tar.len() as u64,
            blob: blob.into(),
            compression,
            comment,
        }
    }

    /// Size of the blob in bytes.
    pub fn size(&self) -> u64 {
        self.blob.len() as u64
    }

    /// The layer media type for a manifest of `format`.
    pub fn media_type(&self, format: ManifestFormat) -> &'static str {
        use media_types::*;
        match (format, self.compression) {
            (ManifestFormat::Oci, Compression::None) => OCI_LAYER,
            (ManifestFormat::Oci, Compression::Gzip) => OCI_LAYER_GZIP,
            (ManifestFormat::Oci, Compression::Zstd) => OCI_LAYER_ZSTD,
            (ManifestFormat::Docker, Compression::None) => DOCKER_LAYER,
            (ManifestFormat::Docker, Compression::Gzip) => DOCKER_LAYER_GZIP,
            (ManifestFormat::Docker, Compression::Zstd) => DOCKER_LAYER_ZSTD,
        }
    }

    /// Decompresses the blob back into the tar stream.
    pub fn tar(&self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.uncompressed_size as usize);
        match self.compression {
            Compression::None => out.extend_from_slice(&self.blob),
            Compression::Gzip => {
                flate2::read::GzDecoder::new(&self.blob[..]).read_to_end(&mut out)?;
            }
            Compression::Zstd => {
                zstd::stream::read::Decoder::new(&self.blob[..])?.read_to_end(&mut out)?;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries_of(layer: &Layer) -> Vec<(String, tar::EntryType, u32, u64, u64)> {
        let tar = layer.tar().unwrap();
        let mut ar = tar::Archive::new(&tar[..]);
        ar.entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.entry_type(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn every_entry_kind_round_trips() {
        let long = format!("deep/{}/file", "d".repeat(120));
        for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
            let layer = LayerBuilder::new()
                .compression(compression)
                .dir("deep")
                .entry(Entry::file("f", "data").mode(0o640).owner(1000, 1001))
                .entry(Entry::file("x", "x").xattr("user.test", "hello"))
                .symlink("s", "/abs/target")
                .hardlink("h", "f")
                .entry(Entry::char_device("null", 1, 3).mode(0o666))
                .entry(Entry::block_device("loop0", 7, 0))
                .entry(Entry::fifo("pipe"))
                .file(long.clone(), "long")
                .whiteout("gone/file")
                .opaque("opq")
                .build()
                .unwrap();
            assert_eq!(layer.tar().unwrap().len() as u64, layer.uncompressed_size);
            assert_eq!(sha256_digest(&layer.tar().unwrap()), layer.diff_id);
            assert_eq!(sha256_digest(&layer.blob), layer.digest);
            if compression == Compression::None {
                assert_eq!(layer.digest, layer.diff_id);
            } else {
                assert_ne!(layer.digest, layer.diff_id);
            }
            let got = entries_of(&layer);
            let names: Vec<&str> = got.iter().map(|e| e.0.as_str()).collect();
            assert_eq!(
                names,
                [
                    "deep/",
                    long.as_str(),
                    "f",
                    "gone/.wh.file",
                    "loop0",
                    "null",
                    "opq/.wh..wh..opq",
                    "pipe",
                    "s",
                    "x",
                    "h"
                ]
            );
            let f = got.iter().find(|e| e.0 == "f").unwrap();
            assert_eq!((f.2, f.3, f.4), (0o640, 1000, 1001));

            let tar = layer.tar().unwrap();
            let mut ar = tar::Archive::new(&tar[..]);
            for e in ar.entries().unwrap() {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                match path.as_str() {
                    "x" => {
                        let pax: Vec<(String, Vec<u8>)> = e
                            .pax_extensions()
                            .unwrap()
                            .unwrap()
                            .map(|p| {
                                let p = p.unwrap();
                                (p.key().unwrap().to_string(), p.value_bytes().to_vec())
                            })
                            .collect();
                        assert_eq!(pax, [("SCHILY.xattr.user.test".into(), b"hello".to_vec())]);
                    }
                    "s" => assert_eq!(
                        e.link_name().unwrap().unwrap().to_str(),
                        Some("/abs/target")
                    ),
                    "h" => assert_eq!(e.link_name().unwrap().unwrap().to_str(), Some("f")),
                    "null" => {
                        assert_eq!(e.header().device_major().unwrap(), Some(1));
                        assert_eq!(e.header().device_minor().unwrap(), Some(3));
                    }
                    "f" => {
                        let mut s = String::new();
                        e.read_to_string(&mut s).unwrap();
                        assert_eq!(s, "data");
                        assert_eq!(e.header().mtime().unwrap(), MTIME);
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn preserve_order_and_raw_paths() {
        let layer = LayerBuilder::new()
            .preserve_order()
            .symlink("evil", "/tmp")
            .file("evil/pwned", "x")
            .file("../escape", "x")
            .file("/abs", "x")
            .build()
            .unwrap();
        let tar = layer.tar().unwrap();
        let mut ar = tar::Archive::new(&tar[..]);
        let raw: Vec<Vec<u8>> = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path_bytes().into_owned())
            .collect();
        assert_eq!(raw, [&b"evil"[..], b"evil/pwned", b"../escape", b"/abs"]);
    }

    #[test]
    fn builds_are_deterministic() {
        let build = || {
            LayerBuilder::new()
                .file("b", "2")
                .file("a", "1")
                .dir("d")
                .host_file("busybox", "/bin/busybox")
                .build()
                .unwrap()
        };
        let (x, y) = (build(), build());
        assert_eq!(x.digest, y.digest);
        assert_eq!(x.diff_id, y.diff_id);
    }
}
