//! What every probe handler (exec, HTTP, TCP, gRPC) shares: its outcome, container port
//! resolution and Go-style rendering of network errors and durations, so that messages
//! read like upstream's.

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::time::Duration;

/// The outcome of one handler run (upstream's `probe.Result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// Counted as a success, with a message worth an event (an HTTP redirect not followed).
    Warning,
    Failure,
    Unknown,
}

/// What a handler reports: the outcome and its output (response body, command output or
/// the failure text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerResult {
    pub outcome: Outcome,
    pub output: String,
}

impl HandlerResult {
    pub fn new(outcome: Outcome, output: impl Into<String>) -> Self {
        HandlerResult {
            outcome,
            output: output.into(),
        }
    }
}

/// Upstream's `probe.ResolveContainerPort`: a number, or the name of one of the container's
/// ports, or a number written as a string.
pub fn resolve_container_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    let n: i64 = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(name) => {
            let by_name = container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| i64::from(p.container_port));
            match by_name {
                Some(n) => n,
                None => name
                    .parse::<i64>()
                    .map_err(|_| format!("port {name} not found"))?,
            }
        }
    };
    if n > 0 && n < 65536 {
        Ok(n as u16)
    } else {
        Err(format!("invalid port number: {n}"))
    }
}

/// Go's `net.JoinHostPort`: brackets around IPv6 literals.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A duration as Go's `time.Duration.String` prints whole-millisecond values: `1s`,
/// `1.5s`, `2m0s`, `1h0m0s`, `500ms`.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    let frac = ms % 1000;
    let sec_part = |s: u64| {
        if frac == 0 {
            format!("{s}s")
        } else {
            let f = format!("{frac:03}");
            format!("{s}.{}s", f.trim_end_matches('0'))
        }
    };
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{}", sec_part(s))
    } else if m > 0 {
        format!("{m}m{}", sec_part(s))
    } else {
        sec_part(s)
    }
}

/// An OS error the way Go's syscall package names it: lowercase, no "(os error N)".
pub fn go_errno_text(err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => {
            let desc = nix::errno::Errno::from_raw(code).desc();
            let mut chars = desc.chars();
            match chars.next() {
                Some(first) => first.to_lowercase().chain(chars).collect(),
                None => err.to_string(),
            }
        }
        None => err.to_string(),
    }
}

/// Go's dial error text for a failed TCP connect: `dial tcp ADDR: connect: connection
/// refused`, or `dial tcp ADDR: i/o timeout`.
pub fn go_dial_error(addr: &str, err: &std::io::Error) -> String {
    if err.kind() == std::io::ErrorKind::TimedOut {
        return format!("dial tcp {addr}: i/o timeout");
    }
    if err.raw_os_error().is_some() {
        format!("dial tcp {addr}: connect: {}", go_errno_text(err))
    } else {
        format!("dial tcp {addr}: {err}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    #[test]
    fn ports_resolve_by_number_name_or_numeric_string() {
        let c = Container {
            name: "c".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(resolve_container_port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(
            resolve_container_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(
            resolve_container_port(&IntOrString::String("9090".into()), &c),
            Ok(9090)
        );
        assert_eq!(
            resolve_container_port(&IntOrString::String("metrics".into()), &c),
            Err("port metrics not found".to_string())
        );
        assert_eq!(
            resolve_container_port(&IntOrString::Int(70000), &c),
            Err("invalid port number: 70000".to_string())
        );
    }

    #[test]
    fn durations_print_like_go() {
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_secs(120)), "2m0s");
        assert_eq!(go_duration(Duration::from_secs(3661)), "1h1m1s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn dial_errors_read_like_go() {
        let e = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(
            go_dial_error("127.0.0.1:1", &e),
            "dial tcp 127.0.0.1:1: connect: connection refused"
        );
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
    }
}
