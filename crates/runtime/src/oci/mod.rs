//! OCI runtime handlers: the `runc`/`crun` command-line contract, one named handler per
//! RuntimeClass.
//!
//! The runtime drives an OCI runtime only through its CLI (create happens in the shim;
//! start, kill, delete, state, exec and update here), so any OCI-compliant binary configured
//! in `runtime-handlers` works. Each handler keeps its own `--root`, so runc's and crun's
//! state never mix.
//!
//! gVisor's `runsc` ([`CliKind::Runsc`]) speaks the same CLI with its own sandbox model:
//! each container here is a gVisor sandbox of its own (the `runsc-sandbox` process runs
//! the Sentry, the workload never appears on the host), started in the pod's network
//! namespace with `--network=host`, so the Sentry uses the CNI-configured interfaces of
//! that namespace and every container of the pod (init containers included) shares them.
//! What gVisor cannot do is refused when the pod or container is made ([`gvisor`]).

pub mod gvisor;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

/// The handler used when a sandbox names none (RuntimeClass absent), unless the config's
/// `default-runtime-handler` names another.
pub const DEFAULT_HANDLER: &str = "runc";

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(
        "no runtime for {0:?} is configured; configured handlers: {1} (add it under [runtime-handlers] in the runtime config)"
    )]
    UnknownHandler(String, String),
    #[error("OCI runtime {binary} not found on PATH or at that path")]
    NotInstalled { binary: String },
    #[error("{runtime} {op} {id}: {message}")]
    Failed {
        runtime: String,
        op: &'static str,
        id: String,
        message: String,
    },
    #[error("{runtime} {op} {id}: container does not exist")]
    NotFound {
        runtime: String,
        op: &'static str,
        id: String,
    },
    #[error("{runtime} {op} {id}: timed out after {timeout:?}")]
    Timeout {
        runtime: String,
        op: &'static str,
        id: String,
        timeout: Duration,
    },
    #[error("running {runtime}: {source}")]
    Spawn {
        runtime: String,
        source: std::io::Error,
    },
}

/// Which command-line dialect a handler's binary speaks, from its file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CliKind {
    /// runc and the runtimes that copy its CLI (crun, youki).
    Runc,
    /// gVisor's runsc: no `update`, exec's terminal comes from process.json, and global
    /// flags of its own.
    Runsc,
}

impl CliKind {
    pub fn of(binary: &Path) -> CliKind {
        match binary.file_name().and_then(|n| n.to_str()) {
            Some("runsc") => CliKind::Runsc,
            _ => CliKind::Runc,
        }
    }
}

/// One configured OCI runtime.
#[derive(Debug, Clone)]
pub struct OciRuntime {
    pub handler: String,
    pub binary: PathBuf,
    pub kind: CliKind,
    /// `--root` for this runtime's own state (under the runtime's state dir).
    pub root: PathBuf,
    /// `--systemd-cgroup`: the runtime asks systemd for the container's scope.
    pub systemd_cgroup: bool,
}

/// What `runc state` reports.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct OciState {
    pub id: String,
    pub pid: i64,
    /// created | running | paused | stopped
    pub status: String,
}

pub(crate) fn find_binary(name: &Path) -> Option<PathBuf> {
    if name.components().count() > 1 {
        return name.exists().then(|| name.to_path_buf());
    }
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The handler table from the runtime config.
#[derive(Debug, Clone)]
pub struct Handlers {
    runtimes: BTreeMap<String, OciRuntime>,
    default: String,
    systemd_cgroup: bool,
}

impl Handlers {
    /// Resolves each configured binary; handlers whose binary is missing stay listed but
    /// fail with a clear error when used.
    pub fn new(
        table: &BTreeMap<String, PathBuf>,
        default: &str,
        state_dir: &Path,
        systemd_cgroup: bool,
    ) -> Self {
        let runtimes = table
            .iter()
            .map(|(name, bin)| {
                let binary = find_binary(bin).unwrap_or_else(|| bin.clone());
                (
                    name.clone(),
                    OciRuntime {
                        handler: name.clone(),
                        kind: CliKind::of(&binary),
                        binary,
                        root: state_dir.join("oci").join(name),
                        systemd_cgroup,
                    },
                )
            })
            .collect();
        Self {
            runtimes,
            default: default.to_string(),
            systemd_cgroup,
        }
    }

    /// The handler pods that name none run with.
    pub fn default_name(&self) -> &str {
        &self.default
    }

    /// Whether containers' cgroups are systemd scopes (the `systemd-cgroup` key).
    pub fn systemd_cgroup(&self) -> bool {
        self.systemd_cgroup
    }

    /// The runtime for a RuntimeClass handler name ("" means the default).
    pub fn get(&self, handler: &str) -> Result<&OciRuntime, OciError> {
        let name = if handler.is_empty() {
            self.default.as_str()
        } else {
            handler
        };
        let rt = self.runtimes.get(name).ok_or_else(|| {
            OciError::UnknownHandler(
                name.to_string(),
                self.runtimes.keys().cloned().collect::<Vec<_>>().join(", "),
            )
        })?;
        if !rt.binary.is_file() {
            return Err(OciError::NotInstalled {
                binary: rt.binary.display().to_string(),
            });
        }
        Ok(rt)
    }

    /// The CLI kind of a configured handler, binary present or not.
    pub fn kind(&self, handler: &str) -> Option<CliKind> {
        self.runtimes.get(handler).map(|r| r.kind)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.runtimes.keys().map(String::as_str)
    }
}

/// runc and crun print errors as JSON log lines or plain text on stderr; keep the message.
fn error_text(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let mut msgs = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) => {
                if let Some(m) = v.get("msg").and_then(|m| m.as_str()) {
                    msgs.push(m.to_string());
                }
            }
            Err(_) => msgs.push(line.trim().to_string()),
        }
    }
    msgs.join("; ")
}

fn is_not_found(msg: &str) -> bool {
    msg.contains("does not exist") || msg.contains("not found") || msg.contains("No such file")
}

impl OciRuntime {
    /// The global flags every invocation carries (the shim's and exec's too).
    pub fn global_args(&self) -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> = vec!["--root".into(), self.root.clone().into()];
        if self.systemd_cgroup {
            v.push("--systemd-cgroup".into());
        }
        v.extend(self.kind_args().iter().map(Into::into));
        v
    }

    /// The global flags this runtime's kind needs beyond `--root` and `--systemd-cgroup`.
    pub fn kind_args(&self) -> &'static [&'static str] {
        match self.kind {
            CliKind::Runc => &[],
            CliKind::Runsc => gvisor::GLOBAL_ARGS,
        }
    }

    /// The binary with its global flags.
    fn base(&self) -> Command {
        let mut c = Command::new(&self.binary);
        c.args(self.global_args());
        c
    }

    fn cmd(&self) -> Command {
        let mut c = self.base();
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        c
    }

    async fn run(
        &self,
        op: &'static str,
        id: &str,
        mut cmd: Command,
        timeout: Duration,
    ) -> Result<Vec<u8>, OciError> {
        let out = match tokio::time::timeout(timeout, cmd.output()).await {
            Err(_) => {
                return Err(OciError::Timeout {
                    runtime: self.handler.clone(),
                    op,
                    id: id.into(),
                    timeout,
                });
            }
            Ok(r) => r.map_err(|source| OciError::Spawn {
                runtime: self.binary.display().to_string(),
                source,
            })?,
        };
        if out.status.success() {
            return Ok(out.stdout);
        }
        let message = error_text(&out.stderr);
        if is_not_found(&message) {
            return Err(OciError::NotFound {
                runtime: self.handler.clone(),
                op,
                id: id.into(),
            });
        }
        Err(OciError::Failed {
            runtime: self.handler.clone(),
            op,
            id: id.into(),
            message: if message.is_empty() {
                format!("exited with {}", out.status)
            } else {
                message
            },
        })
    }

    /// Sends `signal` to the init (or, with `all`, to every process of the container).
    pub async fn kill(&self, id: &str, signal: i32, all: bool) -> Result<(), OciError> {
        let mut c = self.cmd();
        c.arg("kill");
        if all {
            c.arg("--all");
        }
        c.arg(id).arg(signal.to_string());
        match self.run("kill", id, c, Duration::from_secs(10)).await {
            // Killing what already exited is success: the goal state holds.
            Err(OciError::Failed { message, .. })
                if message.contains("not running")
                    || message.contains("process already finished") =>
            {
                Ok(())
            }
            r => r.map(|_| ()),
        }
    }

    /// Deletes the container's runtime state; a container that does not exist is success.
    pub async fn delete(&self, id: &str, force: bool) -> Result<(), OciError> {
        let mut c = self.cmd();
        c.arg("delete");
        if force {
            c.arg("--force");
        }
        c.arg(id);
        match self.run("delete", id, c, Duration::from_secs(30)).await {
            Err(OciError::NotFound { .. }) => Ok(()),
            r => r.map(|_| ()),
        }
    }

    pub async fn state(&self, id: &str) -> Result<OciState, OciError> {
        let mut c = self.cmd();
        c.arg("state").arg(id);
        let out = self.run("state", id, c, Duration::from_secs(10)).await?;
        serde_json::from_slice(&out).map_err(|e| OciError::Failed {
            runtime: self.handler.clone(),
            op: "state",
            id: id.into(),
            message: format!("unparsable state output: {e}"),
        })
    }

    /// Applies new resources (a JSON `LinuxResources`) to a running container.
    pub async fn update(&self, id: &str, resources_json: &Path) -> Result<(), OciError> {
        if self.kind == CliKind::Runsc {
            return Err(OciError::Failed {
                runtime: self.handler.clone(),
                op: "update",
                id: id.into(),
                message: gvisor::Unsupported::Update.to_string(),
            });
        }
        let mut c = self.cmd();
        c.arg("update")
            .arg("--resources")
            .arg(resources_json)
            .arg(id);
        self.run("update", id, c, Duration::from_secs(30))
            .await
            .map(|_| ())
    }

    /// A `runc exec` command for `process.json`, stdio left for the caller to wire up.
    pub fn exec_command(
        &self,
        id: &str,
        process_json: &Path,
        tty: bool,
        pid_file: Option<&Path>,
    ) -> Command {
        let mut c = self.base();
        c.arg("exec");
        // runsc has no --tty: process.json's `terminal` says it.
        if tty && self.kind == CliKind::Runc {
            c.arg("--tty");
        }
        if let Some(p) = pid_file {
            c.arg("--pid-file").arg(p);
        }
        c.arg("--process").arg(process_json).arg(id);
        c.kill_on_drop(true);
        c
    }

    /// The runtime's version line, for Status/Version verbose info.
    pub async fn version(&self) -> Option<String> {
        let mut c = Command::new(&self.binary);
        c.arg("--version")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let out = c.output().await.ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .map(str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_handler_names_the_configured_ones() {
        let mut t = BTreeMap::new();
        t.insert("runc".to_string(), PathBuf::from("runc"));
        let h = Handlers::new(&t, "runc", Path::new("/tmp/x"), false);
        let e = h.get("kata").unwrap_err().to_string();
        assert!(e.contains("\"kata\"") && e.contains("runc"), "{e}");
    }

    #[test]
    fn runc_json_errors_are_unwrapped() {
        let s = br#"{"level":"error","msg":"container \"x\" does not exist","time":"t"}"#;
        assert_eq!(error_text(s), "container \"x\" does not exist");
        assert!(is_not_found(&error_text(s)));
        assert_eq!(error_text(b"plain failure\n"), "plain failure");
    }
}
