//! Container lifecycle hooks: postStart and preStop (upstream's
//! `pkg/kubelet/lifecycle/handlers.go`). Exec hooks run through the CRI `ExecSync`, httpGet
//! hooks through the prober's HTTP client, sleep hooks on a timer; all within the timeout
//! the caller gives (for preStop, what is left of the grace period).

use crate::config::format_pod;
use crate::cri::RuntimeClient;
use crate::prober::exec::{ExecError, exec_sync};
use crate::prober::http::{HttpProber, Purpose, build_request};
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use std::sync::OnceLock;
use std::time::Duration;

/// A hook that failed, worded as upstream's event message.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(
        "Exec lifecycle hook ([{}]) for Container {container:?} in Pod {pod:?} failed - error: {error}, message: {message:?}",
        .command.join(" ")
    )]
    Exec {
        command: Vec<String>,
        container: String,
        pod: String,
        error: String,
        message: String,
    },
    #[error(
        "HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - error: {error}"
    )]
    Http {
        path: String,
        container: String,
        pod: String,
        error: String,
    },
    #[error(
        "Sleep lifecycle hook ({seconds}) for Container {container:?} in Pod {pod:?} failed - error: {error}"
    )]
    Sleep {
        seconds: i64,
        container: String,
        pod: String,
        error: String,
    },
    #[error("Cannot run handler: invalid handler: {0}")]
    Invalid(String),
}

fn http_client() -> Result<&'static HttpProber, String> {
    static CLIENT: OnceLock<Result<HttpProber, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| HttpProber::new().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs one lifecycle handler for a container within `timeout`.
pub async fn run_handler(
    runtime: &RuntimeClient,
    pod: &Pod,
    container: &Container,
    container_id: &str,
    handler: &LifecycleHandler,
    pod_ip: Option<&str>,
    timeout: Duration,
) -> Result<(), HookError> {
    let pod_name = format_pod(pod);
    if let Some(exec) = handler.exec.as_ref() {
        let command = exec.command.clone().unwrap_or_default();
        let fail = |error: String, message: String| HookError::Exec {
            command: command.clone(),
            container: container.name.clone(),
            pod: pod_name.clone(),
            error,
            message,
        };
        let res = match exec_sync(runtime, container_id, &command, timeout).await {
            Ok(out) => out,
            Err(e @ ExecError::Timeout(_)) => return Err(fail(e.to_string(), String::new())),
            Err(ExecError::Runtime(e)) => return Err(fail(e, String::new())),
        };
        if res.exit_code != 0 {
            let stderr = String::from_utf8_lossy(&res.stderr).into_owned();
            let mut output = res.stdout.clone();
            output.extend_from_slice(&res.stderr);
            let err = fail(
                format!(
                    "command '{}' exited with {}: {stderr}",
                    command.join(" "),
                    res.exit_code
                ),
                String::from_utf8_lossy(&output).into_owned(),
            );
            tracing::warn!(pod = %pod_name, container = %container.name, "{err}");
            return Err(err);
        }
        return Ok(());
    }
    if let Some(action) = handler.http_get.as_ref() {
        let path = action.path.clone().unwrap_or_default();
        let fail = |error: String| HookError::Http {
            path: path.clone(),
            container: container.name.clone(),
            pod: pod_name.clone(),
            error,
        };
        let host_given = action.host.as_deref().is_some_and(|h| !h.is_empty());
        let ip = pod_ip.unwrap_or_default();
        if !host_given && ip.is_empty() {
            return Err(fail(
                "failed to find networking container: the pod has no IP".to_string(),
            ));
        }
        let client = http_client().map_err(&fail)?;
        let req = build_request(action, container, ip, Purpose::Lifecycle).map_err(&fail)?;
        if let Err(e) = client.hook(&req, timeout).await {
            let err = fail(e);
            tracing::warn!(pod = %pod_name, container = %container.name, "{err}");
            return Err(err);
        }
        return Ok(());
    }
    if let Some(sleep) = handler.sleep.as_ref() {
        let wanted = Duration::from_secs(sleep.seconds.max(0) as u64);
        if wanted > timeout {
            // The grace period ends first: upstream's context is cancelled mid-sleep.
            tokio::time::sleep(timeout).await;
            return Err(HookError::Sleep {
                seconds: sleep.seconds,
                container: container.name.clone(),
                pod: pod_name,
                error: "container terminated before sleep hook finished".to_string(),
            });
        }
        tokio::time::sleep(wanted).await;
        return Ok(());
    }
    Err(HookError::Invalid(format!("{handler:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_error_reads_like_upstream() {
        let e = HookError::Exec {
            command: vec!["/bin/false".into()],
            container: "c".into(),
            pod: "p_ns(uid)".into(),
            error: "command '/bin/false' exited with 1: ".into(),
            message: String::new(),
        };
        assert_eq!(
            e.to_string(),
            "Exec lifecycle hook ([/bin/false]) for Container \"c\" in Pod \"p_ns(uid)\" failed - error: command '/bin/false' exited with 1: , message: \"\""
        );
    }
}
