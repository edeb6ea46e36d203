//! The daemon's client of a shim's control socket (blocking; see [`super`] for the
//! protocol). Async callers can run it on a blocking thread, or take the raw socket with
//! [`AttachStream::into_parts`] and speak [`super::protocol`] themselves.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::protocol::{self, FrameKind, Request};
use super::{ExitStatus, SOCKET_FILE, ShimError, ShimState, sys};

/// How long a request/response exchange may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to one shim's control socket.
#[derive(Debug)]
pub struct ShimClient {
    stream: UnixStream,
    /// Bytes read past the last response line.
    rbuf: Vec<u8>,
}

impl ShimClient {
    /// Connects to `<state_dir>/shim.sock`.
    pub fn connect(state_dir: &Path) -> Result<ShimClient, ShimError> {
        let path = state_dir.join(SOCKET_FILE);
        let stream = sys::connect_unix(&path)
            .map_err(|e| ShimError::io(format!("connecting to shim at {}", path.display()), e))?;
        stream
            .set_read_timeout(Some(REQUEST_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(REQUEST_TIMEOUT)))
            .map_err(|e| ShimError::io("setting shim socket timeouts", e))?;
        Ok(ShimClient {
            stream,
            rbuf: Vec::new(),
        })
    }

    fn request(&mut self, req: &Request) -> Result<String, ShimError> {
        self.stream
            .write_all(req.to_line().as_bytes())
            .map_err(|e| ShimError::io("sending a request to the shim", e))?;
        let mut chunk = [0u8; 4096];
        let line = loop {
            if let Some(i) = self.rbuf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.rbuf.drain(..=i).collect();
                break line;
            }
            if self.rbuf.len() > protocol::MAX_LINE {
                return Err(ShimError::Protocol("response line too long".into()));
            }
            let n = self
                .stream
                .read(&mut chunk)
                .map_err(|e| ShimError::io("reading the shim's response", e))?;
            if n == 0 {
                return Err(ShimError::Protocol(
                    "the shim closed the connection without answering".into(),
                ));
            }
            self.rbuf.extend_from_slice(&chunk[..n]);
        };
        let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
        if line == "ok" {
            Ok(String::new())
        } else if let Some(payload) = line.strip_prefix("ok ") {
            Ok(payload.to_string())
        } else if let Some(msg) = line.strip_prefix("err ") {
            Err(ShimError::Refused(msg.to_string()))
        } else {
            Err(ShimError::Protocol(format!("unexpected response {line:?}")))
        }
    }

    /// The init's pid and whether it has exited.
    pub fn state(&mut self) -> Result<ShimState, ShimError> {
        let payload = self.request(&Request::State)?;
        serde_json::from_str(&payload)
            .map_err(|e| ShimError::Protocol(format!("bad state {payload:?}: {e}")))
    }

    /// Makes the shim close the CRI log file and open its path anew.
    pub fn reopen_log(&mut self) -> Result<(), ShimError> {
        self.request(&Request::ReopenLog).map(drop)
    }

    /// Sets the container terminal's size (TTY containers only).
    pub fn resize(&mut self, width: u16, height: u16) -> Result<(), ShimError> {
        self.request(&Request::Resize { width, height }).map(drop)
    }

    /// Turns this connection into an attach stream: output from now on, and stdin when
    /// `stdin` is set.
    pub fn attach(mut self, stdin: bool) -> Result<AttachStream, ShimError> {
        self.request(&Request::Attach { stdin })?;
        self.stream
            .set_read_timeout(None)
            .and_then(|()| self.stream.set_write_timeout(None))
            .map_err(|e| ShimError::io("clearing shim socket timeouts", e))?;
        Ok(AttachStream {
            stream: self.stream,
            rbuf: self.rbuf,
        })
    }
}

/// What an attached client receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The container closed its stdout (on a TTY: the terminal).
    StdoutClosed,
    StderrClosed,
    /// The container exited; nothing follows.
    Exit(ExitStatus),
}

/// An attached connection: output frames in, stdin frames out. [`AttachStream::try_clone`]
/// gives a second handle so one thread can read while another writes.
#[derive(Debug)]
pub struct AttachStream {
    stream: UnixStream,
    rbuf: Vec<u8>,
}

impl AttachStream {
    /// The next event; `None` when the shim closed the connection.
    pub fn recv(&mut self) -> Result<Option<AttachEvent>, ShimError> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some((kind, payload)) = protocol::decode_frame(&mut self.rbuf)? {
                return Ok(Some(match (kind, payload.is_empty()) {
                    (FrameKind::Stdout, false) => AttachEvent::Stdout(payload),
                    (FrameKind::Stdout, true) => AttachEvent::StdoutClosed,
                    (FrameKind::Stderr, false) => AttachEvent::Stderr(payload),
                    (FrameKind::Stderr, true) => AttachEvent::StderrClosed,
                    (FrameKind::Exit, _) => AttachEvent::Exit(
                        serde_json::from_slice(&payload)
                            .map_err(|e| ShimError::Protocol(format!("bad exit frame: {e}")))?,
                    ),
                    (other, _) => {
                        return Err(ShimError::Protocol(format!(
                            "unexpected {other:?} frame from the shim"
                        )));
                    }
                }));
            }
            let n = match self.stream.read(&mut chunk) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ShimError::io("reading from the shim", e)),
            };
            if n == 0 {
                return Ok(None);
            }
            self.rbuf.extend_from_slice(&chunk[..n]);
        }
    }

    fn send(&mut self, kind: FrameKind, payload: &[u8]) -> Result<(), ShimError> {
        let mut buf = Vec::with_capacity(protocol::frame_len(payload.len()));
        protocol::encode_frame(&mut buf, kind, payload);
        self.stream
            .write_all(&buf)
            .map_err(|e| ShimError::io("writing to the shim", e))
    }

    /// Sends bytes to the container's stdin (ignored by the shim unless attached with
    /// stdin).
    pub fn send_stdin(&mut self, data: &[u8]) -> Result<(), ShimError> {
        if data.is_empty() {
            return Ok(());
        }
        self.send(FrameKind::Stdin, data)
    }

    /// This client's stdin ended.
    pub fn close_stdin(&mut self) -> Result<(), ShimError> {
        self.send(FrameKind::CloseStdin, &[])
    }

    /// Sets the terminal size (TTY containers).
    pub fn resize(&mut self, width: u16, height: u16) -> Result<(), ShimError> {
        let mut p = [0u8; 4];
        p[..2].copy_from_slice(&width.to_be_bytes());
        p[2..].copy_from_slice(&height.to_be_bytes());
        self.send(FrameKind::Resize, &p)
    }

    /// A second handle on the same connection (frames already buffered stay with `self`).
    pub fn try_clone(&self) -> Result<AttachStream, ShimError> {
        Ok(AttachStream {
            stream: self
                .stream
                .try_clone()
                .map_err(|e| ShimError::io("cloning the shim connection", e))?,
            rbuf: Vec::new(),
        })
    }

    /// Half-closes the connection for writing (the shim sees this client as gone only
    /// when the connection closes completely).
    pub fn shutdown_write(&self) -> Result<(), ShimError> {
        self.stream
            .shutdown(std::net::Shutdown::Write)
            .map_err(|e| ShimError::io("shutting down the shim connection", e))
    }

    /// The raw socket and the bytes already read from it (the start of the frame stream).
    pub fn into_parts(self) -> (UnixStream, Vec<u8>) {
        (self.stream, self.rbuf)
    }
}
