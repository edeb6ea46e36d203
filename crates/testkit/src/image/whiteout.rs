//! A three-layer image exercising whiteouts, opaque directories, links, xattrs and owners.
//!
//! Layer 1 (gzip):
//!
//! | path | what |
//! | --- | --- |
//! | `a` | file `"a1\n"` |
//! | `b` | file `"b\n"` |
//! | `dir/x`, `dir/y` | files `"x\n"`, `"y\n"` |
//! | `opq/old1`, `opq/old2` | files `"old1\n"`, `"old2\n"` |
//! | `link` | symlink → `b` |
//! | `hard` | hard link to `b` |
//! | `xattr` | file `"xattr\n"` with xattr `user.test=hello` |
//! | `owned` | file `"owned\n"`, owner 1000:1000, mode 0640 |
//!
//! Layer 2 (zstd): `.wh.a`, `dir/.wh.x`, `opq/.wh..wh..opq`, `opq/new` (`"new\n"`).
//!
//! Layer 3 (uncompressed): `a` = `"a3\n"`.
//!
//! Expected root filesystem after unpacking all three (see [`check_whiteout_rootfs`]):
//! `a` (`"a3\n"`), `b`, `hard` (same inode as `b`), `link -> b`, `dir/y`, `opq/new`,
//! `xattr` (with `user.test=hello`), `owned` (1000:1000, 0640); gone: `dir/x`, `opq/old1`,
//! `opq/old2`; and no `.wh.*` file anywhere.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use anyhow::{Context, Result, ensure};

use super::busybox::PATH;
use super::layer::{Compression, Entry, LayerBuilder};
use super::manifest::{Image, ImageBuilder};

/// The whiteout image as a builder.
pub fn whiteout_image_builder() -> ImageBuilder {
    let l1 = LayerBuilder::new()
        .comment("testkit: whiteout base")
        .file("a", "a1\n")
        .file("b", "b\n")
        .dir("dir")
        .file("dir/x", "x\n")
        .file("dir/y", "y\n")
        .dir("opq")
        .file("opq/old1", "old1\n")
        .file("opq/old2", "old2\n")
        .symlink("link", "b")
        .hardlink("hard", "b")
        .entry(Entry::file("xattr", "xattr\n").xattr("user.test", "hello"))
        .entry(
            Entry::file("owned", "owned\n")
                .owner(1000, 1000)
                .mode(0o640),
        );
    let l2 = LayerBuilder::new()
        .comment("testkit: whiteouts and opaque dir")
        .compression(Compression::Zstd)
        .whiteout("a")
        .dir("dir")
        .whiteout("dir/x")
        .dir("opq")
        .opaque("opq")
        .file("opq/new", "new\n");
    let l3 = LayerBuilder::new()
        .comment("testkit: re-add a")
        .compression(Compression::None)
        .file("a", "a3\n");
    ImageBuilder::new()
        .layer(l1)
        .layer(l2)
        .layer(l3)
        .env(PATH)
        .cmd(["/bin/sh"])
}

/// The whiteout image (OCI manifest).
pub fn whiteout_image() -> Image {
    whiteout_image_builder()
        .build()
        .expect("build whiteout image")
}

/// Checks that `root` holds exactly the expected result of unpacking [`whiteout_image`]
/// (contents, absences, link kinds, owner and mode of `owned`; the xattr only when the
/// filesystem under `root` supports `user.*` xattrs).
pub fn check_whiteout_rootfs(root: &Path) -> Result<()> {
    let read = |p: &str| {
        std::fs::read_to_string(root.join(p)).with_context(|| format!("read {p} in rootfs"))
    };
    ensure!(read("a")? == "a3\n", "a should hold layer 3's content");
    ensure!(read("b")? == "b\n", "b");
    ensure!(read("dir/y")? == "y\n", "dir/y");
    ensure!(read("opq/new")? == "new\n", "opq/new");
    for gone in ["dir/x", "opq/old1", "opq/old2"] {
        ensure!(
            std::fs::symlink_metadata(root.join(gone)).is_err(),
            "{gone} should have been whited out"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(root.join("opq"))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    ensure!(
        names == ["new"],
        "opq should hold only `new`, has {names:?}"
    );
    let link = std::fs::read_link(root.join("link")).context("link should be a symlink")?;
    ensure!(link == Path::new("b"), "link -> {}", link.display());
    let (b, hard) = (
        std::fs::symlink_metadata(root.join("b"))?,
        std::fs::symlink_metadata(root.join("hard"))?,
    );
    ensure!(
        b.ino() == hard.ino() && b.dev() == hard.dev(),
        "hard should be a hard link to b"
    );
    let owned = std::fs::symlink_metadata(root.join("owned"))?;
    ensure!(
        owned.uid() == 1000 && owned.gid() == 1000,
        "owned should be 1000:1000"
    );
    ensure!(
        owned.permissions().mode() & 0o7777 == 0o640,
        "owned should be mode 0640"
    );
    ensure!(read("xattr")? == "xattr\n", "xattr content");
    if user_xattrs_supported(root) {
        let v = xattr_get(&root.join("xattr"), "user.test")?;
        ensure!(
            v.as_deref() == Some(&b"hello"[..]),
            "xattr user.test should be hello, is {v:?}"
        );
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            ensure!(
                !e.file_name().to_string_lossy().starts_with(".wh."),
                "whiteout file left in rootfs: {}",
                e.path().display()
            );
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(())
}

fn user_xattrs_supported(dir: &Path) -> bool {
    let probe = dir.join(".testkit-xattr-probe");
    if std::fs::write(&probe, b"").is_err() {
        return false;
    }
    let ok = xattr_set(&probe, "user.probe", b"1").is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

fn cpath(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn xattr_set(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (p, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    // SAFETY: valid NUL-terminated strings and a live buffer.
    let r = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn xattr_get(p: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
    let (p, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid NUL-terminated strings and a live buffer of the given length.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENODATA) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    buf.truncate(r as usize);
    Ok(Some(buf))
}
