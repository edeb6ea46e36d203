//! An image volume's `image_sub_path` (OCI volume source, KEP 4639): the directory inside
//! the mounted image that is bound instead of its root. It is resolved inside the image's
//! tree as Go's `os.OpenInRoot` (containerd's `ensureImageSubPath`) does: `..` and symlinks
//! may move within the image but never out of it, and the result must be a directory.

use std::collections::VecDeque;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed at most, as the kernel's own limit.
const MAX_SYMLINKS: usize = 40;

/// Why a sub path cannot be mounted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubPathError {
    #[error("path escapes from parent")]
    Escapes,
    #[error("no such file or directory")]
    NotFound,
    #[error("too many levels of symbolic links")]
    Loop,
    #[error("only directory subpath is supported")]
    NotADirectory,
    #[error("{0}")]
    Io(String),
}

/// The host path of `sub_path` inside the image mounted at `root`.
pub fn resolve(root: &Path, sub_path: &str) -> Result<PathBuf, SubPathError> {
    let mut todo: VecDeque<String> = components(Path::new(sub_path))?;
    let mut at: Vec<String> = Vec::new();
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            at.pop().ok_or(SubPathError::Escapes)?;
            continue;
        }
        let path = at
            .iter()
            .fold(root.to_path_buf(), |p, c| p.join(c))
            .join(&c);
        let meta = std::fs::symlink_metadata(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => SubPathError::NotFound,
            _ => SubPathError::Io(e.to_string()),
        })?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(SubPathError::Loop);
            }
            let target = std::fs::read_link(&path).map_err(|e| SubPathError::Io(e.to_string()))?;
            let mut rest = components(&target)?;
            rest.extend(todo);
            todo = rest;
            continue;
        }
        at.push(c);
    }
    let path = at.iter().fold(root.to_path_buf(), |p, c| p.join(c));
    match std::fs::metadata(&path) {
        Ok(m) if m.is_dir() => Ok(path),
        Ok(_) => Err(SubPathError::NotADirectory),
        Err(e) => Err(SubPathError::Io(e.to_string())),
    }
}

/// The steps of a relative path; an absolute one escapes (as with `os.OpenInRoot`).
fn components(p: &Path) -> Result<VecDeque<String>, SubPathError> {
    p.components()
        .filter(|c| *c != Component::CurDir)
        .map(|c| match c {
            Component::Normal(s) => Ok(s.to_string_lossy().into_owned()),
            Component::ParentDir => Ok("..".to_string()),
            _ => Err(SubPathError::Escapes),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_stay_inside_the_image() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("img");
        std::fs::create_dir_all(root.join("usr/share/data")).unwrap();
        std::fs::write(root.join("usr/file"), "x").unwrap();
        std::os::unix::fs::symlink("usr/share", root.join("share")).unwrap();
        std::os::unix::fs::symlink("/usr", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../..", root.join("usr/up")).unwrap();
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        std::fs::create_dir(d.path().join("outside")).unwrap();

        assert_eq!(resolve(&root, "usr/share"), Ok(root.join("usr/share")));
        assert_eq!(resolve(&root, "./usr//share/"), Ok(root.join("usr/share")));
        assert_eq!(
            resolve(&root, "share/data"),
            Ok(root.join("usr/share/data"))
        );
        assert_eq!(
            resolve(&root, "usr/share/../share/data"),
            Ok(root.join("usr/share/data"))
        );
        assert_eq!(resolve(&root, "../outside"), Err(SubPathError::Escapes));
        assert_eq!(
            resolve(&root, "usr/../../outside"),
            Err(SubPathError::Escapes)
        );
        assert_eq!(resolve(&root, "/usr"), Err(SubPathError::Escapes));
        assert_eq!(resolve(&root, "abs"), Err(SubPathError::Escapes));
        assert_eq!(resolve(&root, "usr/up/outside"), Err(SubPathError::Escapes));
        assert_eq!(resolve(&root, "nope"), Err(SubPathError::NotFound));
        assert_eq!(resolve(&root, "usr/file"), Err(SubPathError::NotADirectory));
        assert_eq!(resolve(&root, "loop"), Err(SubPathError::Loop));
    }
}
