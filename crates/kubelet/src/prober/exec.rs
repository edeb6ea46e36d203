//! The exec handler: runs a command in the container through the CRI `ExecSync` call
//! (upstream's `pkg/probe/exec` over the runtime's `RunInContainer`).

use super::handler::{HandlerResult, Outcome};
use crate::cri::RuntimeClient;
use cri::runtime::v1::ExecSyncRequest;
use std::time::Duration;

/// Upstream keeps at most this much of an exec probe's output.
pub const MAX_OUTPUT: usize = 10 << 10;

/// The CRI client adds this to the command's own timeout before giving up on the runtime
/// (upstream's `r.timeout + timeout` in `ExecSync`).
const RUNTIME_GRACE: Duration = Duration::from_secs(120);

/// Why an `ExecSync` did not give an exit code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecError {
    /// The command outlived its timeout (upstream's `exec.TimeoutError`).
    #[error("command {0:?} timed out")]
    Timeout(String),
    #[error("{0}")]
    Runtime(String),
}

/// What a finished command left behind.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
}

/// Runs `cmd` in `container_id` (bare or `runtime://` prefixed). A zero `timeout` means
/// none, as in the CRI.
pub async fn exec_sync(
    runtime: &RuntimeClient,
    container_id: &str,
    cmd: &[String],
    timeout: Duration,
) -> Result<ExecOutput, ExecError> {
    let req = ExecSyncRequest {
        container_id: crate::cri::bare_container_id(container_id).to_string(),
        cmd: cmd.to_vec(),
        // Rounded up: a sub-second remainder must not turn into 0, which means no timeout.
        timeout: timeout.as_secs_f64().ceil() as i64,
    };
    let mut client = runtime.clone();
    let call = client.exec_sync(req);
    let joined = cmd.join(" ");
    let resp = if timeout.is_zero() {
        call.await
    } else {
        match tokio::time::timeout(timeout + RUNTIME_GRACE, call).await {
            Ok(r) => r,
            Err(_) => return Err(ExecError::Timeout(joined)),
        }
    };
    match resp {
        Ok(r) => {
            let r = r.into_inner();
            Ok(ExecOutput {
                stdout: r.stdout,
                stderr: r.stderr,
                exit_code: r.exit_code,
            })
        }
        // Runtimes report a command that outlived its timeout as DeadlineExceeded.
        Err(s) if s.code() == tonic::Code::DeadlineExceeded => Err(ExecError::Timeout(joined)),
        Err(s) => Err(ExecError::Runtime(format!(
            "rpc error: code = {:?} desc = {}",
            s.code(),
            s.message()
        ))),
    }
}

/// An exec probe: exit code 0 is success, anything else failure with the command's
/// output; a timeout is a failure (upstream ≥ 1.20, ExecProbeTimeout); a runtime error is
/// an error.
pub async fn probe(
    runtime: &RuntimeClient,
    container_id: &str,
    cmd: &[String],
    timeout: Duration,
) -> Result<HandlerResult, String> {
    match exec_sync(runtime, container_id, cmd, timeout).await {
        Ok(out) => {
            let mut data = out.stdout;
            data.extend_from_slice(&out.stderr);
            data.truncate(MAX_OUTPUT);
            let text = String::from_utf8_lossy(&data).into_owned();
            let outcome = if out.exit_code == 0 {
                Outcome::Success
            } else {
                Outcome::Failure
            };
            Ok(HandlerResult::new(outcome, text))
        }
        Err(e @ ExecError::Timeout(_)) => Ok(HandlerResult::new(Outcome::Failure, e.to_string())),
        Err(ExecError::Runtime(e)) => Err(e),
    }
}
