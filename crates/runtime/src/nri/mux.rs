//! containerd/nri's connection multiplexer: one socket (the trunk) carries two logical
//! connections, the plugin service (conn 1: the runtime calls the plugin) and the runtime
//! service (conn 2: the plugin calls the runtime). Each frame on the trunk is an 8-byte
//! header — connection id and payload length, both u32 big-endian — then the payload; a
//! logical connection is a byte stream, so one ttrpc message may span frames.

use std::sync::Arc;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// The plugin service: requests from the runtime to the plugin.
pub(crate) const PLUGIN_SERVICE_CONN: u32 = 1;
/// The runtime service: requests from the plugin to the runtime.
pub(crate) const RUNTIME_SERVICE_CONN: u32 = 2;

const HEADER_LEN: usize = 8;
/// Upstream's largest frame: one whole ttrpc message (10-byte header + 4 MiB).
const MAX_PAYLOAD: usize = super::ttrpc::HEADER_LEN + super::ttrpc::MAX_MESSAGE;
/// One read takes in every frame already waiting (a request and its answer are a few KiB).
const READ_BUFFER: usize = 64 << 10;

/// Writes frames of one logical connection; frames of the two connections never interleave
/// mid-frame, and one write's frames stay together.
#[derive(Clone)]
pub(crate) struct Writer {
    id: u32,
    trunk: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
}

impl Writer {
    pub(crate) async fn write(&self, data: &[u8]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(HEADER_LEN + data.len().min(MAX_PAYLOAD));
        let mut w = self.trunk.lock().await;
        for chunk in data.chunks(MAX_PAYLOAD) {
            buf.clear();
            buf.extend_from_slice(&self.id.to_be_bytes());
            buf.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
            buf.extend_from_slice(chunk);
            w.write_all(&buf).await?;
        }
        Ok(())
    }

    /// Closes the trunk for writing: the peer's reads end.
    pub(crate) async fn shutdown(&self) {
        let _ = self.trunk.lock().await.shutdown().await;
    }
}

/// Where one logical connection's bytes go as they arrive. The demultiplexer calls it on
/// its own task, so a sink must not block: it hands complete messages on (a waiting call's
/// answer, a request's own task) instead of through another task of its own, which would
/// cost every message one more wake-up.
pub(crate) trait Sink: Send + 'static {
    /// The next bytes of the connection's stream; an error ends the whole trunk.
    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// The trunk is gone: nothing more arrives.
    fn closed(&mut self);
}

/// The reading side of a trunk, until its sinks are known.
pub(crate) struct Demux {
    rd: OwnedReadHalf,
}

impl Demux {
    /// Demultiplexes in the background until the trunk closes: frames of the plugin service
    /// to `plugin`, of the runtime service to `runtime`; frames for any other connection id
    /// are dropped, as upstream drops frames for connections nobody opened.
    pub(crate) fn start(self, mut plugin: Box<dyn Sink>, mut runtime: Box<dyn Sink>) {
        let mut rd = tokio::io::BufReader::with_capacity(READ_BUFFER, self.rd);
        tokio::spawn(async move {
            let mut hdr = [0u8; HEADER_LEN];
            let mut payload = Vec::new();
            loop {
                if rd.read_exact(&mut hdr).await.is_err() {
                    break;
                }
                let id = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
                let len = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
                if len > MAX_PAYLOAD {
                    tracing::warn!(
                        len,
                        "NRI mux frame over the size limit; closing the connection"
                    );
                    break;
                }
                payload.resize(len, 0);
                if rd.read_exact(&mut payload).await.is_err() {
                    break;
                }
                let sink = match id {
                    PLUGIN_SERVICE_CONN => &mut plugin,
                    RUNTIME_SERVICE_CONN => &mut runtime,
                    _ => continue,
                };
                if let Err(e) = sink.data(&payload) {
                    tracing::warn!(error = %e, "NRI: bad message; closing the connection");
                    break;
                }
            }
            plugin.closed();
            runtime.closed();
        });
    }
}

/// Splits a trunk into the writers of the plugin service and runtime service connections
/// and the demultiplexer that feeds their readers.
pub(crate) fn split(trunk: UnixStream) -> (Writer, Writer, Demux) {
    let (rd, wr) = trunk.into_split();
    let trunk = Arc::new(tokio::sync::Mutex::new(wr));
    let writer = |id| Writer {
        id,
        trunk: Arc::clone(&trunk),
    };
    (
        writer(PLUGIN_SERVICE_CONN),
        writer(RUNTIME_SERVICE_CONN),
        Demux { rd },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink collecting its stream into a channel.
    struct Collect(tokio::sync::mpsc::UnboundedSender<Option<Vec<u8>>>);
    impl Sink for Collect {
        fn data(&mut self, b: &[u8]) -> std::io::Result<()> {
            let _ = self.0.send(Some(b.to_vec()));
            Ok(())
        }
        fn closed(&mut self) {
            let _ = self.0.send(None);
        }
    }

    #[tokio::test]
    async fn frames_carry_connection_id_and_length_and_streams_reassemble() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a1, _a2, _demux) = split(a);
        // The peer reads raw frames: header then payload.
        let (mut raw_rd, _raw_wr) = b.into_split();
        a1.write(b"hello").await.unwrap();
        let mut hdr = [0u8; 8];
        raw_rd.read_exact(&mut hdr).await.unwrap();
        assert_eq!(hdr, [0, 0, 0, 1, 0, 0, 0, 5]);
        let mut p = [0u8; 5];
        raw_rd.read_exact(&mut p).await.unwrap();
        assert_eq!(&p, b"hello");

        // Two frames for conn 2 and one for an unknown conn: conn 2 gets its own bytes.
        let (c, d) = UnixStream::pair().unwrap();
        let (_c1, _c2, demux) = split(c);
        let (tx1, mut rx1) = tokio::sync::mpsc::unbounded_channel();
        let (tx2, mut rx2) = tokio::sync::mpsc::unbounded_channel();
        demux.start(Box::new(Collect(tx1)), Box::new(Collect(tx2)));
        let (_drd, mut dwr) = d.into_split();
        let mut out = Vec::new();
        for (id, p) in [(2u32, &b"ab"[..]), (7, b"zz"), (2, b"cd")] {
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&(p.len() as u32).to_be_bytes());
            out.extend_from_slice(p);
        }
        dwr.write_all(&out).await.unwrap();
        assert_eq!(rx2.recv().await.unwrap().unwrap(), b"ab");
        assert_eq!(rx2.recv().await.unwrap().unwrap(), b"cd");
        drop(dwr);
        drop(_drd);
        // The trunk's end reaches both connections.
        assert_eq!(rx2.recv().await.unwrap(), None);
        assert_eq!(rx1.recv().await.unwrap(), None);
    }
}
