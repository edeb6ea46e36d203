//! The tcpSocket handler (upstream's `pkg/probe/tcp`): success when a TCP connection opens
//! within the timeout; the connection is closed right away.

use super::handler::{HandlerResult, Outcome, go_dial_error, join_host_port};
use std::time::Duration;

/// Connects to `host:port` within `timeout`. Never an error: a refused or timed-out
/// connection is a failure whose text reads like Go's dial error.
pub async fn probe(host: &str, port: u16, timeout: Duration) -> HandlerResult {
    let addr = join_host_port(host, port);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(stream)) => {
            drop(stream);
            HandlerResult::new(Outcome::Success, "")
        }
        Ok(Err(e)) => HandlerResult::new(Outcome::Failure, go_dial_error(&addr, &e)),
        Err(_) => HandlerResult::new(Outcome::Failure, format!("dial tcp {addr}: i/o timeout")),
    }
}
