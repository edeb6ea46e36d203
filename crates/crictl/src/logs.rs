//! `crictl logs`: reads the container's log file (its path from ContainerStatus) in the CRI
//! log format (`<RFC3339Nano> <stdout|stderr> <P|F>[:tags] <content>`, or Docker's JSON
//! lines), joins partial (`P`) records into whole lines, and writes stdout and stderr lines
//! to the matching streams. `-f` follows the file (across rotation) until the container
//! stops running.

use crate::timefmt::parse_since;
use crate::util::io;
use crate::{Clients, CrictlError, rpc};
use chrono::{DateTime, FixedOffset, Local, SecondsFormat, Utc};
use clap::Args;
use cri::runtime::v1::{ContainerState, ContainerStatusRequest, ReopenContainerLogRequest};
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

#[derive(Debug, Args, Clone)]
pub struct LogsArgs {
    #[arg(value_name = "CONTAINER-ID")]
    pub container: String,
    /// Follow log output.
    #[arg(short, long)]
    pub follow: bool,
    /// Print the logs for the previous instance of the container in a pod if it exists.
    #[arg(short, long)]
    pub previous: bool,
    /// Reopen the container logs for the provided container.
    #[arg(short, long)]
    pub reopen: bool,
    /// Number of lines to show from the end of the logs. Defaults to all.
    #[arg(long, allow_negative_numbers = true)]
    pub tail: Option<i64>,
    /// Maximum bytes of logs to return. Defaults to no limit.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub limit_bytes: i64,
    /// Show logs since timestamp (e.g. 2013-01-02T13:23:37) or relative (e.g. 42m for 42
    /// minutes).
    #[arg(long)]
    pub since: Option<String>,
    /// Show timestamps.
    #[arg(short, long)]
    pub timestamps: bool,
    /// Show specified stream (stdout or stderr). Defaults to both.
    #[arg(short, long)]
    pub stream: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line of the log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// In the zone the line was written with.
    pub ts: DateTime<FixedOffset>,
    pub stream: Stream,
    pub partial: bool,
    /// Without the record's newline.
    pub content: Vec<u8>,
}

/// A whole log line (partial records joined), stamped with its first record's time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub ts: DateTime<FixedOffset>,
    pub stream: Stream,
    pub text: Vec<u8>,
    /// False only for a trailing partial line the container has not finished.
    pub newline: bool,
}

fn parse_stream(s: &[u8]) -> Option<Stream> {
    match s {
        b"stdout" => Some(Stream::Stdout),
        b"stderr" => Some(Stream::Stderr),
        _ => None,
    }
}

/// Parses one CRI-format line (without its `\n`).
pub fn parse_cri(line: &[u8]) -> Result<Record, String> {
    let mut parts = line.splitn(4, |&b| b == b' ');
    let ts = parts.next().ok_or("timestamp is not found")?;
    let ts = std::str::from_utf8(ts).map_err(|_| "timestamp is not UTF-8")?;
    // The kubelet's `RFC3339NanoLenient`: any number of fractional digits.
    let ts = DateTime::parse_from_rfc3339(ts)
        .map_err(|_| format!("unexpected timestamp format {ts:?}"))?;
    let stream = parts.next().ok_or("stream type is not found")?;
    let stream = parse_stream(stream).ok_or_else(|| {
        format!(
            "unexpected stream type {:?}",
            String::from_utf8_lossy(stream)
        )
    })?;
    let tags = parts.next().ok_or("log tag is not found")?;
    let partial = tags.split(|&b| b == b':').next() == Some(b"P");
    let content = parts.next().unwrap_or_default().to_vec();
    Ok(Record {
        ts,
        stream,
        partial,
        content,
    })
}

/// Parses one Docker JSON-file line: `{"log":"…\n","stream":"stdout","time":"…"}`.
pub fn parse_docker_json(line: &[u8]) -> Result<Record, String> {
    let v: serde_json::Value = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let log = v["log"].as_str().unwrap_or_default();
    let stream = parse_stream(v["stream"].as_str().unwrap_or_default().as_bytes())
        .ok_or("unexpected stream type")?;
    let ts = DateTime::parse_from_rfc3339(v["time"].as_str().unwrap_or_default())
        .map_err(|_| "unexpected time")?;
    let partial = !log.ends_with('\n');
    Ok(Record {
        ts,
        stream,
        partial,
        content: log.strip_suffix('\n').unwrap_or(log).as_bytes().to_vec(),
    })
}

pub fn parse_line(line: &[u8]) -> Result<Record, String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    parse_cri(line).or_else(|e| parse_docker_json(line).map_err(|_| e))
}

/// Joins partial records per stream.
#[derive(Default)]
pub struct Assembler {
    pending: [Option<Entry>; 2],
}

fn slot(s: Stream) -> usize {
    match s {
        Stream::Stdout => 0,
        Stream::Stderr => 1,
    }
}

impl Assembler {
    pub fn push(&mut self, r: Record) -> Option<Entry> {
        let p = &mut self.pending[slot(r.stream)];
        let mut e = p.take().unwrap_or(Entry {
            ts: r.ts,
            stream: r.stream,
            text: Vec::new(),
            newline: false,
        });
        e.text.extend_from_slice(&r.content);
        if r.partial {
            *p = Some(e);
            None
        } else {
            e.newline = true;
            Some(e)
        }
    }

    /// Unfinished lines, oldest first.
    pub fn flush(&mut self) -> Vec<Entry> {
        let mut v: Vec<Entry> = self.pending.iter_mut().filter_map(Option::take).collect();
        v.sort_by_key(|e| e.ts);
        v
    }
}

/// Entries of complete lines in `data`; returns them and the number of bytes consumed
/// (everything up to the last `\n`, or all of it when `eof_final`).
pub fn parse_chunk(asm: &mut Assembler, data: &[u8], eof_final: bool) -> (Vec<Entry>, usize) {
    let mut out = Vec::new();
    let mut start = 0;
    while start < data.len() {
        let (line, next) = match data[start..].iter().position(|&b| b == b'\n') {
            Some(i) => (&data[start..start + i], start + i + 1),
            None if eof_final => (&data[start..], data.len()),
            None => break,
        };
        start = next;
        if line.is_empty() {
            continue;
        }
        if let Ok(r) = parse_line(line)
            && let Some(e) = asm.push(r)
        {
            out.push(e);
        }
    }
    (out, start)
}

pub struct Options {
    pub tail: i64,
    pub limit_bytes: i64,
    pub since: Option<DateTime<Utc>>,
    pub timestamps: bool,
    pub stream: Option<Stream>,
}

/// Writes entries to the right stream under the byte limit and filters.
pub struct LogWriter<'a> {
    pub stdout: &'a mut (dyn Write + Send),
    pub stderr: &'a mut (dyn Write + Send),
    opts: &'a Options,
    remain: i64,
}

impl<'a> LogWriter<'a> {
    pub fn new(
        stdout: &'a mut (dyn Write + Send),
        stderr: &'a mut (dyn Write + Send),
        opts: &'a Options,
    ) -> Self {
        let remain = if opts.limit_bytes >= 0 {
            opts.limit_bytes
        } else {
            i64::MAX
        };
        LogWriter {
            stdout,
            stderr,
            opts,
            remain,
        }
    }

    /// Writes one entry; `Ok(false)` once the byte limit is reached.
    pub fn write(&mut self, e: &Entry) -> std::io::Result<bool> {
        if self.remain <= 0 {
            return Ok(false);
        }
        if self.opts.since.is_some_and(|s| e.ts < s) {
            return Ok(true);
        }
        if self.opts.stream.is_some_and(|s| s != e.stream) {
            return Ok(true);
        }
        let mut line = Vec::with_capacity(e.text.len() + 40);
        if self.opts.timestamps {
            // The kubelet's `RFC3339NanoFixed`: always nine fractional digits.
            let ts = e.ts.to_rfc3339_opts(SecondsFormat::Nanos, true);
            line.extend_from_slice(ts.as_bytes());
            line.push(b' ');
        }
        line.extend_from_slice(&e.text);
        if e.newline {
            line.push(b'\n');
        }
        if line.len() as i64 > self.remain {
            line.truncate(self.remain as usize);
        }
        let w: &mut (dyn Write + Send) = match e.stream {
            Stream::Stdout => &mut *self.stdout,
            Stream::Stderr => &mut *self.stderr,
        };
        w.write_all(&line)?;
        w.flush()?;
        self.remain -= line.len() as i64;
        Ok(self.remain > 0)
    }
}

/// The last `tail` entries (all when negative).
pub fn tail_entries(mut entries: Vec<Entry>, tail: i64) -> Vec<Entry> {
    if tail >= 0 && (tail as usize) < entries.len() {
        entries.drain(..entries.len() - tail as usize);
    }
    entries
}

/// Reads a whole (non-followed) log: parse, join, tail, write.
pub fn read_all(data: &[u8], w: &mut LogWriter<'_>, tail: i64) -> std::io::Result<()> {
    let mut asm = Assembler::default();
    let (mut entries, _) = parse_chunk(&mut asm, data, true);
    entries.extend(asm.flush());
    for e in tail_entries(entries, tail) {
        if !w.write(&e)? {
            break;
        }
    }
    Ok(())
}

fn previous_path(log_path: &str, attempt: u32) -> Option<String> {
    let slash = log_path.rfind('/').map(|i| i + 1).unwrap_or(0);
    let dot = log_path.rfind('.').filter(|&d| d >= slash)?;
    Some(format!(
        "{}{}{}",
        &log_path[..slash],
        attempt.checked_sub(1)?,
        &log_path[dot..]
    ))
}

fn inode(f: &std::fs::File) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    f.metadata().ok().map(|m| m.ino())
}

async fn running(c: &Clients, id: &str) -> Result<bool, CrictlError> {
    let s = c
        .runtime
        .clone()
        .container_status(ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        })
        .await
        .map_err(rpc("checking whether the container is running"))?
        .into_inner();
    Ok(s.status.map(|s| s.state) == Some(ContainerState::ContainerRunning as i32))
}

pub async fn logs(
    c: &Clients,
    a: LogsArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if a.container.is_empty() {
        return Err(CrictlError::Usage("ID cannot be empty".into()));
    }
    if a.reopen {
        c.runtime
            .clone()
            .reopen_container_log(ReopenContainerLogRequest {
                container_id: a.container.clone(),
            })
            .await
            .map_err(rpc("reopen container logs"))?;
        eprintln!("INFO[0000] Container logs reopened");
    }
    let since = match a.since.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Some(parse_since(s, &Local::now()).map_err(CrictlError::Usage)?),
        None => None,
    };
    let stream = match a.stream.as_deref() {
        None | Some("") => None,
        Some("stdout") => Some(Stream::Stdout),
        Some("stderr") => Some(Stream::Stderr),
        Some(other) => {
            return Err(CrictlError::Usage(format!(
                "invalid stream {other:?}, must be \"stdout\" or \"stderr\""
            )));
        }
    };
    if a.tail.is_some() && a.stream.is_some() {
        return Err(CrictlError::Usage(
            "--tail and --stream are mutually exclusive".into(),
        ));
    }
    let status = c
        .runtime
        .clone()
        .container_status(ContainerStatusRequest {
            container_id: a.container.clone(),
            verbose: false,
        })
        .await
        .map_err(rpc("getting container status"))?
        .into_inner()
        .status
        .unwrap_or_default();
    let mut path = status.log_path.clone();
    if path.is_empty() {
        return Err(CrictlError::Other(
            "the container has not set log path".into(),
        ));
    }
    if a.previous {
        let md = status.metadata.clone().unwrap_or_default();
        path = previous_path(&path, md.attempt).ok_or_else(|| {
            CrictlError::Other(format!(
                "previous terminated container {} not found",
                md.name
            ))
        })?;
    }
    let opts = Options {
        tail: a.tail.unwrap_or(-1),
        limit_bytes: a.limit_bytes,
        since,
        timestamps: a.timestamps,
        stream,
    };
    let resolved = std::fs::canonicalize(&path).map_err(|e| {
        CrictlError::Other(format!(
            "failed to try resolving symlinks in path {path:?}: {e}"
        ))
    })?;
    let open = |p: &std::path::Path| {
        std::fs::File::open(p).map_err(|e| {
            CrictlError::Other(format!(
                "failed to open log file {:?}: {e}",
                p.display().to_string()
            ))
        })
    };
    let mut file = open(&resolved)?;
    let mut data = Vec::new();
    file.read_to_end(&mut data)
        .map_err(|e| CrictlError::Other(format!("failed to read log file {path:?}: {e}")))?;
    let mut stderr = std::io::stderr();
    let mut w = LogWriter::new(out, &mut stderr, &opts);
    if !a.follow {
        return read_all(&data, &mut w, opts.tail).map_err(io);
    }

    // Follow: the complete lines so far (tailed), then new ones as they are written.
    let mut asm = Assembler::default();
    let (entries, used) = parse_chunk(&mut asm, &data, false);
    let mut pos = used as u64;
    for e in tail_entries(entries, opts.tail) {
        if !w.write(&e).map_err(io)? {
            return Ok(());
        }
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut last_check: Option<Instant> = None;
    let mut stopping = false;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        file.seek(SeekFrom::Start(pos)).map_err(io)?;
        buf.clear();
        file.read_to_end(&mut buf).map_err(io)?;
        if !buf.is_empty() {
            let (entries, used) = parse_chunk(&mut asm, &buf, false);
            pos += used as u64;
            for e in entries {
                if !w.write(&e).map_err(io)? {
                    return Ok(());
                }
            }
            if used > 0 {
                continue;
            }
        }
        if stopping {
            // The container has exited and the file is drained.
            for e in asm.flush() {
                if !w.write(&e).map_err(io)? {
                    break;
                }
            }
            return Ok(());
        }
        // Rotation: a new file at the path (or the old one truncated) starts over.
        if let Ok(cur) = std::fs::File::open(&resolved) {
            let replaced = inode(&cur) != inode(&file);
            let truncated = cur.metadata().map(|m| m.len() < pos).unwrap_or(false);
            if replaced || truncated {
                file = cur;
                pos = 0;
                continue;
            }
        }
        if last_check.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            last_check = Some(Instant::now());
            if !running(c, &a.container).await? {
                stopping = true;
                continue;
            }
        }
        tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Options {
        Options {
            tail: -1,
            limit_bytes: -1,
            since: None,
            timestamps: false,
            stream: None,
        }
    }

    fn run(data: &str, o: &Options) -> (String, String) {
        let mut out = Vec::new();
        let mut err = Vec::new();
        {
            let mut w = LogWriter::new(&mut out, &mut err, o);
            read_all(data.as_bytes(), &mut w, o.tail).unwrap();
        }
        (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    const LOG: &str = "\
2024-01-01T00:00:01.000000001Z stdout F hello
2024-01-01T00:00:02Z stderr F oops
2024-01-01T00:00:03Z stdout P par
2024-01-01T00:00:03.5Z stderr P e1-
2024-01-01T00:00:04Z stdout P ti
2024-01-01T00:00:05Z stdout F al
2024-01-01T00:00:06Z stderr F e2
2024-01-01T00:00:07+01:00 stdout F with spaces  inside
not a log line
2024-01-01T00:00:08Z stdout F:x last
";

    #[test]
    fn parses_cri_records() {
        let r = parse_line(b"2024-01-01T00:00:01.5Z stderr P a b").unwrap();
        assert_eq!(r.stream, Stream::Stderr);
        assert!(r.partial);
        assert_eq!(r.content, b"a b");
        assert_eq!(r.ts.timestamp_subsec_nanos(), 500_000_000);
        let r = parse_line(b"2024-01-01T00:00:01Z stdout F ").unwrap();
        assert_eq!(r.content, b"");
        let r = parse_line(b"2024-01-01T00:00:01Z stdout F").unwrap();
        assert!(!r.partial && r.content.is_empty());
        assert!(parse_line(b"2024-01-01T00:00:01Z stdin F x").is_err());
        assert!(parse_line(b"yesterday stdout F x").is_err());
        let d = parse_line(br#"{"log":"hi\n","stream":"stdout","time":"2024-01-01T00:00:01Z"}"#)
            .unwrap();
        assert_eq!((d.content.as_slice(), d.partial), (&b"hi"[..], false));
    }

    #[test]
    fn joins_partials_and_splits_streams() {
        let (out, err) = run(LOG, &opts());
        assert_eq!(out, "hello\npartial\nwith spaces  inside\nlast\n");
        assert_eq!(err, "oops\ne1-e2\n");
    }

    #[test]
    fn tail_counts_whole_lines() {
        let o = Options { tail: 2, ..opts() };
        let (out, err) = run(LOG, &o);
        assert_eq!(
            (out.as_str(), err.as_str()),
            ("with spaces  inside\nlast\n", "")
        );
        let o = Options { tail: 3, ..opts() };
        let (out, err) = run(LOG, &o);
        assert_eq!(out, "with spaces  inside\nlast\n");
        assert_eq!(err, "e1-e2\n");
        let o = Options { tail: 0, ..opts() };
        assert_eq!(run(LOG, &o), (String::new(), String::new()));
        let o = Options {
            tail: 100,
            ..opts()
        };
        assert_eq!(run(LOG, &o), run(LOG, &opts()));
    }

    #[test]
    fn timestamps_since_stream_and_limit() {
        let o = Options {
            timestamps: true,
            ..opts()
        };
        let (out, _) = run(LOG, &o);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "2024-01-01T00:00:01.000000001Z hello");
        // A joined line carries its first record's time.
        assert_eq!(lines[1], "2024-01-01T00:00:03.000000000Z partial");
        // The record's own zone is kept.
        assert_eq!(
            lines[2],
            "2024-01-01T00:00:07.000000000+01:00 with spaces  inside"
        );

        let since = DateTime::parse_from_rfc3339("2024-01-01T00:00:04Z")
            .unwrap()
            .to_utc();
        let o = Options {
            since: Some(since),
            ..opts()
        };
        let (out, err) = run(LOG, &o);
        // 00:00:07+01:00 is 23:00:07Z the day before; joined lines go by their first record.
        assert_eq!((out.as_str(), err.as_str()), ("last\n", ""));

        let o = Options {
            stream: Some(Stream::Stderr),
            ..opts()
        };
        assert_eq!(run(LOG, &o), (String::new(), "oops\ne1-e2\n".into()));

        let o = Options {
            limit_bytes: 8,
            ..opts()
        };
        assert_eq!(run(LOG, &o), ("hello\n".into(), "oo".into()));
    }

    #[test]
    fn unfinished_lines() {
        let data = "2024-01-01T00:00:01Z stdout P no newline yet\n2024-01-01T00:00:02Z stdout F done\n2024-01-01T00:00:03Z stdout P tail";
        // Whole-file read: the incomplete last record is still shown, without a newline.
        assert_eq!(run(data, &opts()).0, "no newline yetdone\ntail");
        // Following: only complete lines are consumed.
        let mut asm = Assembler::default();
        let (entries, used) = parse_chunk(&mut asm, data.as_bytes(), false);
        assert_eq!(entries.len(), 1);
        assert_eq!(used, data.rfind('\n').unwrap() + 1);
        let more = "2024-01-01T00:00:03Z stdout P tail\n2024-01-01T00:00:04Z stdout F end\n";
        let (entries, _) = parse_chunk(&mut asm, more.as_bytes(), false);
        assert_eq!(entries[0].text, b"tailend");
        assert!(asm.flush().is_empty());
    }

    #[test]
    fn previous_log_path() {
        assert_eq!(
            previous_path("/var/log/pods/ns_p_uid/main/2.log", 2).as_deref(),
            Some("/var/log/pods/ns_p_uid/main/1.log")
        );
        assert_eq!(previous_path("/logs/main.log", 0), None);
    }
}
