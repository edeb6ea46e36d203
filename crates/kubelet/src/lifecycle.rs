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

    fn pod() -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("uid".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn runtime() -> RuntimeClient {
        crate::cri::connect(
            "unix:///nonexistent/nodus-test.sock",
            Duration::from_secs(1),
        )
        .map(|r| r.runtime)
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn container() -> Container {
        Container {
            name: "c".into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn http_hook_reaches_the_pod_and_ignores_the_status_code() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let app = axum::Router::new().route(
            "/pre-stop",
            axum::routing::get(move |headers: axum::http::HeaderMap| {
                let h = h.clone();
                async move {
                    if headers.get("user-agent").and_then(|v| v.to_str().ok())
                        == Some("kube-lifecycle/1.33")
                    {
                        h.fetch_add(1, Ordering::SeqCst);
                    }
                    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "no")
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let handler = LifecycleHandler {
            http_get: Some(k8s_openapi::api::core::v1::HTTPGetAction {
                path: Some("/pre-stop".into()),
                port: k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(
                    port,
                )),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = run_handler(
            &runtime(),
            &pod(),
            &container(),
            "cid",
            &handler,
            Some("127.0.0.1"),
            Duration::from_secs(5),
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(hits.load(Ordering::SeqCst), 1);

        // An https hook answered in plain HTTP is retried over http, as upstream.
        let mut https = handler.clone();
        if let Some(a) = https.http_get.as_mut() {
            a.scheme = Some("HTTPS".into());
        }
        let r = run_handler(
            &runtime(),
            &pod(),
            &container(),
            "cid",
            &https,
            Some("127.0.0.1"),
            Duration::from_secs(5),
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(hits.load(Ordering::SeqCst), 2);

        // Nobody listening: the hook fails with upstream's wording.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_default();
        let mut bad = handler.clone();
        if let Some(a) = bad.http_get.as_mut() {
            a.port =
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(closed));
        }
        let err = run_handler(
            &runtime(),
            &pod(),
            &container(),
            "cid",
            &bad,
            Some("127.0.0.1"),
            Duration::from_secs(5),
        )
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert_eq!(
            err,
            format!(
                "HTTP lifecycle hook (/pre-stop) for Container \"c\" in Pod \"p_ns(uid)\" failed - error: Get \"http://127.0.0.1:{closed}/pre-stop\": dial tcp 127.0.0.1:{closed}: connect: connection refused"
            )
        );
    }

    #[tokio::test]
    async fn sleep_hook_is_cut_short_by_the_timeout() {
        let handler = |seconds| LifecycleHandler {
            sleep: Some(k8s_openapi::api::core::v1::SleepAction { seconds }),
            ..Default::default()
        };
        let ok = run_handler(
            &runtime(),
            &pod(),
            &container(),
            "cid",
            &handler(0),
            None,
            Duration::from_secs(1),
        )
        .await;
        assert!(ok.is_ok());
        let err = run_handler(
            &runtime(),
            &pod(),
            &container(),
            "cid",
            &handler(30),
            None,
            Duration::from_millis(100),
        )
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert_eq!(
            err,
            "Sleep lifecycle hook (30) for Container \"c\" in Pod \"p_ns(uid)\" failed - error: container terminated before sleep hook finished"
        );
        let invalid = run_handler(
            &runtime(),
            &pod(),
            &container(),
            "cid",
            &LifecycleHandler::default(),
            None,
            Duration::from_secs(1),
        )
        .await;
        assert!(matches!(invalid, Err(HookError::Invalid(_))));
    }
}
