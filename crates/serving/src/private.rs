//! Files and directories only their owner (root) may read: keys, kubeconfigs with embedded
//! keys, token files, the store. They are created with their final mode, never chmod-ed
//! after the secret is in them, and an install from before with looser modes is fixed.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// The mode of a private file.
pub const FILE_MODE: u32 = 0o600;
/// The mode of a directory holding private files.
pub const DIR_MODE: u32 = 0o700;

/// Creates `dir` (and missing parents) mode 0700, or narrows an existing one to 0700.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    restrict(dir, DIR_MODE)
}

/// Narrows an existing file or directory to `mode` when group or others may access it.
fn restrict(path: &Path, mode: u32) -> std::io::Result<()> {
    let meta = std::fs::metadata(path)?;
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Narrows an existing file to 0600; a missing file is not an error.
pub fn restrict_file(path: &Path) -> std::io::Result<()> {
    match restrict(path, FILE_MODE) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Creates `path` empty with mode 0600 unless it exists (then narrows it to 0600), so a
/// file another library fills (the store) is never readable by others.
pub fn create_file(path: &Path) -> std::io::Result<()> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => restrict(path, FILE_MODE),
        Err(e) => Err(e),
    }
}

/// Writes `contents` to `path` mode 0600 atomically (a new temp file, then rename), so a
/// crash never leaves a truncated key and no reader ever sees the secret with a wider mode.
pub fn write(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    // A temp file left by a crash may have any mode; the new one is created, not reused.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn files_and_dirs_are_created_private_and_loose_ones_narrowed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("a/pki");
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&d.path().join("a")), 0o700);
        let key = dir.join("k.key");
        write(&key, b"secret").unwrap();
        assert_eq!(mode(&key), 0o600);
        assert_eq!(std::fs::read(&key).unwrap(), b"secret");
        assert!(!dir.join("k.key.tmp").exists());

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        create_dir(&dir).unwrap();
        restrict_file(&key).unwrap();
        assert_eq!((mode(&dir), mode(&key)), (0o700, 0o600));
        restrict_file(&dir.join("missing")).unwrap();

        let store = dir.join("store.redb");
        create_file(&store).unwrap();
        assert_eq!(mode(&store), 0o600);
        std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o666)).unwrap();
        create_file(&store).unwrap();
        assert_eq!(mode(&store), 0o600);
    }
}
