//! The byte tunnel behind an upgraded exec, attach or port-forward request, between the
//! client and the kubelet once the kubelet answered 101.
//!
//! SPDY streams go through as they come. WebSocket frames from the kubelet go to the client
//! so that no write spans two frames: each frame ends its own TLS record. Go's API server gets
//! this for free (each TLS read returns one record, which it writes on as one); rustls reads
//! return whatever was decrypted, so a final status message and the Close that follows it
//! would reach the client in one record, and a client that waits on its socket before reading
//! the next frame (Python's websocket client does) would wait for ever for the Close.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Copies both ways until both sides are done; `websocket` keeps the kubelet's frames apart.
pub(crate) async fn run<C, K>(client: C, kubelet: K, websocket: bool)
where
    C: AsyncRead + AsyncWrite + Unpin,
    K: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client, mut kubelet) = (client, kubelet);
    if !websocket {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await;
        return;
    }
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut kubelet_r, mut kubelet_w) = tokio::io::split(kubelet);
    let up = async {
        let _ = tokio::io::copy(&mut client_r, &mut kubelet_w).await;
        let _ = kubelet_w.shutdown().await;
    };
    let down = async {
        let _ = copy_frames(&mut kubelet_r, &mut client_w).await;
        let _ = client_w.shutdown().await;
    };
    tokio::join!(up, down);
}

/// The whole length (header and payload) of the WebSocket frame `buf` starts with, once its
/// header is complete (RFC 6455 §5.2).
fn frame_len(buf: &[u8]) -> Option<u64> {
    let b1 = *buf.get(1)?;
    let mask = if b1 & 0x80 != 0 { 4 } else { 0 };
    let (ext, payload) = match b1 & 0x7f {
        126 => (
            2,
            u64::from(u16::from_be_bytes(buf.get(2..4)?.try_into().ok()?)),
        ),
        127 => (8, u64::from_be_bytes(buf.get(2..10)?.try_into().ok()?)),
        n => (0, u64::from(n)),
    };
    Some(2 + ext + mask + payload)
}

/// Forwards frames, flushing at the end of each, and never writing bytes of two frames in
/// one call. A large frame is forwarded as it arrives rather than held whole.
async fn copy_frames<R, W>(r: &mut R, w: &mut W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(16 * 1024);
    // Bytes of the current frame still to forward; 0 between frames.
    let mut left: u64 = 0;
    loop {
        loop {
            if left == 0 {
                match frame_len(&buf) {
                    Some(n) => left = n,
                    None => break,
                }
            }
            if buf.is_empty() {
                break;
            }
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            w.write_all(&buf[..n]).await?;
            buf.advance(n);
            left -= n as u64;
            if left == 0 {
                w.flush().await?;
            }
        }
        if r.read_buf(&mut buf).await? == 0 {
            // A torn frame at the end goes on as it is: the client reports it.
            w.write_all(&buf).await?;
            return w.flush().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    fn frame(payload: &[u8], masked: bool) -> Vec<u8> {
        let mut f = vec![0x82];
        let m = if masked { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => f.push(m | n as u8),
            n if n <= 0xffff => {
                f.push(m | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(m | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        if masked {
            f.extend_from_slice(&[1, 2, 3, 4]);
        }
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn frame_lengths_from_headers() {
        for (payload, masked) in [
            (0, false),
            (5, true),
            (125, false),
            (126, false),
            (70_000, true),
        ] {
            let f = frame(&vec![7; payload], masked);
            assert_eq!(frame_len(&f), Some(f.len() as u64), "{payload} {masked}");
            // Any cut before the length is complete is "not yet".
            let ext = match payload {
                0..126 => 0,
                126..=0xffff => 2,
                _ => 8,
            };
            for cut in 0..2 + ext {
                assert_eq!(frame_len(&f[..cut]), None, "{payload} cut {cut}");
            }
        }
    }

    /// Records each write call, as a TLS stream turns each into records.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl AsyncWrite for Writes {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.0.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_status_frame_and_the_close_behind_it_leave_in_separate_writes() {
        let status = frame(b"\x03{\"status\":\"Success\"}", false);
        let close = vec![0x88, 0x02, 0x03, 0xe8];
        let big = frame(&vec![9; 70_000], false);
        // All of it arrives in one read, as a rustls read can return it.
        let input: Vec<u8> = [status.clone(), close.clone(), big.clone()].concat();
        let mut r: &[u8] = &input;
        let mut w = Writes::default();
        copy_frames(&mut r, &mut w).await.expect("copy");
        // No write holds bytes of two frames, and the frames come out whole and in order.
        let mut at = 0;
        let bounds = [status.len(), status.len() + close.len(), input.len()];
        for chunk in &w.0 {
            let end = at + chunk.len();
            assert!(
                !bounds.iter().any(|b| at < *b && *b < end),
                "a write of {at}..{end} spans a frame boundary {bounds:?}"
            );
            at = end;
        }
        assert_eq!(w.0.concat(), input);
        assert_eq!(w.0[0], status);
        assert_eq!(w.0[1], close);
    }
}
