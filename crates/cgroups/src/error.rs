//! The errors of cgroup operations; each names the file (and value) involved, so a message
//! alone says what to fix.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup root {} does not exist", .0.display())]
    RootMissing(PathBuf),
    #[error("cgroup root {} is not writable: {}", .path.display(), os_msg(.source))]
    RootNotWritable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid cgroup path {0:?}: must be relative names without \"..\"")]
    InvalidPath(String),
    #[error("invalid {field}: {reason}")]
    InvalidResource { field: &'static str, reason: String },
    #[error("{field} needs the {controller} cgroup controller, which is not available")]
    ControllerMissing {
        controller: &'static str,
        field: &'static str,
    },
    #[error("cgroup {0} does not exist")]
    NotFound(String),
    #[error("create {}: {}", .path.display(), os_msg(.source))]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("write {value} to {}: {}", .path.display(), os_msg(.source))]
    Write {
        path: PathBuf,
        value: String,
        source: std::io::Error,
    },
    #[error("read {}: {}", .path.display(), os_msg(.source))]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("remove {}: {} (gave up after {attempts} attempts)", .path.display(), os_msg(.source))]
    Remove {
        path: PathBuf,
        attempts: u32,
        source: std::io::Error,
    },
    #[error("{}: still {state} after waiting (wanted {want})", .path.display())]
    Freeze {
        path: PathBuf,
        state: String,
        want: &'static str,
    },
    #[error(
        "systemd cgroup driver: {reason}: systemd cgroup flag passed, but systemd support for managing cgroups is not available"
    )]
    SystemdUnavailable { reason: &'static str },
    #[error("systemd: {op} {unit}: {message}")]
    Systemd {
        op: &'static str,
        unit: String,
        message: String,
    },
    #[error("systemd: {op} {unit}: job finished with result {result:?}")]
    SystemdJob {
        op: &'static str,
        unit: String,
        result: String,
    },
    #[error(transparent)]
    Stats(#[from] crate::stats::StatsError),
}

impl CgroupError {
    pub(crate) fn write(path: &Path, value: &str, source: std::io::Error) -> CgroupError {
        CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
        }
    }

    /// The OS error behind this one, if any (EBUSY, EINVAL, …).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            CgroupError::RootNotWritable { source, .. }
            | CgroupError::Create { source, .. }
            | CgroupError::Write { source, .. }
            | CgroupError::Read { source, .. }
            | CgroupError::Remove { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// "Invalid argument" rather than "Invalid argument (os error 22)": the message is read by
/// people, the number stays reachable through `raw_os_error`.
fn os_msg(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_error_names_file_value_and_reason() {
        let e = CgroupError::write(
            Path::new("/sys/fs/cgroup/memory/kubepods/memory.limit_in_bytes"),
            "100Mx",
            std::io::Error::from_raw_os_error(libc::EINVAL),
        );
        assert_eq!(
            e.to_string(),
            "write 100Mx to /sys/fs/cgroup/memory/kubepods/memory.limit_in_bytes: Invalid argument"
        );
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }
}
