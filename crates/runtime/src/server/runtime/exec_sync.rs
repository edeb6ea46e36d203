//! ExecSync: run a command in a running container and return its output and exit code,
//! killing it at the timeout (as the kubelet's exec probes rely on).

use super::Inner;
use crate::state::ContainerState;
use cri::runtime::v1 as pb;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt as _;
use tonic::Status;

/// Output beyond this is cut, as containerd caps exec output (16 MiB) to protect itself.
const MAX_OUTPUT: usize = 16 << 20;

/// The process of the container's own spec with `cmd` as its args: same user, env, cwd,
/// capabilities, so an exec sees what the container sees.
pub(crate) fn exec_process(
    bundle: &std::path::Path,
    cmd: &[String],
    tty: bool,
) -> Result<serde_json::Value, Status> {
    let path = bundle.join("config.json");
    let spec: serde_json::Value = std::fs::read(&path)
        .map_err(|e| Status::internal(format!("reading {}: {e}", path.display())))
        .and_then(|b| {
            serde_json::from_slice(&b)
                .map_err(|e| Status::internal(format!("parsing {}: {e}", path.display())))
        })?;
    let mut process = spec
        .get("process")
        .cloned()
        .ok_or_else(|| Status::internal(format!("{} has no process", path.display())))?;
    process["args"] = serde_json::json!(cmd);
    process["terminal"] = serde_json::json!(tty);
    if let Some(o) = process.as_object_mut() {
        o.remove("consoleSize");
    }
    Ok(process)
}

/// Kills an exec'd process and, when it leads its own process group (runc makes each exec
/// a session leader), the whole group: `sh -c 'sleep 1d & wait'` must not leave the sleep
/// behind in the container.
fn kill_exec(pid: i32) {
    use nix::sys::signal::{Signal, kill, killpg};
    use nix::unistd::{Pid, getpgid};
    let pid = Pid::from_raw(pid);
    if getpgid(Some(pid)) == Ok(pid) {
        let _ = killpg(pid, Signal::SIGKILL);
    }
    let _ = kill(pid, Signal::SIGKILL);
}

pub async fn exec_sync(
    inner: &Inner,
    req: pb::ExecSyncRequest,
) -> Result<pb::ExecSyncResponse, Status> {
    if req.cmd.is_empty() {
        return Err(Status::invalid_argument("exec command must not be empty"));
    }
    let rec = inner.find_container(&req.container_id)?;
    if rec.state != ContainerState::Running {
        return Err(Status::failed_precondition(format!(
            "container {} is not running",
            rec.id
        )));
    }
    let rt = inner
        .handlers
        .get(&rec.handler)
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
    let process = exec_process(&rec.bundle, &req.cmd, false)?;
    let dir = tempfile::Builder::new()
        .prefix("exec-")
        .tempdir_in(&inner.state_dir)
        .map_err(|e| Status::internal(format!("exec scratch dir: {e}")))?;
    let pjson = dir.path().join("process.json");
    std::fs::write(&pjson, process.to_string())
        .map_err(|e| Status::internal(format!("writing {}: {e}", pjson.display())))?;
    let pid_file = dir.path().join("pid");
    let mut cmd = rt.exec_command(&rec.id, &pjson, false, Some(&pid_file));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| Status::internal(format!("running {}: {e}", rt.binary.display())))?;
    let mut out = child
        .stdout
        .take()
        .ok_or_else(|| Status::internal("no stdout"))?;
    let mut err = child
        .stderr
        .take()
        .ok_or_else(|| Status::internal("no stderr"))?;
    let read_all = async {
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let (mut to, mut te) = (
            (&mut out).take(MAX_OUTPUT as u64),
            (&mut err).take(MAX_OUTPUT as u64),
        );
        let (ro, re) = tokio::join!(to.read_to_end(&mut o), te.read_to_end(&mut e));
        ro.and(re).map(|_| (o, e))
    };
    let run = async {
        let (o, e) = read_all.await?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((o, e, status))
    };
    let result = if req.timeout > 0 {
        match tokio::time::timeout(Duration::from_secs(req.timeout as u64), run).await {
            Ok(r) => r,
            Err(_) => {
                // runc exec only waits for the process: kill it, as containerd does, or it
                // would outlive the probe that timed out.
                if let Some(pid) = std::fs::read_to_string(&pid_file)
                    .ok()
                    .and_then(|p| p.trim().parse::<i32>().ok())
                {
                    kill_exec(pid);
                }
                return Err(Status::deadline_exceeded(format!(
                    "command {:?} timed out after {}s",
                    req.cmd, req.timeout
                )));
            }
        }
    } else {
        run.await
    };
    let (stdout, stderr, status) =
        result.map_err(|e| Status::internal(format!("exec in {}: {e}", rec.id)))?;
    use std::os::unix::process::ExitStatusExt as _;
    let exit_code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1);
    Ok(pb::ExecSyncResponse {
        stdout,
        stderr,
        exit_code,
    })
}
