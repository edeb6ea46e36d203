//! The CRI container log format the kubelet reads (`pkg/kubelet/kuberuntime/logs`):
//! `<RFC3339Nano> <stdout|stderr> <F|P> <content>\n`, with containerd's line semantics:
//!
//! * a line ending in `\n` is one `F` record without the `\n` (and without a `\r` right
//!   before it);
//! * a line longer than the maximum (16 KiB, containerd's `max_container_log_line_size`)
//!   is cut into `P` records of exactly the maximum, the rest going on as usual (so the
//!   last piece of a terminated line is `F`);
//! * bytes left without a `\n` when the stream ends are flushed as one `P` record.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

/// containerd's default `max_container_log_line_size`.
pub const MAX_LINE: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    Full,
    Partial,
}

impl Tag {
    pub fn as_str(self) -> &'static str {
        match self {
            Tag::Full => "F",
            Tag::Partial => "P",
        }
    }
}

/// Go's `time.RFC3339Nano` in UTC: nanoseconds with trailing zeros removed (and no
/// fraction at all when it is zero), e.g. `2016-10-06T00:17:09.669794202Z`.
pub fn rfc3339_nano(t: DateTime<Utc>) -> String {
    let mut s = t.format("%Y-%m-%dT%H:%M:%S%.9f").to_string();
    while s.ends_with('0') {
        s.pop();
    }
    if s.ends_with('.') {
        s.pop();
    }
    s.push('Z');
    s
}

/// Splits one stream's bytes into CRI log records.
#[derive(Debug)]
pub struct LineSplitter {
    pending: Vec<u8>,
    max: usize,
}

impl LineSplitter {
    pub fn new(max: usize) -> LineSplitter {
        LineSplitter {
            pending: Vec::new(),
            max: max.max(1),
        }
    }

    /// Feeds bytes; `emit` is called for each complete record.
    pub fn feed(&mut self, mut data: &[u8], emit: &mut dyn FnMut(Tag, &[u8])) {
        while !data.is_empty() {
            match data.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.pending.extend_from_slice(&data[..i]);
                    data = &data[i + 1..];
                    let mut content = &self.pending[..];
                    if content.last() == Some(&b'\r') {
                        content = &content[..content.len() - 1];
                    }
                    while content.len() > self.max {
                        emit(Tag::Partial, &content[..self.max]);
                        content = &content[self.max..];
                    }
                    emit(Tag::Full, content);
                    self.pending.clear();
                }
                None => {
                    self.pending.extend_from_slice(data);
                    data = &[];
                    self.cut_long(emit);
                }
            }
        }
    }

    /// Emits `P` records while an unterminated line is longer than the maximum. A final
    /// `\r` is not counted: it may be the first half of a `\r\n`.
    fn cut_long(&mut self, emit: &mut dyn FnMut(Tag, &[u8])) {
        let effective = |p: &[u8]| p.len() - usize::from(p.last() == Some(&b'\r'));
        let mut start = 0;
        while effective(&self.pending[start..]) > self.max {
            emit(Tag::Partial, &self.pending[start..start + self.max]);
            start += self.max;
        }
        if start > 0 {
            self.pending.drain(..start);
        }
    }

    /// The stream ended: what is left is flushed as `P` records.
    pub fn finish(&mut self, emit: &mut dyn FnMut(Tag, &[u8])) {
        let mut rest = &self.pending[..];
        while !rest.is_empty() {
            let n = rest.len().min(self.max);
            emit(Tag::Partial, &rest[..n]);
            rest = &rest[n..];
        }
        self.pending = Vec::new();
    }
}

/// Formats one record, newline included.
pub fn format_record(
    out: &mut Vec<u8>,
    now: DateTime<Utc>,
    stream: Stream,
    tag: Tag,
    content: &[u8],
) {
    out.extend_from_slice(rfc3339_nano(now).as_bytes());
    out.push(b' ');
    out.extend_from_slice(stream.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(tag.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(content);
    out.push(b'\n');
}

/// The open CRI log file. Reopened on request (the kubelet rotates by renaming the file
/// and asking the runtime to reopen).
#[derive(Debug)]
pub struct CriLog {
    path: PathBuf,
    file: Option<File>,
    line: Vec<u8>,
}

impl CriLog {
    pub fn open(path: &Path) -> io::Result<CriLog> {
        let mut log = CriLog {
            path: path.to_path_buf(),
            file: None,
            line: Vec::new(),
        };
        log.reopen()?;
        Ok(log)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the file and opens the path anew (creating it 0640, and its parents).
    pub fn reopen(&mut self) -> io::Result<()> {
        self.file = None;
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.path)?;
        self.file = Some(file);
        Ok(())
    }

    /// Writes one record. Errors are returned but the log stays usable (the container's
    /// output must keep draining whatever happens to the file).
    pub fn write(&mut self, stream: Stream, tag: Tag, content: &[u8]) -> io::Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        self.line.clear();
        format_record(&mut self.line, Utc::now(), stream, tag, content);
        let r = file.write_all(&self.line);
        if self.line.capacity() > 2 * MAX_LINE + 128 {
            self.line = Vec::new();
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn split(max: usize, chunks: &[&[u8]], finish: bool) -> Vec<(Tag, Vec<u8>)> {
        let mut out = Vec::new();
        let mut s = LineSplitter::new(max);
        for c in chunks {
            s.feed(c, &mut |t, b| out.push((t, b.to_vec())));
        }
        if finish {
            s.finish(&mut |t, b| out.push((t, b.to_vec())));
        }
        out
    }

    fn f(s: &str) -> (Tag, Vec<u8>) {
        (Tag::Full, s.as_bytes().to_vec())
    }
    fn p(s: &str) -> (Tag, Vec<u8>) {
        (Tag::Partial, s.as_bytes().to_vec())
    }

    #[test]
    fn lines_are_full_records() {
        assert_eq!(
            split(16, &[b"hello\nwor", b"ld\r\n\n"], true),
            vec![f("hello"), f("world"), f("")]
        );
        // A lone \r inside a line is content.
        assert_eq!(split(16, &[b"a\rb\n"], true), vec![f("a\rb")]);
    }

    #[test]
    fn long_lines_are_cut_into_partials_of_exactly_max() {
        assert_eq!(
            split(4, &[b"abcdefghij\n"], true),
            vec![p("abcd"), p("efgh"), f("ij")]
        );
        assert_eq!(
            split(4, &[b"ab", b"cdef", b"gh", b"\n"], true),
            vec![p("abcd"), f("efgh")]
        );
        // Exactly max, then \r\n: one full record (the \r does not force a cut).
        assert_eq!(split(4, &[b"abcd\r", b"\n"], true), vec![f("abcd")]);
        assert_eq!(split(4, &[b"abcdefgh\n"], true), vec![p("abcd"), f("efgh")]);
    }

    #[test]
    fn unterminated_tail_is_partial() {
        assert_eq!(split(16, &[b"one\ntwo"], false), vec![f("one")]);
        assert_eq!(split(16, &[b"one\ntwo"], true), vec![f("one"), p("two")]);
        assert_eq!(split(4, &[b"abcdef"], true), vec![p("abcd"), p("ef")]);
        assert_eq!(split(4, &[b""], true), vec![]);
    }

    #[test]
    fn timestamps_follow_go_rfc3339nano() {
        let t = Utc.with_ymd_and_hms(2016, 10, 6, 0, 17, 9).unwrap();
        assert_eq!(rfc3339_nano(t), "2016-10-06T00:17:09Z");
        let t = t + chrono::Duration::nanoseconds(669_794_202);
        assert_eq!(rfc3339_nano(t), "2016-10-06T00:17:09.669794202Z");
        let t = Utc.with_ymd_and_hms(2016, 10, 6, 0, 17, 9).unwrap()
            + chrono::Duration::nanoseconds(500_000_000);
        assert_eq!(rfc3339_nano(t), "2016-10-06T00:17:09.5Z");
        let mut out = Vec::new();
        format_record(&mut out, t, Stream::Stderr, Tag::Partial, b"x y");
        assert_eq!(out, b"2016-10-06T00:17:09.5Z stderr P x y\n");
    }
}
