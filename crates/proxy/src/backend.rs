//! What the proxier asks of a kernel backend (nftables or iptables), and the pieces both
//! share: per-service rendered fragments diffed against what was last programmed, so a
//! change to one service writes only that service's chains and map elements.

use crate::model::{NodeContext, ServicePortName, Snapshot};
use sha2::Digest as _;
use std::collections::BTreeSet;

/// A backend's failure that is not tied to one service.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{tool}: {err}")]
    Tool { tool: String, err: String },
}

/// What one sync did.
#[derive(Debug, Default, Clone)]
pub struct SyncOutcome {
    /// Services the kernel refused, with its message; every other service was programmed.
    pub failed: Vec<(ServicePortName, String)>,
    /// Transactions sent to the kernel.
    pub transactions: usize,
    /// Bytes of rule text sent.
    pub bytes: usize,
}

/// A kernel rule programmer.
pub trait Backend: Send {
    /// Rewrites everything this backend owns from `snap` (start, syncPeriod, after errors).
    fn full_sync(
        &mut self,
        snap: &Snapshot,
        ctx: &NodeContext,
    ) -> Result<SyncOutcome, BackendError>;
    /// Rewrites only `changed` service ports (present in `snap` or gone from it).
    fn partial_sync(
        &mut self,
        snap: &Snapshot,
        ctx: &NodeContext,
        changed: &BTreeSet<ServicePortName>,
    ) -> Result<SyncOutcome, BackendError>;
    /// Per service, the rules this backend programs for it, for `--show-rules`.
    fn show_rules(&self, snap: &Snapshot, ctx: &NodeContext) -> String;
    /// Removes everything this backend ever programmed (its table or chains).
    fn cleanup(&mut self) -> Result<(), BackendError>;
    /// Called between syncs (while minSyncPeriod holds the next one back): a backend may
    /// prepare there what the next partial sync would otherwise wait for.
    fn idle(&mut self) {}
}

/// Sends rule text to the kernel; replaced in unit tests by a recorder.
pub trait Runner: Send {
    /// Applies `text` as one atomic transaction (`nft -f -`, `iptables-restore --noflush`).
    fn apply(&mut self, text: &str) -> Result<(), String>;
    /// Applies a large transaction (a full sync's chunk); a runner may send it another way
    /// than the small ones of a partial sync.
    fn apply_bulk(&mut self, text: &str) -> Result<(), String> {
        self.apply(text)
    }
    /// The kernel's current text of what this backend owns, or None if it does not exist.
    fn list(&mut self) -> Option<String>;
    /// See [`Backend::idle`].
    fn idle(&mut self) {}
}

/// Runs a tool with `text` on stdin; `Err` carries its stderr.
pub fn run_with_stdin(program: &str, args: &[&str], text: &str) -> Result<String, String> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("writing to {program}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Upstream's hashAndTruncate: a short hash of `name` in front of it, so names stay unique
/// and visually distinct when cut to the kernel's length limit.
pub fn hash_and_truncate(name: &str, max: usize) -> String {
    let hash = sha2::Sha256::digest(name.as_bytes());
    let encoded = data_encoding::BASE32.encode(&hash);
    let mut out = format!("{}-{}", &encoded[..8], name);
    if out.len() > max {
        let mut cut = max.saturating_sub(3);
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}
