//! A small hyper HTTP/1 server on 127.0.0.1, run on its own thread and tokio runtime so it
//! works from sync tests and outlives any one `#[tokio::test]` runtime.

use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;
pub(crate) type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>> + Send + Sync,
>;

/// A body holding `data`.
pub(crate) fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// A response with `status`, a content type and a body.
pub(crate) fn respond(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(full(body))
        .expect("valid response")
}

/// The server. Dropping it stops accepting, cancels in-flight connections and joins the
/// thread.
pub(crate) struct BackgroundServer {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundServer {
    pub(crate) fn start(name: &str, handler: Handler) -> Result<BackgroundServer> {
        let listener =
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind 127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("testkit-{name}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("tokio runtime for a testkit server");
                rt.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("register listener");
                    loop {
                        tokio::select! {
                            _ = &mut rx => break,
                            accepted = listener.accept() => {
                                let Ok((stream, _)) = accepted else { continue };
                                let handler = handler.clone();
                                tokio::spawn(async move {
                                    let svc = hyper::service::service_fn(move |req| {
                                        let fut = handler(req);
                                        async move { Ok::<_, Infallible>(fut.await) }
                                    });
                                    let _ = hyper::server::conn::http1::Builder::new()
                                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                        .await;
                                });
                            }
                        }
                    }
                });
            })?;
        Ok(BackgroundServer {
            addr,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
