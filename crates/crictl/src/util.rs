//! Helpers shared by the pod, container, log, stats and event commands.

use crate::CrictlError;
use regex::Regex;
use std::collections::HashMap;

pub fn io(e: std::io::Error) -> CrictlError {
    CrictlError::Other(format!("writing output: {e}"))
}

/// crictl's `parseLabelStringSlice`: each `--label` is exactly `key=value`.
pub fn parse_labels(labels: &[String]) -> Result<HashMap<String, String>, CrictlError> {
    let mut out = HashMap::new();
    for l in labels {
        let parts: Vec<&str> = l.split('=').collect();
        if parts.len() != 2 {
            return Err(CrictlError::Usage(format!(
                "incorrectly specified label: {l}"
            )));
        }
        out.insert(parts[0].to_string(), parts[1].to_string());
    }
    Ok(out)
}

/// An optional `--name`/`--namespace` regular expression.
pub fn compile(pattern: Option<&str>) -> Result<Option<Regex>, CrictlError> {
    match pattern {
        None | Some("") => Ok(None),
        Some(p) => Regex::new(p).map(Some).map_err(|e| {
            // The crate's message ends with the reason on a line of its own.
            let e = e.to_string();
            let reason = e.lines().last().unwrap_or_default();
            let reason = reason.strip_prefix("error: ").unwrap_or(reason);
            CrictlError::Usage(format!("invalid regular expression {p:?}: {reason}"))
        }),
    }
}

pub fn matches(re: &Option<Regex>, s: &str) -> bool {
    re.as_ref().is_none_or(|r| r.is_match(s))
}

/// crictl's `--latest`/`--last N` cut of a list sorted newest first.
pub fn truncate_count<T>(items: &mut Vec<T>, latest: bool, last: usize) {
    let mut n = items.len();
    if latest {
        n = 1;
    }
    if last > 0 {
        n = last;
    }
    items.truncate(n);
}

/// Go's `strings.Join` of errors from concurrent removals (`errors.Join`).
pub fn aggregate(errors: Vec<String>) -> Result<(), CrictlError> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(CrictlError::Other(errors.join("\n")))
    }
}

/// Runs `fut` under crictl's `--cancel-timeout` (no limit when absent or zero).
pub async fn with_timeout<T>(
    timeout: Option<std::time::Duration>,
    fut: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match timeout.filter(|d| !d.is_zero()) {
        None => fut.await,
        Some(d) => match tokio::time::timeout(d, fut).await {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(
                "context deadline exceeded",
            )),
        },
    }
}

/// The RPC error text crictl shows after its own context.
pub fn rpc_text(s: tonic::Status) -> String {
    crate::RpcError(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_must_be_key_value() {
        let l = parse_labels(&["app=web".into(), "tier=".into()]).unwrap();
        assert_eq!(l["app"], "web");
        assert_eq!(l["tier"], "");
        assert!(parse_labels(&["app".into()]).is_err());
        assert!(parse_labels(&["a=b=c".into()]).is_err());
    }

    #[test]
    fn name_filters_search_like_go_regexp() {
        let is = |p: &str, s: &str| matches(&compile(Some(p)).unwrap(), s);
        assert!(is("web", "my-web-pod"));
        assert!(!is("^web$", "my-web-pod"));
        assert!(is("^(web|db)-[0-9]+$", "db-42"));
        assert!(is("^kube-.*$", "kube-system"));
        assert!(matches(&compile(Some("")).unwrap(), "anything"));
        assert!(matches(&compile(None).unwrap(), "anything"));
        for bad in ["(", "a)", "*a", "[a", r"\q", "[z-a]"] {
            let Err(CrictlError::Usage(e)) = compile(Some(bad)) else {
                panic!("{bad} should be rejected");
            };
            assert!(e.starts_with("invalid regular expression"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn latest_and_last_cut_the_list() {
        let mut v = vec![1, 2, 3];
        truncate_count(&mut v, false, 0);
        assert_eq!(v, [1, 2, 3]);
        truncate_count(&mut v, true, 0);
        assert_eq!(v, [1]);
        let mut v = vec![1, 2, 3];
        truncate_count(&mut v, true, 2);
        assert_eq!(v, [1, 2]);
        let mut v = vec![1];
        truncate_count(&mut v, false, 5);
        assert_eq!(v, [1]);
    }
}
