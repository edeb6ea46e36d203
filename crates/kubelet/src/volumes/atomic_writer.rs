//! Upstream's AtomicWriter (pkg/volume/util/atomic_writer.go): a volume's files live in a
//! timestamped directory `..<time>.<n>`; `..data` is a symlink to the current one and each
//! user-visible top-level name is a symlink through `..data`. A new payload is written to a
//! fresh directory and published by renaming a new `..data_tmp` symlink over `..data`, so
//! a reader in the container sees either the old set of files or the new one, never a mix.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path};

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// One file of a volume's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Path (relative, `/`-separated) → content and mode.
pub type Payload = BTreeMap<String, FileProjection>;

/// A payload path must stay inside the volume (upstream's validatePayload).
pub fn validate_path(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("invalid path: must not be empty".into());
    }
    if p.len() > 4096 {
        return Err(format!(
            "invalid path: must be less than or equal to 4096 characters: {p:?}"
        ));
    }
    let path = Path::new(p);
    if path.is_absolute() {
        return Err(format!("invalid path: must be relative path: {p}"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("invalid path: must not contain '..': {p}"));
    }
    if p.starts_with("..") {
        return Err(format!("invalid path: must not start with '..': {p}"));
    }
    Ok(())
}

fn top_level(p: &str) -> &str {
    p.split('/').next().unwrap_or(p)
}

/// Whether the directory `dir` holds exactly `payload` (contents and modes).
fn same(dir: &Path, payload: &Payload) -> bool {
    let mut found = 0usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            return false;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { return false };
            if ft.is_dir() {
                stack.push(p);
                continue;
            }
            let Ok(rel) = p.strip_prefix(dir) else {
                return false;
            };
            let Some(want) = payload.get(&rel.to_string_lossy().into_owned()) else {
                return false;
            };
            let Ok(meta) = e.metadata() else { return false };
            if meta.permissions().mode() & 0o7777 != want.mode & 0o7777 {
                return false;
            }
            if std::fs::read(&p).ok().as_deref() != Some(want.data.as_slice()) {
                return false;
            }
            found += 1;
        }
    }
    found == payload.len()
}

fn ts_dir_name() -> String {
    let now = jiff::Timestamp::now();
    let n: u32 = std::process::id() ^ now.subsec_nanosecond() as u32;
    format!("..{}.{n}", now.strftime("%Y_%m_%d_%H_%M_%S"))
}

/// Writes `payload` into `target` atomically; returns whether anything changed.
pub fn write(target: &Path, payload: &Payload) -> io::Result<bool> {
    for p in payload.keys() {
        validate_path(p).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    }
    std::fs::create_dir_all(target)?;
    let data_link = target.join(DATA);
    let old = std::fs::read_link(&data_link).ok();
    let old_dir = old.as_ref().map(|o| target.join(o));
    if let Some(od) = &old_dir
        && same(od, payload)
    {
        // Still make sure every user-visible link exists (a crash between steps).
        publish_links(target, payload)?;
        return Ok(false);
    }
    let ts = ts_dir_name();
    let ts_path = target.join(&ts);
    std::fs::create_dir(&ts_path)?;
    std::fs::set_permissions(&ts_path, std::fs::Permissions::from_mode(0o755))?;
    for (rel, f) in payload {
        let p = ts_path.join(rel);
        if let Some(parent) = p.parent()
            && parent != ts_path
        {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, &f.data)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(f.mode & 0o7777))?;
    }
    let tmp = target.join(DATA_TMP);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&ts, &tmp)?;
    std::fs::rename(&tmp, &data_link)?;
    publish_links(target, payload)?;
    // Old user-visible names the new payload no longer has.
    let wanted: std::collections::BTreeSet<&str> = payload.keys().map(|k| top_level(k)).collect();
    for e in std::fs::read_dir(target)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") || wanted.contains(name.as_str()) {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_symlink()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    if let Some(od) = old_dir
        && od != ts_path
    {
        let _ = std::fs::remove_dir_all(od);
    }
    Ok(true)
}

fn publish_links(target: &Path, payload: &Payload) -> io::Result<()> {
    let tops: std::collections::BTreeSet<&str> = payload.keys().map(|k| top_level(k)).collect();
    for t in tops {
        let link = target.join(t);
        if std::fs::symlink_metadata(&link).is_ok() {
            continue;
        }
        std::os::unix::fs::symlink(Path::new(DATA).join(t), &link)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: s.as_bytes().to_vec(),
            mode,
        }
    }

    #[test]
    fn publishes_through_data_link_and_swaps_atomically() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("vol");
        let mut p = Payload::new();
        p.insert("a".into(), f("one", 0o644));
        p.insert("dir/b".into(), f("two", 0o600));
        assert!(write(&t, &p).unwrap());
        assert_eq!(std::fs::read_to_string(t.join("a")).unwrap(), "one");
        assert_eq!(std::fs::read_to_string(t.join("dir/b")).unwrap(), "two");
        assert_eq!(
            std::fs::read_link(t.join("a")).unwrap(),
            Path::new("..data/a")
        );
        let first = std::fs::read_link(t.join(DATA)).unwrap();
        assert_eq!(
            std::fs::metadata(t.join("dir/b"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        // The same payload changes nothing.
        assert!(!write(&t, &p).unwrap());
        assert_eq!(std::fs::read_link(t.join(DATA)).unwrap(), first);
        // A new payload swaps the data dir; names it dropped disappear, the old dir goes.
        let mut q = Payload::new();
        q.insert("a".into(), f("uno", 0o644));
        q.insert("c".into(), f("three", 0o644));
        assert!(write(&t, &q).unwrap());
        let second = std::fs::read_link(t.join(DATA)).unwrap();
        assert_ne!(first, second);
        assert_eq!(std::fs::read_to_string(t.join("a")).unwrap(), "uno");
        assert_eq!(std::fs::read_to_string(t.join("c")).unwrap(), "three");
        assert!(std::fs::symlink_metadata(t.join("dir")).is_err());
        assert!(!t.join(&first).exists());
        assert!(!t.join(DATA_TMP).exists());
    }

    #[test]
    fn paths_must_stay_inside() {
        assert!(validate_path("../x").is_err());
        assert!(validate_path("/etc/passwd").is_err());
        assert!(validate_path("a/../../b").is_err());
        assert!(validate_path("..data").is_err());
        assert!(validate_path("ok/fine").is_ok());
    }
}
