//! The grpc handler (upstream's `pkg/probe/grpc`): calls `grpc.health.v1.Health/Check`
//! over plain-text HTTP/2; `SERVING` is success.

use super::handler::{HandlerResult, Outcome, go_duration, join_host_port};
use std::time::Duration;

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    #[prost(enumeration = "ServingStatus", tag = "1")]
    pub status: i32,
}

/// `grpc.health.v1.HealthCheckResponse.ServingStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ServingStatus {
    Unknown = 0,
    Serving = 1,
    NotServing = 2,
    ServiceUnknown = 3,
}

impl ServingStatus {
    /// The enum value's name in the proto, as Go's `String()` prints it.
    pub fn proto_name(self) -> &'static str {
        match self {
            ServingStatus::Unknown => "UNKNOWN",
            ServingStatus::Serving => "SERVING",
            ServingStatus::NotServing => "NOT_SERVING",
            ServingStatus::ServiceUnknown => "SERVICE_UNKNOWN",
        }
    }
}

/// One health check of `service` at `host:port` within `timeout`. Never an error: every
/// problem is a failure with upstream's wording.
pub async fn probe(host: &str, port: u16, service: &str, timeout: Duration) -> HandlerResult {
    let addr = join_host_port(host, port);
    let fail = |msg: String| HandlerResult::new(Outcome::Failure, msg);
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return fail(format!("error: failed to connect service at {addr:?}: {e}")),
    };
    let endpoint = match endpoint.user_agent(format!("kube-probe/{}", super::http::KUBE_VERSION)) {
        Ok(e) => e,
        Err(e) => return fail(format!("error: failed to connect service at {addr:?}: {e}")),
    };
    // Upstream dials with WithBlock: a refused connection is retried until the timeout,
    // so a closed port reads as a connect timeout.
    let deadline = tokio::time::Instant::now() + timeout;
    let connect_timeout = || {
        fail(format!(
            "timeout: failed to connect service {addr:?} within {}: context deadline exceeded",
            go_duration(timeout)
        ))
    };
    let mut backoff = Duration::from_millis(50);
    let channel = loop {
        match tokio::time::timeout_at(deadline, endpoint.connect()).await {
            Ok(Ok(c)) => break c,
            Ok(Err(e)) => {
                tracing::trace!(addr, error = %error_chain(&e), "grpc probe connect failed, retrying");
                if tokio::time::Instant::now() + backoff >= deadline {
                    tokio::time::sleep_until(deadline).await;
                    return connect_timeout();
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(_) => return connect_timeout(),
        }
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    let call = async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path = http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check");
        grpc.unary(
            tonic::Request::new(HealthCheckRequest {
                service: service.to_string(),
            }),
            path,
            tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default(),
        )
        .await
    };
    let resp = match tokio::time::timeout_at(deadline, call).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(status)) => {
            return match status.code() {
                tonic::Code::Unimplemented => fail(format!(
                    "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                    status.message()
                )),
                tonic::Code::DeadlineExceeded => fail(format!(
                    "timeout: health rpc did not complete within {}",
                    go_duration(timeout)
                )),
                code => fail(format!(
                    "error: health rpc probe failed: rpc error: code = {code:?} desc = {}",
                    status.message()
                )),
            };
        }
        Err(_) => {
            return fail(format!(
                "timeout: health rpc did not complete within {}",
                go_duration(timeout)
            ));
        }
    };
    let status = ServingStatus::try_from(resp.status).unwrap_or(ServingStatus::Unknown);
    if status != ServingStatus::Serving {
        return fail(format!(
            "service unhealthy (responded with {:?})",
            status.proto_name()
        ));
    }
    HandlerResult::new(Outcome::Success, "service healthy")
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.join(": ")
}
