//! containerd/nri's connection multiplexer: one socket (the trunk) carries two logical
//! connections, the plugin service (conn 1: the runtime calls the plugin) and the runtime
//! service (conn 2: the plugin calls the runtime). Each frame on the trunk is an 8-byte
//! header — connection id and payload length, both u32 big-endian — then the payload; a
//! logical connection is a byte stream, so one ttrpc message may span frames.

use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;

/// The plugin service: requests from the runtime to the plugin.
pub(crate) const PLUGIN_SERVICE_CONN: u32 = 1;
/// The runtime service: requests from the plugin to the runtime.
pub(crate) const RUNTIME_SERVICE_CONN: u32 = 2;

const HEADER_LEN: usize = 8;
/// Upstream's largest frame: one whole ttrpc message (10-byte header + 4 MiB).
const MAX_PAYLOAD: usize = super::ttrpc::HEADER_LEN + super::ttrpc::MAX_MESSAGE;

/// Writes frames of one logical connection; frames of the two connections never interleave
/// mid-frame, and one write's frames stay together.
#[derive(Clone)]
pub(crate) struct Writer {
    id: u32,
    trunk: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
}

impl Writer {
    pub(crate) async fn write(&self, data: &[u8]) -> std::io::Result<()> {
        let mut w = self.trunk.lock().await;
        let mut buf = Vec::with_capacity(HEADER_LEN + data.len().min(MAX_PAYLOAD));
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

/// The reading side of one logical connection.
pub(crate) struct Reader {
    rx: mpsc::UnboundedReceiver<Bytes>,
    buf: BytesMut,
}

impl Reader {
    /// Exactly `n` bytes of the connection's stream; UnexpectedEof once the trunk is gone.
    pub(crate) async fn read_exact(&mut self, n: usize) -> std::io::Result<BytesMut> {
        while self.buf.len() < n {
            match self.rx.recv().await {
                Some(b) => self.buf.extend_from_slice(&b),
                None => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            }
        }
        Ok(self.buf.split_to(n))
    }
}

/// One logical connection: its reader and writer.
pub(crate) struct Conn {
    pub(crate) reader: Reader,
    pub(crate) writer: Writer,
}

/// Splits a trunk into the plugin service connection and the runtime service connection.
/// A background task demultiplexes until the trunk closes; frames for any other connection
/// id are dropped, as upstream drops frames for connections nobody opened.
pub(crate) fn split(trunk: UnixStream) -> (Conn, Conn) {
    let (mut rd, wr) = trunk.into_split();
    let trunk = Arc::new(tokio::sync::Mutex::new(wr));
    let (tx1, rx1) = mpsc::unbounded_channel();
    let (tx2, rx2) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut hdr = [0u8; HEADER_LEN];
        loop {
            if rd.read_exact(&mut hdr).await.is_err() {
                return;
            }
            let id = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
            let len = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
            if len > MAX_PAYLOAD {
                tracing::warn!(
                    len,
                    "NRI mux frame over the size limit; closing the connection"
                );
                return;
            }
            let mut payload = vec![0u8; len];
            if rd.read_exact(&mut payload).await.is_err() {
                return;
            }
            let tx = match id {
                PLUGIN_SERVICE_CONN => &tx1,
                RUNTIME_SERVICE_CONN => &tx2,
                _ => continue,
            };
            let _ = tx.send(Bytes::from(payload));
        }
    });
    let conn = |id, rx| Conn {
        reader: Reader {
            rx,
            buf: BytesMut::new(),
        },
        writer: Writer {
            id,
            trunk: Arc::clone(&trunk),
        },
    };
    (
        conn(PLUGIN_SERVICE_CONN, rx1),
        conn(RUNTIME_SERVICE_CONN, rx2),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_carry_connection_id_and_length_and_streams_reassemble() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a1, _a2) = split(a);
        // The peer reads raw frames: header then payload.
        let (mut raw_rd, _raw_wr) = b.into_split();
        a1.writer.write(b"hello").await.unwrap();
        let mut hdr = [0u8; 8];
        raw_rd.read_exact(&mut hdr).await.unwrap();
        assert_eq!(hdr, [0, 0, 0, 1, 0, 0, 0, 5]);
        let mut p = [0u8; 5];
        raw_rd.read_exact(&mut p).await.unwrap();
        assert_eq!(&p, b"hello");

        // Two frames for conn 2 and one for an unknown conn: conn 2 reads one stream.
        let (c, d) = UnixStream::pair().unwrap();
        let (_c1, mut c2) = split(c);
        let (_drd, mut dwr) = d.into_split();
        let mut out = Vec::new();
        for (id, p) in [(2u32, &b"ab"[..]), (7, b"zz"), (2, b"cd")] {
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&(p.len() as u32).to_be_bytes());
            out.extend_from_slice(p);
        }
        dwr.write_all(&out).await.unwrap();
        assert_eq!(&c2.reader.read_exact(3).await.unwrap()[..], b"abc");
        assert_eq!(&c2.reader.read_exact(1).await.unwrap()[..], b"d");
        drop(dwr);
        drop(_drd);
        assert!(c2.reader.read_exact(1).await.is_err());
    }
}
