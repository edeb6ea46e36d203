//! Running one CNI plugin: the CNI_* environment, the configuration on stdin, the result or
//! the CNI error JSON on stdout.

use super::CniError;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The CNI operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniCommand {
    Add,
    Del,
    Check,
}

impl CniCommand {
    /// The `CNI_COMMAND` value.
    pub fn as_env(self) -> &'static str {
        match self {
            CniCommand::Add => "ADD",
            CniCommand::Del => "DEL",
            CniCommand::Check => "CHECK",
        }
    }

    /// The word used in messages (libcni's `failed (add)`).
    pub fn as_lower(self) -> &'static str {
        match self {
            CniCommand::Add => "add",
            CniCommand::Del => "delete",
            CniCommand::Check => "check",
        }
    }
}

/// Finds a plugin binary in `dirs`, first match wins (libcni `FindInPath`).
pub fn find_plugin(plugin: &str, dirs: &[PathBuf]) -> Result<PathBuf, CniError> {
    if !plugin.contains('/') && !plugin.is_empty() {
        for dir in dirs {
            let path = dir.join(plugin);
            if path.is_file() {
                return Ok(path);
            }
        }
    }
    Err(CniError::PluginNotFound {
        plugin: plugin.to_string(),
        dirs: dirs.to_vec(),
    })
}

/// `CNI_ARGS`: `K=V` pairs joined by `;`.
pub fn format_cni_args(args: &[(String, String)]) -> String {
    args.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// The arguments Kubernetes runtimes pass (containerd, CRI-O's ocicni):
/// `IgnoreUnknown=1;K8S_POD_NAMESPACE=..;K8S_POD_NAME=..;K8S_POD_INFRA_CONTAINER_ID=..;K8S_POD_UID=..`.
/// `IgnoreUnknown` keeps plugins that parse CNI_ARGS strictly (host-local) from failing on the
/// K8S_ keys. Values may contain neither `;` nor `=`.
pub fn pod_cni_args(
    namespace: &str,
    name: &str,
    sandbox_id: &str,
    uid: &str,
) -> Result<Vec<(String, String)>, CniError> {
    let pairs = [
        ("IgnoreUnknown", "1"),
        ("K8S_POD_NAMESPACE", namespace),
        ("K8S_POD_NAME", name),
        ("K8S_POD_INFRA_CONTAINER_ID", sandbox_id),
        ("K8S_POD_UID", uid),
    ];
    pairs
        .iter()
        .map(|(k, v)| {
            if v.contains(';') || v.contains('=') {
                Err(CniError::InvalidRequest(format!(
                    "{k} {v:?} contains ';' or '=', which CNI_ARGS cannot carry"
                )))
            } else {
                Ok((k.to_string(), v.to_string()))
            }
        })
        .collect()
}

/// libcni's `ValidateContainerID`.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    let mut chars = id.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(CniError::InvalidRequest(format!(
            "invalid container id {id:?}: letters, digits, '_', '.', '-', starting with a letter or digit"
        )))
    }
}

/// Parses a failed plugin's output: the CNI error JSON `{cniVersion, code, msg, details}` on
/// stdout, else whatever it printed. Returns (code, msg, details).
pub fn parse_plugin_error(
    stdout: &[u8],
    stderr: &[u8],
    status: &str,
) -> (Option<u32>, String, String) {
    let stderr_text = String::from_utf8_lossy(stderr).trim().to_string();
    if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(stdout) {
        let msg = o.get("msg").and_then(Value::as_str).unwrap_or_default();
        if !msg.is_empty() || o.contains_key("code") {
            let details = o
                .get("details")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let msg = if msg.is_empty() {
                format!("no message ({status})")
            } else {
                msg.to_string()
            };
            return (
                o.get("code")
                    .and_then(Value::as_u64)
                    .and_then(|c| u32::try_from(c).ok()),
                msg,
                details,
            );
        }
    }
    let stdout_text = String::from_utf8_lossy(stdout).trim().to_string();
    let msg = match (stdout_text.is_empty(), stderr_text.is_empty()) {
        (true, true) => format!("netplugin failed with no error message ({status})"),
        (false, _) => stdout_text,
        (true, false) => stderr_text.clone(),
    };
    let details = if msg == stderr_text {
        String::new()
    } else {
        stderr_text
    };
    (None, msg, details)
}

/// One plugin call.
pub(crate) struct Invocation<'a> {
    pub command: CniCommand,
    pub container_id: &'a str,
    pub netns: &'a str,
    pub ifname: &'a str,
    pub cni_args: &'a str,
    pub cni_path: &'a str,
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs `bin` with the invocation's environment and `stdin`; returns its stdout on success.
/// The plugin is killed when `timeout` passes.
pub(crate) async fn exec_plugin(
    bin: &Path,
    plugin: &str,
    network: &str,
    inv: &Invocation<'_>,
    stdin: Vec<u8>,
    timeout: Duration,
) -> Result<Vec<u8>, CniError> {
    let command = inv.command.as_lower();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env("CNI_COMMAND", inv.command.as_env())
        .env("CNI_CONTAINERID", inv.container_id)
        .env("CNI_NETNS", inv.netns)
        .env("CNI_IFNAME", inv.ifname)
        .env("CNI_ARGS", inv.cni_args)
        .env("CNI_PATH", inv.cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Plugins look up iptables, ip6tables, conntrack on PATH.
    if std::env::var_os("PATH").is_none() {
        cmd.env("PATH", DEFAULT_PATH);
    }
    let started = std::time::Instant::now();
    let mut child = cmd.spawn().map_err(|source| CniError::Exec {
        plugin: plugin.into(),
        network: network.into(),
        command,
        source,
    })?;
    let pipe = child.stdin.take();
    let write = async move {
        if let Some(mut pipe) = pipe {
            // A plugin may exit without reading; its exit status is what counts then.
            let _ = pipe.write_all(&stdin).await;
            let _ = pipe.shutdown().await;
        }
    };
    let run = async {
        let ((), out) = tokio::join!(write, child.wait_with_output());
        out
    };
    let output = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(o)) => o,
        Ok(Err(source)) => {
            return Err(CniError::Exec {
                plugin: plugin.into(),
                network: network.into(),
                command,
                source,
            });
        }
        Err(_) => {
            return Err(CniError::Timeout {
                plugin: plugin.into(),
                network: network.into(),
                command,
                timeout,
            });
        }
    };
    tracing::debug!(
        plugin,
        network,
        command = inv.command.as_env(),
        container_id = inv.container_id,
        ifname = inv.ifname,
        status = %output.status,
        elapsed_ms = started.elapsed().as_millis() as u64,
        stderr = %String::from_utf8_lossy(&output.stderr).trim(),
        "ran CNI plugin"
    );
    if output.status.success() {
        return Ok(output.stdout);
    }
    let (code, msg, details) =
        parse_plugin_error(&output.stdout, &output.stderr, &output.status.to_string());
    Err(CniError::Plugin {
        plugin: plugin.into(),
        network: network.into(),
        command,
        code,
        msg,
        details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_cni_args_format_like_containerd_and_ocicni() {
        let args = pod_cni_args("kube-system", "coredns-abc", "0123abcd", "uid-1").unwrap();
        assert_eq!(
            format_cni_args(&args),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-abc;\
             K8S_POD_INFRA_CONTAINER_ID=0123abcd;K8S_POD_UID=uid-1"
        );
        let err = pod_cni_args("ns", "a;b", "id", "u")
            .unwrap_err()
            .to_string();
        assert!(err.contains("K8S_POD_NAME \"a;b\""), "{err}");
        assert!(pod_cni_args("ns", "a=b", "id", "u").is_err());
        validate_container_id("abc-1.2_3").unwrap();
        for bad in ["", "-a", "a/b", "a b", "../x"] {
            assert!(validate_container_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sandbox_cni_error_json_and_plain_output() {
        let (code, msg, details) = parse_plugin_error(
            br#"{"cniVersion":"1.0.0","code":11,"msg":"failed to allocate for range 0","details":"no IP addresses available in range set: 10.0.0.2-10.0.0.2"}"#,
            b"",
            "exit status: 1",
        );
        assert_eq!(code, Some(11));
        assert_eq!(msg, "failed to allocate for range 0");
        assert!(details.starts_with("no IP addresses available"));
        let e = CniError::Plugin {
            plugin: "bridge".into(),
            network: "nodus".into(),
            command: "add",
            code,
            msg,
            details,
        };
        assert_eq!(
            e.to_string(),
            "plugin type=\"bridge\" name=\"nodus\" failed (add): failed to allocate for range 0; \
             no IP addresses available in range set: 10.0.0.2-10.0.0.2 (CNI error code 11)"
        );
        assert!(!e.is_not_found());

        let (code, msg, details) = parse_plugin_error(b"", b"panic: boom\n", "exit status: 2");
        assert_eq!(
            (code, msg.as_str(), details.as_str()),
            (None, "panic: boom", "")
        );
        let (_, msg, details) = parse_plugin_error(b"garbage", b"oops", "exit status: 1");
        assert_eq!((msg.as_str(), details.as_str()), ("garbage", "oops"));
        let (_, msg, _) = parse_plugin_error(b"", b"", "exit status: 3");
        assert_eq!(
            msg,
            "netplugin failed with no error message (exit status: 3)"
        );
        let (code, msg, _) = parse_plugin_error(br#"{"code":7}"#, b"", "exit status: 1");
        assert_eq!(
            (code, msg.as_str()),
            (Some(7), "no message (exit status: 1)")
        );

        let nf = CniError::Plugin {
            plugin: "portmap".into(),
            network: "n".into(),
            command: "delete",
            code: None,
            msg: "chain CNI-DN-xyz not found".into(),
            details: String::new(),
        };
        assert!(nf.is_not_found());
    }

    #[test]
    fn sandbox_cni_find_plugin_searches_dirs_in_order() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(b.path().join("bridge"), "").unwrap();
        std::fs::write(a.path().join("bridge"), "").unwrap();
        std::fs::write(b.path().join("portmap"), "").unwrap();
        let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
        assert_eq!(
            find_plugin("bridge", &dirs).unwrap(),
            a.path().join("bridge")
        );
        assert_eq!(
            find_plugin("portmap", &dirs).unwrap(),
            b.path().join("portmap")
        );
        let err = find_plugin("flannel", &dirs).unwrap_err().to_string();
        assert!(
            err.starts_with("failed to find plugin \"flannel\" in path"),
            "{err}"
        );
        assert!(find_plugin("../bridge", &dirs).is_err());
    }
}
