//! Attach: the session joins the container's shim (`attach` on its control socket) and
//! relays frames: output to the client, the client's stdin and terminal sizes to the
//! container, as containerd's `ContainerIO.Attach` does.
//!
//! The attach ends when the container exits, when the client goes away, or when the
//! client's stdin ends — except for a `stdin_once` container without a TTY, whose stdin is
//! closed then while the output keeps flowing until the container exits.

use super::AttachRequest;
use super::remotecommand::Session;
use super::status::Outcome;
use crate::shim::ShimClient;
use crate::shim::protocol::{self, FrameKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// What goes to the shim, in order.
enum ToShim {
    Frame(Vec<u8>),
    /// Acknowledged once every frame queued before it was written.
    Flushed(tokio::sync::oneshot::Sender<()>),
}

/// Why the relay stopped.
enum End {
    /// The container exited or the shim closed the connection.
    Output,
    /// The client's stdin ended and the attach detaches.
    StdinDone,
    ClientGone,
}

pub(crate) async fn run(req: &AttachRequest, s: &mut Session) -> Outcome {
    if crate::shim::read_exit(&req.shim_dir).is_some() {
        return Outcome::Error("container is in CONTAINER_EXITED state".into());
    }
    let with_stdin = s.stdin.is_some() && req.container_stdin;
    let dir = req.shim_dir.clone();
    let attached = tokio::task::spawn_blocking(move || {
        ShimClient::connect(&dir).and_then(|c| c.attach(with_stdin))
    })
    .await;
    let stream = match attached {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return Outcome::Error(e.to_string()),
        Err(e) => return Outcome::Error(format!("attach task failed: {e}")),
    };
    let (sock, mut rbuf) = stream.into_parts();
    let sock = match sock
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(sock))
    {
        Ok(s) => s,
        Err(e) => return Outcome::Error(format!("using the shim connection: {e}")),
    };
    tracing::info!(container = %req.container_id, stdin = with_stdin, "attach session starting");
    let (mut rd, mut wr) = sock.into_split();

    // Everything the client sends goes through one queue of frames to the shim.
    let (frames_tx, mut frames_rx) = mpsc::channel::<ToShim>(64);
    let (stdin_done_tx, mut stdin_done_rx) = mpsc::channel::<()>(1);
    let writer = tokio::spawn(async move {
        while let Some(f) = frames_rx.recv().await {
            match f {
                ToShim::Frame(f) => {
                    if wr.write_all(&f).await.is_err() {
                        return;
                    }
                }
                ToShim::Flushed(ack) => {
                    let _ = ack.send(());
                }
            }
        }
    });
    let detach_on_stdin_end = !req.stdin_once || req.container_tty;
    match s.stdin.take() {
        Some(mut rx) if with_stdin => {
            let tx = frames_tx.clone();
            tokio::spawn(async move {
                while let Some(chunk) = rx.recv().await {
                    let mut f = Vec::with_capacity(chunk.len() + protocol::FRAME_HEADER);
                    protocol::encode_frame(&mut f, FrameKind::Stdin, &chunk);
                    if tx.send(ToShim::Frame(f)).await.is_err() {
                        return;
                    }
                }
                let mut f = Vec::new();
                protocol::encode_frame(&mut f, FrameKind::CloseStdin, &[]);
                let _ = tx.send(ToShim::Frame(f)).await;
                // Everything above is on the socket before the attach may end.
                let (ack_tx, ack_rx) = tokio::sync::oneshot::channel();
                if tx.send(ToShim::Flushed(ack_tx)).await.is_ok() {
                    let _ = ack_rx.await;
                }
                let _ = stdin_done_tx.send(()).await;
            });
        }
        // A container without stdin: the client's input goes nowhere and its end does not
        // end the attach (containerd copies no stdin then).
        Some(mut rx) => {
            tokio::spawn(async move { while rx.recv().await.is_some() {} });
        }
        None => {}
    }
    if let Some(mut rx) = s.resize.take() {
        let tx = frames_tx.clone();
        let tty = req.container_tty;
        tokio::spawn(async move {
            while let Some(size) = rx.recv().await {
                if !tty || size.width == 0 || size.height == 0 {
                    continue;
                }
                let mut p = [0u8; 4];
                p[..2].copy_from_slice(&size.width.to_be_bytes());
                p[2..].copy_from_slice(&size.height.to_be_bytes());
                let mut f = Vec::new();
                protocol::encode_frame(&mut f, FrameKind::Resize, &p);
                if tx.send(ToShim::Frame(f)).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(frames_tx);

    let stdout = s.stdout.clone();
    let stderr = if req.container_tty {
        None
    } else {
        s.stderr.clone()
    };
    let relay = async {
        let mut chunk = vec![0u8; 32 * 1024];
        loop {
            loop {
                match protocol::decode_frame(&mut rbuf) {
                    Ok(Some((FrameKind::Stdout, p))) => {
                        if let Some(o) = &stdout {
                            if p.is_empty() {
                                o.close().await;
                            } else if o.write(&p).await.is_err() {
                                return End::ClientGone;
                            }
                        }
                    }
                    Ok(Some((FrameKind::Stderr, p))) => {
                        if let Some(o) = &stderr {
                            if p.is_empty() {
                                o.close().await;
                            } else if o.write(&p).await.is_err() {
                                return End::ClientGone;
                            }
                        }
                    }
                    Ok(Some((FrameKind::Exit, _))) => return End::Output,
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => return End::Output,
                }
            }
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => return End::Output,
                Ok(n) => rbuf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let stdin_end = async {
        if stdin_done_rx.recv().await.is_some() && detach_on_stdin_end {
            End::StdinDone
        } else {
            std::future::pending().await
        }
    };
    let end = tokio::select! {
        e = relay => e,
        e = stdin_end => e,
        _ = s.disconnected() => End::ClientGone,
    };
    writer.abort();
    let why = match end {
        End::Output => "output ended",
        End::StdinDone => "stdin ended",
        End::ClientGone => "client gone",
    };
    tracing::info!(container = %req.container_id, reason = why, "attach session ended");
    Outcome::Success
}
