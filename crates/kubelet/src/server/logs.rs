//! `/containerLogs/{namespace}/{pod}/{container}`: a container's log as the runtime wrote it
//! in the CRI log format (`<RFC3339Nano time> <stdout|stderr> <P|F> <text>` per line, `P`
//! for a fragment of a longer line), decoded with upstream's options: `tailLines`,
//! `sinceSeconds`/`sinceTime`, `timestamps`, `limitBytes`, `previous` and `follow`
//! (upstream's pkg/kubelet/kuberuntime/logs).

use super::{ServerState, text};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

/// One decoded log record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub timestamp: &'a str,
    pub stream: &'a str,
    pub partial: bool,
    pub text: &'a [u8],
}

/// Decodes one CRI log line (without its newline). Lines not in the format are `None`.
pub fn parse_line(line: &[u8]) -> Option<Record<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let timestamp = std::str::from_utf8(parts.next()?).ok()?;
    let stream = std::str::from_utf8(parts.next()?).ok()?;
    if stream != "stdout" && stream != "stderr" {
        return None;
    }
    let tag = parts.next()?;
    let (partial, text) = match tag {
        b"P" => (true, parts.next().unwrap_or_default()),
        b"F" => (false, parts.next().unwrap_or_default()),
        // The pre-tag format: everything after the stream is the text.
        _ => {
            let start = timestamp.len() + stream.len() + 2;
            (false, line.get(start..).unwrap_or_default())
        }
    };
    Some(Record {
        timestamp,
        stream,
        partial,
        text,
    })
}

/// Seconds since the epoch of an RFC 3339 timestamp.
fn epoch_nanos(ts: &str) -> Option<i128> {
    ts.parse::<jiff::Timestamp>()
        .ok()
        .map(|t| t.as_nanosecond())
}

/// What the client asked for.
#[derive(Clone, Debug, Default)]
pub struct LogOptions {
    pub tail_lines: Option<usize>,
    /// Only records at or after this time (nanoseconds since the epoch).
    pub since_nanos: Option<i128>,
    pub timestamps: bool,
    pub limit_bytes: Option<usize>,
    pub follow: bool,
    pub previous: bool,
}

fn bool_param(q: &HashMap<String, String>, k: &str) -> bool {
    nodus_serving::query::bool_value(q.get(k).map(String::as_str))
}

/// Upstream's query parsing and ValidatePodLogOptions, with its messages.
/// Why the query was refused: upstream answers 400 for what does not decode and 422 for
/// what fails ValidatePodLogOptions, each with a fixed JSON message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("{0}")]
    Decode(String),
    #[error("{0}")]
    Invalid(String),
}

pub fn parse_options(q: &HashMap<String, String>) -> Result<LogOptions, OptionsError> {
    // The legacy `tail` parameter (`all` means no limit).
    let mut q = q.clone();
    if let Some(t) = q.get("tail").cloned().filter(|t| !t.is_empty()) {
        if t == "all" {
            q.remove("tailLines");
        } else {
            q.insert("tailLines".into(), t);
        }
    }
    let q = &q;
    let int = |k: &str| -> Result<Option<i64>, OptionsError> {
        match q.get(k).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                OptionsError::Decode(format!("{k}: invalid value {v:?}: must be an integer"))
            }),
        }
    };
    let invalid = |m: &str| Err(OptionsError::Invalid(m.to_string()));
    let mut o = LogOptions {
        timestamps: bool_param(q, "timestamps"),
        follow: bool_param(q, "follow"),
        previous: bool_param(q, "previous"),
        ..Default::default()
    };
    if let Some(n) = int("tailLines")? {
        if n < 0 {
            return invalid("tailLines: Invalid value: must be greater than or equal to 0");
        }
        o.tail_lines = Some(n as usize);
    }
    if let Some(n) = int("limitBytes")? {
        if n < 1 {
            return invalid("limitBytes: Invalid value: must be greater than 0");
        }
        o.limit_bytes = Some(n as usize);
    }
    let since_seconds = int("sinceSeconds")?;
    let since_time = q.get("sinceTime").filter(|v| !v.is_empty());
    if since_seconds.is_some() && since_time.is_some() {
        return invalid("at most one of `sinceTime` or `sinceSeconds` may be specified");
    }
    if let Some(s) = since_seconds {
        if s < 1 {
            return invalid("sinceSeconds: Invalid value: must be greater than 0");
        }
        let now = jiff::Timestamp::now().as_nanosecond();
        o.since_nanos = Some(now - i128::from(s) * 1_000_000_000);
    }
    if let Some(t) = since_time {
        o.since_nanos = Some(epoch_nanos(t).ok_or_else(|| {
            OptionsError::Decode(format!("sinceTime: invalid time {t:?}: use RFC 3339"))
        })?);
    }
    Ok(o)
}

/// Renders decoded log text from `data` (whole lines only; a trailing incomplete line is
/// left for the caller): returns the output and how many bytes of `data` were consumed.
/// `at_line_start` carries across calls whether the next record begins a new line.
pub fn render(
    data: &[u8],
    opts: &LogOptions,
    at_line_start: &mut bool,
    out: &mut Vec<u8>,
) -> usize {
    let mut consumed = 0;
    for line in data.split_inclusive(|b| *b == b'\n') {
        if line.last() != Some(&b'\n') {
            break;
        }
        consumed += line.len();
        let Some(r) = parse_line(&line[..line.len() - 1]) else {
            continue;
        };
        if let Some(since) = opts.since_nanos
            && epoch_nanos(r.timestamp).is_some_and(|t| t < since)
        {
            continue;
        }
        if opts.timestamps && *at_line_start {
            out.extend_from_slice(r.timestamp.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(r.text);
        if r.partial {
            *at_line_start = false;
        } else {
            out.push(b'\n');
            *at_line_start = true;
        }
    }
    consumed
}

/// The byte offset in `data` where the last `n` full log lines begin (a line that spans
/// `P` records counts once; `P` records after the last full line come with it).
pub fn tail_offset(data: &[u8], n: usize) -> usize {
    let mut full_ends = Vec::new();
    let mut pos = 0;
    for line in data.split_inclusive(|b| *b == b'\n') {
        pos += line.len();
        if line.last() == Some(&b'\n')
            && parse_line(&line[..line.len() - 1]).is_some_and(|r| !r.partial)
        {
            full_ends.push(pos);
        }
    }
    if full_ends.len() <= n {
        0
    } else {
        full_ends[full_ends.len() - n - 1]
    }
}

fn not_found(msg: String) -> Response {
    text(StatusCode::NOT_FOUND, msg)
}

fn bad_request(msg: String) -> Response {
    text(StatusCode::BAD_REQUEST, msg)
}

/// Finds the pod the kubelet runs by namespace and name.
pub fn find_pod(s: &ServerState, ns: &str, name: &str) -> Option<Pod> {
    s.pods
        .all()
        .into_iter()
        .find(|p| {
            p.metadata.namespace.as_deref().unwrap_or("default") == ns
                && p.metadata.name.as_deref() == Some(name)
        })
        .map(|p| Pod::clone(&p))
}

/// The container id (bare) whose log the request means, chosen and refused exactly as
/// upstream's validateContainerLogStatus does.
fn log_container_id(
    s: &ServerState,
    pod: &Pod,
    container: &str,
    previous: bool,
) -> Result<String, String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let status = s.status.get(&uid).unwrap_or_default();
    let cs = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .chain(status.ephemeral_container_statuses.iter().flatten())
        .find(|c| c.name == container)
        .cloned()
        .ok_or_else(|| format!("container {container:?} in pod {name:?} is not available"))?;
    let nonempty = |id: Option<&String>| id.filter(|i| !i.is_empty()).cloned();
    let last = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let last_id = nonempty(last.and_then(|t| t.container_id.as_ref()));
    let state = cs.state.clone().unwrap_or_default();
    let terminated_msg = || format!("container {container:?} in pod {name:?} is terminated");
    let id = if previous {
        last_id.ok_or_else(|| {
            format!("previous terminated container {container:?} in pod {name:?} not found")
        })?
    } else if state.running.is_some() {
        nonempty(cs.container_id.as_ref()).unwrap_or_default()
    } else if let Some(t) = &state.terminated {
        nonempty(t.container_id.as_ref())
            .or(last_id)
            .ok_or_else(terminated_msg)?
    } else if last.is_some() {
        last_id.ok_or_else(terminated_msg)?
    } else if let Some(w) = &state.waiting {
        let why = match w.reason.as_deref().unwrap_or_default() {
            "ErrImagePull" => "image can't be pulled".to_string(),
            "ImagePullBackOff" => "trying and failing to pull image".to_string(),
            other => other.to_string(),
        };
        return Err(format!(
            "container {container:?} in pod {name:?} is waiting to start: {why}"
        ));
    } else {
        return Err(format!(
            "container {container:?} in pod {name:?} is waiting to start - no logs yet"
        ));
    };
    Ok(crate::cri::bare_container_id(&id).to_string())
}

/// GET /containerLogs/{namespace}/{pod}/{container}
pub async fn container_logs(
    State(s): State<ServerState>,
    Path((ns, pod_name, container)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let opts = match parse_options(&q) {
        Ok(o) => o,
        Err(e) => {
            tracing::debug!(pod = %pod_name, error = %e, "container log request refused");
            return match e {
                OptionsError::Decode(_) => {
                    bad_request(r#"{"message": "Unable to decode query."}"#.into())
                }
                OptionsError::Invalid(_) => text(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    r#"{"message": "Invalid request."}"#.into(),
                ),
            };
        }
    };
    let Some(pod) = find_pod(&s, &ns, &pod_name) else {
        return not_found(format!("pod {pod_name:?} does not exist"));
    };
    // Split streams are upstream's alpha PodLogsQuerySplitStreams, off by default.
    if let Some(stream) = q.get("stream").filter(|v| !v.is_empty() && *v != "All") {
        return bad_request(format!(
            "unable to return the given log stream: {stream:?}. Please enable PodLogsQuerySplitStreams feature gate in kubelet"
        ));
    }
    let in_spec = pod.spec.as_ref().is_some_and(|sp| {
        sp.containers
            .iter()
            .chain(sp.init_containers.iter().flatten())
            .any(|c| c.name == container)
            || sp
                .ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
    });
    if !in_spec {
        return not_found(format!(
            "container {container:?} not found in pod {pod_name:?}"
        ));
    }
    let id = match log_container_id(&s, &pod, &container, opts.previous) {
        Ok(id) => id,
        Err(e) => return bad_request(e),
    };
    let st = match s
        .kr
        .rt
        .runtime
        .clone()
        .container_status(cri::runtime::v1::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await
    {
        Ok(r) => r.into_inner().status.unwrap_or_default(),
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("failed to get container status {id:?}: {}", e.message()),
            );
        }
    };
    let path = std::path::PathBuf::from(&st.log_path);
    let running = st.state == cri::runtime::v1::ContainerState::ContainerRunning as i32;
    let follow = opts.follow && running;
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("failed to open log file {:?}: {e}", path.display()),
            );
        }
    };
    let mut data = Vec::new();
    if let Err(e) = file.read_to_end(&mut data) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to read log file {:?}: {e}", path.display()),
        );
    }
    let start = opts.tail_lines.map_or(0, |n| tail_offset(&data, n));
    let mut out = Vec::new();
    let mut at_start = true;
    let used = render(&data[start..], &opts, &mut at_start, &mut out);
    let mut remaining = opts.limit_bytes;
    if let Some(l) = remaining {
        out.truncate(l);
        remaining = Some(l - out.len());
    }
    if !follow || remaining == Some(0) {
        return (
            [(http::header::CONTENT_TYPE, "text/plain")],
            Body::from(out),
        )
            .into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(16);
    let offset = (start + used) as u64;
    let rt = s.kr.rt.runtime.clone();
    tokio::spawn(async move {
        if tx.send(Ok(bytes::Bytes::from(out))).await.is_err() {
            return;
        }
        follow_file(path, offset, opts, at_start, remaining, id, rt, tx).await;
    });
    (
        [(http::header::CONTENT_TYPE, "text/plain")],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response()
}

/// Streams what is appended to the log from `offset` until the container stops (checked
/// every second, as upstream's follow does) or the client goes away.
#[allow(clippy::too_many_arguments)]
async fn follow_file(
    path: std::path::PathBuf,
    mut offset: u64,
    opts: LogOptions,
    mut at_start: bool,
    mut remaining: Option<usize>,
    id: String,
    rt: crate::cri::RuntimeClient,
    tx: tokio::sync::mpsc::Sender<Result<bytes::Bytes, std::io::Error>>,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut last_check = std::time::Instant::now();
    let mut stopped = false;
    loop {
        let mut chunk = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&path) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            // A rotated (truncated) log starts over.
            if len < offset {
                offset = 0;
                pending.clear();
            }
            if f.seek(SeekFrom::Start(offset)).is_ok() {
                let _ = f.read_to_end(&mut chunk);
            }
        }
        offset += chunk.len() as u64;
        pending.extend_from_slice(&chunk);
        let mut out = Vec::new();
        let used = render(&pending, &opts, &mut at_start, &mut out);
        pending.drain(..used);
        if let Some(r) = remaining.as_mut() {
            out.truncate(*r);
            *r -= out.len();
        }
        if !out.is_empty() && tx.send(Ok(bytes::Bytes::from(out))).await.is_err() {
            return;
        }
        if remaining == Some(0) || (stopped && chunk.is_empty()) {
            return;
        }
        if tx.is_closed() {
            return;
        }
        if last_check.elapsed() >= Duration::from_secs(1) {
            last_check = std::time::Instant::now();
            let running = rt
                .clone()
                .container_status(cri::runtime::v1::ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().status)
                .is_some_and(|s| {
                    s.state == cri::runtime::v1::ContainerState::ContainerRunning as i32
                });
            // One more read after the container stopped picks up its last words.
            stopped = !running;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-01-01T00:00:01.5Z stdout F one\n\
2026-01-01T00:00:02Z stderr P tw\n\
2026-01-01T00:00:02.1Z stderr F o\n\
2026-01-01T00:00:03Z stdout F three\n\
2026-01-01T00:00:04Z stdout F fo";

    fn run(opts: &LogOptions, data: &[u8]) -> String {
        let mut out = Vec::new();
        let mut at = true;
        render(data, opts, &mut at, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn decodes_cri_lines_joining_partials() {
        let o = LogOptions::default();
        assert_eq!(run(&o, LOG.as_bytes()), "one\ntwo\nthree\n");
        let o = LogOptions {
            timestamps: true,
            ..Default::default()
        };
        assert_eq!(
            run(&o, LOG.as_bytes()),
            "2026-01-01T00:00:01.5Z one\n2026-01-01T00:00:02Z two\n2026-01-01T00:00:03Z three\n"
        );
    }

    #[test]
    fn tail_counts_whole_lines() {
        let d = LOG.as_bytes();
        let o = LogOptions::default();
        assert_eq!(run(&o, &d[tail_offset(d, 1)..]), "three\n");
        assert_eq!(run(&o, &d[tail_offset(d, 2)..]), "two\nthree\n");
        assert_eq!(run(&o, &d[tail_offset(d, 10)..]), "one\ntwo\nthree\n");
        assert_eq!(run(&o, &d[tail_offset(d, 0)..]), "");
    }

    #[test]
    fn since_time_filters_and_options_validate() {
        let q: HashMap<String, String> = [(
            "sinceTime".to_string(),
            "2026-01-01T00:00:02.05Z".to_string(),
        )]
        .into();
        let o = parse_options(&q).unwrap();
        assert_eq!(run(&o, LOG.as_bytes()), "o\nthree\n");
        let q: HashMap<String, String> = [
            ("sinceTime".to_string(), "2026-01-01T00:00:02Z".to_string()),
            ("sinceSeconds".to_string(), "5".to_string()),
        ]
        .into();
        assert!(
            matches!(parse_options(&q), Err(OptionsError::Invalid(m)) if m.contains("at most one"))
        );
        let q: HashMap<String, String> = [("tailLines".to_string(), "-1".to_string())].into();
        assert!(matches!(parse_options(&q), Err(OptionsError::Invalid(_))));
        let q: HashMap<String, String> = [("tailLines".to_string(), "x".to_string())].into();
        assert!(matches!(parse_options(&q), Err(OptionsError::Decode(_))));
        let q: HashMap<String, String> = [("tail".to_string(), "2".to_string())].into();
        assert_eq!(parse_options(&q).unwrap().tail_lines, Some(2));
        let q: HashMap<String, String> = [
            ("tail".to_string(), "all".to_string()),
            ("tailLines".to_string(), "2".to_string()),
        ]
        .into();
        assert_eq!(parse_options(&q).unwrap().tail_lines, None);
    }
}
