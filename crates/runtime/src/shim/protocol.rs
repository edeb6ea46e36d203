//! The wire format of the control socket (see the module documentation of [`super`]):
//! request/response lines, then, after `attach`, length-prefixed frames.

use super::ShimError;

/// Largest frame payload either side sends or accepts.
pub const MAX_FRAME: usize = 64 * 1024;
/// Length of a frame header: kind (1 byte) + payload length (u32, big endian).
pub const FRAME_HEADER: usize = 5;
/// Longest request or response line accepted.
pub const MAX_LINE: usize = 64 * 1024;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// shim → client: container stdout bytes (the combined stream on a TTY); an empty
    /// payload means the stream reached EOF.
    Stdout = 1,
    /// shim → client: container stderr bytes; empty = EOF.
    Stderr = 2,
    /// shim → client: the container exited; payload = exit.json's JSON. Last frame.
    Exit = 3,
    /// client → shim: bytes for the container's stdin.
    Stdin = 4,
    /// client → shim: this client's stdin reached EOF (closes the container's stdin when
    /// the container is stdin-once).
    CloseStdin = 5,
    /// client → shim: terminal size, payload = width u16 BE + height u16 BE.
    Resize = 6,
}

impl FrameKind {
    pub fn from_u8(b: u8) -> Option<FrameKind> {
        Some(match b {
            1 => FrameKind::Stdout,
            2 => FrameKind::Stderr,
            3 => FrameKind::Exit,
            4 => FrameKind::Stdin,
            5 => FrameKind::CloseStdin,
            6 => FrameKind::Resize,
            _ => return None,
        })
    }
}

/// Appends one frame to `out`. Payloads longer than [`MAX_FRAME`] are split into several
/// frames of the same kind.
pub fn encode_frame(out: &mut Vec<u8>, kind: FrameKind, payload: &[u8]) {
    let mut chunks = payload.chunks(MAX_FRAME).peekable();
    if chunks.peek().is_none() {
        out.push(kind as u8);
        out.extend_from_slice(&0u32.to_be_bytes());
        return;
    }
    for chunk in chunks {
        out.push(kind as u8);
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
}

/// Encoded size of a frame of `len` payload bytes (when `len <= MAX_FRAME`).
pub fn frame_len(len: usize) -> usize {
    FRAME_HEADER + len
}

/// Takes one complete frame off the front of `buf`, if there is one.
pub fn decode_frame(buf: &mut Vec<u8>) -> Result<Option<(FrameKind, Vec<u8>)>, ShimError> {
    if buf.len() < FRAME_HEADER {
        return Ok(None);
    }
    let kind = FrameKind::from_u8(buf[0])
        .ok_or_else(|| ShimError::Protocol(format!("unknown frame kind {}", buf[0])))?;
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_FRAME {
        return Err(ShimError::Protocol(format!(
            "frame of {len} bytes exceeds the limit of {MAX_FRAME}"
        )));
    }
    if buf.len() < FRAME_HEADER + len {
        return Ok(None);
    }
    let payload = buf[FRAME_HEADER..FRAME_HEADER + len].to_vec();
    buf.drain(..FRAME_HEADER + len);
    Ok(Some((kind, payload)))
}

/// A request line (without its newline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    State,
    ReopenLog,
    Resize { width: u16, height: u16 },
    Attach { stdin: bool },
}

impl Request {
    pub fn parse(line: &str) -> Result<Request, String> {
        let mut words = line.split_ascii_whitespace();
        let cmd = words.next().unwrap_or("");
        let req = match cmd {
            "state" => Request::State,
            "reopen-log" => Request::ReopenLog,
            "resize" => {
                let mut num = |what: &str| {
                    words
                        .next()
                        .and_then(|w| w.parse::<u16>().ok())
                        .ok_or_else(|| format!("resize needs a {what} (0..65535)"))
                };
                let width = num("width")?;
                let height = num("height")?;
                Request::Resize { width, height }
            }
            "attach" => match words.next() {
                Some("1") => Request::Attach { stdin: true },
                Some("0") | None => Request::Attach { stdin: false },
                Some(other) => return Err(format!("attach takes 0 or 1, not {other:?}")),
            },
            "" => return Err("empty request".into()),
            other => return Err(format!("unknown request {other:?}")),
        };
        if let Some(extra) = words.next() {
            return Err(format!("unexpected argument {extra:?} to {cmd}"));
        }
        Ok(req)
    }

    pub fn to_line(&self) -> String {
        match self {
            Request::State => "state\n".into(),
            Request::ReopenLog => "reopen-log\n".into(),
            Request::Resize { width, height } => format!("resize {width} {height}\n"),
            Request::Attach { stdin } => format!("attach {}\n", u8::from(*stdin)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_split() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, FrameKind::Stdout, b"hello");
        encode_frame(&mut buf, FrameKind::Stderr, b"");
        encode_frame(&mut buf, FrameKind::Stdin, &vec![7u8; MAX_FRAME + 3]);
        assert_eq!(
            decode_frame(&mut buf).unwrap(),
            Some((FrameKind::Stdout, b"hello".to_vec()))
        );
        assert_eq!(
            decode_frame(&mut buf).unwrap(),
            Some((FrameKind::Stderr, vec![]))
        );
        let (k, p) = decode_frame(&mut buf).unwrap().unwrap();
        assert_eq!((k, p.len()), (FrameKind::Stdin, MAX_FRAME));
        let (k, p) = decode_frame(&mut buf).unwrap().unwrap();
        assert_eq!((k, p.len()), (FrameKind::Stdin, 3));
        assert_eq!(decode_frame(&mut buf).unwrap(), None);
        let mut partial = vec![1, 0, 0, 0, 4, b'a'];
        assert_eq!(decode_frame(&mut partial).unwrap(), None);
        let mut bad = vec![9, 0, 0, 0, 0];
        assert!(decode_frame(&mut bad).is_err());
        let mut huge = vec![1, 0xff, 0xff, 0xff, 0xff];
        assert!(decode_frame(&mut huge).is_err());
    }

    #[test]
    fn requests_parse() {
        for r in [
            Request::State,
            Request::ReopenLog,
            Request::Resize {
                width: 80,
                height: 24,
            },
            Request::Attach { stdin: true },
            Request::Attach { stdin: false },
        ] {
            assert_eq!(Request::parse(r.to_line().trim_end()), Ok(r));
        }
        assert!(Request::parse("resize 80").is_err());
        assert!(Request::parse("resize 80 x").is_err());
        assert!(Request::parse("frobnicate").is_err());
        assert!(Request::parse("state now").is_err());
    }
}
