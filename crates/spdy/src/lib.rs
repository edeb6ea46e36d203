//! SPDY/3.1 as the Kubernetes streaming protocols use it (`k8s.io/apimachinery/pkg/util/
//! httpstream/spdy`, built on moby/spdystream): framing, the zlib header compression with the
//! SPDY/3 dictionary, and a multiplexed connection for either role.
//!
//! What the Kubernetes peers rely on, and therefore what this implements:
//!
//! * control frames SYN_STREAM, SYN_REPLY, RST_STREAM, PING (echoed), GOAWAY, and DATA frames
//!   with the FIN flag as each direction's end; SETTINGS, HEADERS and WINDOW_UPDATE are read
//!   (the header blocks of HEADERS still pass through the decompressor, which is one zlib
//!   stream per direction for the whole connection) and otherwise ignored;
//! * no flow control: spdystream sends no WINDOW_UPDATE and honours none, so neither side
//!   waits for a window; back-pressure is TCP's;
//! * the opener of a stream waits for the peer's SYN_REPLY before writing (client-go does),
//!   the receiver answers SYN_REPLY to accept or RST_STREAM to refuse.
//!
//! Shared by the runtime's streaming server and crictl's streaming client: both ends of the
//! same protocol, so they cannot drift apart.

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot, watch};

/// The protocol version carried in every control frame.
pub const VERSION: u16 = 3;
/// `Upgrade:` token of the HTTP upgrade.
pub const UPGRADE_TOKEN: &str = "SPDY/3.1";

/// Largest DATA payload this side writes in one frame (peers accept up to 16 MiB).
const MAX_CHUNK: usize = 32 * 1024;
/// Largest frame accepted from the peer (the 24-bit length allows 16 MiB).
const MAX_FRAME: usize = (1 << 24) - 1;
/// Chunks buffered per stream between the reader and the stream's consumer.
const STREAM_BUFFER: usize = 64;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

const FLAG_FIN: u8 = 0x01;

/// RST_STREAM status codes.
pub const RST_PROTOCOL_ERROR: u32 = 1;
pub const RST_REFUSED_STREAM: u32 = 3;
pub const RST_CANCEL: u32 = 5;

/// The SPDY/3 header compression dictionary: length-prefixed header names and values
/// followed by a run of common status lines and tokens (draft-mbelshe-httpbis-spdy-00,
/// 2.6.10.1). Both peers must use it byte for byte.
pub fn dictionary() -> &'static [u8] {
    static DICT: OnceLock<Vec<u8>> = OnceLock::new();
    DICT.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = concat!(
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
            "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently",
            "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
            "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct ",
            "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,",
            "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,",
            "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8",
            "charset=iso-8859-1,utf-,*,enq=0.",
        );
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

/// Header name/value pairs of a stream. Names are lower-case on the wire; lookups ignore
/// case (Go canonicalises them when reading).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    pub fn new() -> Headers {
        Headers(Vec::new())
    }

    pub fn with(mut self, name: &str, value: impl Into<String>) -> Headers {
        self.add(name, value);
        self
    }

    pub fn add(&mut self, name: &str, value: impl Into<String>) {
        self.0.push((name.to_ascii_lowercase(), value.into()));
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The uncompressed name/value block: a count, then length-prefixed names and values;
    /// repeated names are joined with NUL as one entry.
    fn encode(&self) -> Vec<u8> {
        let mut grouped: Vec<(&str, Vec<&str>)> = Vec::new();
        for (n, v) in &self.0 {
            match grouped.iter_mut().find(|(g, _)| g == n) {
                Some((_, vs)) => vs.push(v),
                None => grouped.push((n, vec![v])),
            }
        }
        let mut out = Vec::new();
        out.extend_from_slice(&(grouped.len() as u32).to_be_bytes());
        for (n, vs) in grouped {
            let v = vs.join("\0");
            out.extend_from_slice(&(n.len() as u32).to_be_bytes());
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
            out.extend_from_slice(v.as_bytes());
        }
        out
    }

    fn decode(block: &[u8]) -> Result<Headers, String> {
        let mut p = block;
        let mut take = |n: usize| -> Result<&[u8], String> {
            if p.len() < n {
                return Err("truncated header block".into());
            }
            let (a, b) = p.split_at(n);
            p = b;
            Ok(a)
        };
        let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let count = be32(take(4)?);
        let mut h = Headers::new();
        for _ in 0..count {
            let n = be32(take(4)?);
            let name = String::from_utf8_lossy(take(n)?).to_ascii_lowercase();
            let n = be32(take(4)?);
            let value = String::from_utf8_lossy(take(n)?).into_owned();
            for v in value.split('\0') {
                h.0.push((name.clone(), v.to_string()));
            }
        }
        Ok(h)
    }
}

/// One direction's header compressor: a single zlib stream for the whole connection, each
/// header block ending on a sync flush.
struct Compressor(Compress);

impl Compressor {
    fn new() -> Compressor {
        let mut c = Compress::new(Compression::default(), true);
        // A fresh deflate stream always accepts a dictionary.
        let _ = c.set_dictionary(dictionary());
        Compressor(c)
    }

    fn compress(&mut self, input: &[u8]) -> io::Result<Vec<u8>> {
        let mut out: Vec<u8> = Vec::with_capacity(input.len() + 64);
        let mut pos = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            let (in0, out0) = (self.0.total_in(), out.len());
            self.0
                .compress_vec(&input[pos..], &mut out, FlushCompress::Sync)
                .map_err(|e| io::Error::other(format!("compressing SPDY headers: {e}")))?;
            pos += (self.0.total_in() - in0) as usize;
            let progress = out.len() > out0 || self.0.total_in() > in0;
            if pos == input.len() && (out.len() < out.capacity() || !progress) {
                return Ok(out);
            }
        }
    }
}

/// The peer's header decompressor (one zlib stream per connection and direction).
struct Decompressor(Decompress);

impl Decompressor {
    fn new() -> Decompressor {
        Decompressor(Decompress::new(true))
    }

    fn decompress(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        let mut out: Vec<u8> = Vec::with_capacity(input.len() * 4 + 64);
        let mut pos = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            let (in0, out0) = (self.0.total_in(), out.len());
            let r = self
                .0
                .decompress_vec(&input[pos..], &mut out, FlushDecompress::Sync);
            pos += (self.0.total_in() - in0) as usize;
            match r {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.0
                        .set_dictionary(dictionary())
                        .map_err(|e| format!("SPDY header dictionary rejected: {e}"))?;
                    continue;
                }
                Err(e) => return Err(format!("decompressing SPDY headers: {e}")),
            }
            let progress = out.len() > out0 || self.0.total_in() > in0;
            if (pos == input.len() && out.len() < out.capacity()) || !progress {
                return Ok(out);
            }
        }
    }
}

/// A frame as read from the wire.
#[derive(Debug)]
enum Frame {
    SynStream {
        id: u32,
        fin: bool,
        headers: Headers,
    },
    SynReply {
        id: u32,
        fin: bool,
    },
    RstStream {
        id: u32,
    },
    Ping(u32),
    GoAway,
    Data {
        id: u32,
        fin: bool,
        data: Bytes,
    },
    /// SETTINGS, WINDOW_UPDATE, HEADERS and unknown types: nothing to do.
    Ignored,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    dec: &mut Decompressor,
) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 8];
    // A clean end of the stream between frames is the peer closing the connection.
    let mut got = 0;
    while got < head.len() {
        let n = r.read(&mut head[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        got += n;
    }
    let flags = head[4];
    let len = (u32::from_be_bytes([0, head[5], head[6], head[7]])) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::other("SPDY frame too large"));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    if head[0] & 0x80 == 0 {
        return Ok(Some(Frame::Data {
            id: be32(&head[..4]) & 0x7fff_ffff,
            fin: flags & FLAG_FIN != 0,
            data: Bytes::from(payload),
        }));
    }
    let version = u16::from_be_bytes([head[0], head[1]]) & 0x7fff;
    if version != VERSION {
        return Err(bad(&format!("unsupported SPDY version {version}")));
    }
    let kind = u16::from_be_bytes([head[2], head[3]]);
    let headers = |dec: &mut Decompressor, block: &[u8]| -> io::Result<Headers> {
        let raw = dec.decompress(block).map_err(|e| bad(&e))?;
        Headers::decode(&raw).map_err(|e| bad(&e))
    };
    Ok(Some(match kind {
        TYPE_SYN_STREAM => {
            if payload.len() < 10 {
                return Err(bad("short SYN_STREAM"));
            }
            let h = headers(dec, &payload[10..])?;
            Frame::SynStream {
                id: be32(&payload[..4]) & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
                headers: h,
            }
        }
        TYPE_SYN_REPLY => {
            if payload.len() < 4 {
                return Err(bad("short SYN_REPLY"));
            }
            headers(dec, &payload[4..])?;
            Frame::SynReply {
                id: be32(&payload[..4]) & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
            }
        }
        TYPE_HEADERS => {
            if payload.len() < 4 {
                return Err(bad("short HEADERS"));
            }
            // Keeps the decompressor in step; nothing in these protocols uses them.
            headers(dec, &payload[4..])?;
            Frame::Ignored
        }
        TYPE_RST_STREAM => {
            if payload.len() < 8 {
                return Err(bad("short RST_STREAM"));
            }
            Frame::RstStream {
                id: be32(&payload[..4]) & 0x7fff_ffff,
            }
        }
        TYPE_PING => {
            if payload.len() < 4 {
                return Err(bad("short PING"));
            }
            Frame::Ping(be32(&payload[..4]))
        }
        TYPE_GOAWAY => Frame::GoAway,
        TYPE_SETTINGS | TYPE_WINDOW_UPDATE => Frame::Ignored,
        _ => Frame::Ignored,
    }))
}

fn control_head(out: &mut Vec<u8>, kind: u16, flags: u8, len: usize) {
    out.extend_from_slice(&(0x8000u16 | VERSION).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
}

/// What the writer task puts on the wire.
enum Out {
    SynStream {
        id: u32,
        headers: Headers,
        fin: bool,
    },
    SynReply {
        id: u32,
    },
    Rst {
        id: u32,
        status: u32,
    },
    Data {
        id: u32,
        data: Bytes,
        fin: bool,
    },
    Ping(u32),
    GoAway {
        last_good: u32,
    },
    /// Flush, shut the write half down, acknowledge.
    Shutdown(oneshot::Sender<()>),
}

fn encode(out: Out, comp: &mut Compressor, buf: &mut Vec<u8>) -> io::Result<()> {
    match out {
        Out::SynStream { id, headers, fin } => {
            let block = comp.compress(&headers.encode())?;
            control_head(
                buf,
                TYPE_SYN_STREAM,
                if fin { FLAG_FIN } else { 0 },
                10 + block.len(),
            );
            buf.extend_from_slice(&id.to_be_bytes());
            buf.extend_from_slice(&0u32.to_be_bytes());
            buf.extend_from_slice(&[0, 0]);
            buf.extend_from_slice(&block);
        }
        Out::SynReply { id } => {
            let block = comp.compress(&Headers::new().encode())?;
            control_head(buf, TYPE_SYN_REPLY, 0, 4 + block.len());
            buf.extend_from_slice(&id.to_be_bytes());
            buf.extend_from_slice(&block);
        }
        Out::Rst { id, status } => {
            control_head(buf, TYPE_RST_STREAM, 0, 8);
            buf.extend_from_slice(&id.to_be_bytes());
            buf.extend_from_slice(&status.to_be_bytes());
        }
        Out::Data { id, data, fin } => {
            buf.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
            buf.push(if fin { FLAG_FIN } else { 0 });
            buf.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
            buf.extend_from_slice(&data);
        }
        Out::Ping(id) => {
            control_head(buf, TYPE_PING, 0, 4);
            buf.extend_from_slice(&id.to_be_bytes());
        }
        Out::GoAway { last_good } => {
            control_head(buf, TYPE_GOAWAY, 0, 8);
            buf.extend_from_slice(&last_good.to_be_bytes());
            buf.extend_from_slice(&0u32.to_be_bytes());
        }
        Out::Shutdown(_) => {}
    }
    Ok(())
}

/// Which end of the connection this is: clients open odd-numbered streams, servers even.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

struct Slot {
    data: Option<mpsc::Sender<Bytes>>,
    reply: Option<oneshot::Sender<bool>>,
    reset: Arc<AtomicBool>,
    local_fin: bool,
}

struct Shared {
    role: Role,
    out: mpsc::Sender<Out>,
    streams: Mutex<HashMap<u32, Slot>>,
    next_id: Mutex<u32>,
    last_received: Mutex<u32>,
    closed: watch::Receiver<bool>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A SPDY connection over an upgraded HTTP connection (or any byte stream).
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
}

/// Streams the peer opens, in order.
pub struct Incoming {
    rx: mpsc::Receiver<Stream>,
}

impl Incoming {
    pub async fn next(&mut self) -> Option<Stream> {
        self.rx.recv().await
    }
}

/// Starts the reader and writer tasks (on the current tokio runtime) over `io`.
pub fn start<IO>(io: IO, role: Role) -> (Connection, Incoming)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(io);
    let (out_tx, out_rx) = mpsc::channel(256);
    let (closed_tx, closed_rx) = watch::channel(false);
    let (in_tx, in_rx) = mpsc::channel(32);
    let shared = Arc::new(Shared {
        role,
        out: out_tx,
        streams: Mutex::new(HashMap::new()),
        next_id: Mutex::new(if role == Role::Client { 1 } else { 2 }),
        last_received: Mutex::new(0),
        closed: closed_rx,
    });
    tokio::spawn(writer(w, out_rx));
    tokio::spawn(reader(r, Arc::clone(&shared), in_tx, closed_tx));
    (Connection { shared }, Incoming { rx: in_rx })
}

async fn writer<W: AsyncWrite>(w: W, mut rx: mpsc::Receiver<Out>) {
    let w = BufWriter::with_capacity(64 * 1024, w);
    let mut comp = Compressor::new();
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut w = std::pin::pin!(w);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(out) = next.take() {
            if let Out::Shutdown(ack) = out {
                let _ = w.flush().await;
                let _ = w.shutdown().await;
                let _ = ack.send(());
                // Anything queued after the shutdown is dropped with the receiver.
                return;
            }
            buf.clear();
            if encode(out, &mut comp, &mut buf).is_err() || w.write_all(&buf).await.is_err() {
                return;
            }
            next = rx.try_recv().ok();
        }
        if w.flush().await.is_err() {
            return;
        }
    }
    let _ = w.flush().await;
}

async fn reader<R: AsyncRead>(
    r: R,
    shared: Arc<Shared>,
    incoming: mpsc::Sender<Stream>,
    closed: watch::Sender<bool>,
) {
    let mut r = std::pin::pin!(r);
    let mut dec = Decompressor::new();
    let mut gone_away = false;
    let peer_parity = if shared.role == Role::Server { 1 } else { 0 };
    loop {
        let frame = match read_frame(&mut r, &mut dec).await {
            Ok(Some(f)) => f,
            Ok(None) | Err(_) => break,
        };
        match frame {
            Frame::SynStream { id, fin, headers } => {
                if gone_away || id == 0 || id % 2 != peer_parity {
                    let _ = shared
                        .out
                        .send(Out::Rst {
                            id,
                            status: if gone_away {
                                RST_REFUSED_STREAM
                            } else {
                                RST_PROTOCOL_ERROR
                            },
                        })
                        .await;
                    continue;
                }
                *lock(&shared.last_received) = id;
                let (tx, rx) = mpsc::channel(STREAM_BUFFER);
                let reset = Arc::new(AtomicBool::new(false));
                lock(&shared.streams).insert(
                    id,
                    Slot {
                        data: if fin { None } else { Some(tx) },
                        reply: None,
                        reset: Arc::clone(&reset),
                        local_fin: false,
                    },
                );
                let stream = Stream {
                    id,
                    headers,
                    rx,
                    writer: StreamWriter {
                        id,
                        shared: Arc::clone(&shared),
                        reset,
                        fin_sent: Arc::new(AtomicBool::new(false)),
                    },
                };
                if incoming.send(stream).await.is_err() {
                    lock(&shared.streams).remove(&id);
                    let _ = shared
                        .out
                        .send(Out::Rst {
                            id,
                            status: RST_REFUSED_STREAM,
                        })
                        .await;
                }
            }
            Frame::SynReply { id, fin } => {
                let mut streams = lock(&shared.streams);
                if let Some(slot) = streams.get_mut(&id) {
                    if let Some(r) = slot.reply.take() {
                        let _ = r.send(true);
                    }
                    if fin {
                        slot.data = None;
                    }
                }
            }
            Frame::Data { id, fin, data } => {
                let tx = lock(&shared.streams).get(&id).and_then(|s| s.data.clone());
                if let Some(tx) = tx
                    && !data.is_empty()
                {
                    // A consumer that went away just loses the data.
                    let _ = tx.send(data).await;
                }
                if fin {
                    remote_fin(&shared, id);
                }
            }
            Frame::RstStream { id } => {
                if let Some(slot) = lock(&shared.streams).remove(&id) {
                    slot.reset.store(true, Ordering::SeqCst);
                    if let Some(r) = slot.reply {
                        let _ = r.send(false);
                    }
                }
            }
            Frame::Ping(id) => {
                if id % 2 == peer_parity {
                    let _ = shared.out.send(Out::Ping(id)).await;
                }
            }
            Frame::GoAway => gone_away = true,
            Frame::Ignored => {}
        }
    }
    // The peer is gone: every stream ends, pending opens fail.
    for (_, slot) in lock(&shared.streams).drain() {
        slot.reset.store(true, Ordering::SeqCst);
        if let Some(r) = slot.reply {
            let _ = r.send(false);
        }
    }
    let _ = closed.send(true);
}

fn remote_fin(shared: &Shared, id: u32) {
    let mut streams = lock(&shared.streams);
    if let Some(slot) = streams.get_mut(&id) {
        slot.data = None;
        if slot.local_fin {
            streams.remove(&id);
        }
    }
}

impl Connection {
    /// Opens a stream (client role) and waits up to `timeout` for the peer's SYN_REPLY.
    pub async fn open(&self, headers: Headers, timeout: Duration) -> io::Result<Stream> {
        let id = {
            let mut next = lock(&self.shared.next_id);
            let id = *next;
            *next += 2;
            id
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let (reply_tx, reply_rx) = oneshot::channel();
        let reset = Arc::new(AtomicBool::new(false));
        if self.is_closed() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the SPDY connection is closed",
            ));
        }
        lock(&self.shared.streams).insert(
            id,
            Slot {
                data: Some(tx),
                reply: Some(reply_tx),
                reset: Arc::clone(&reset),
                local_fin: false,
            },
        );
        self.shared
            .out
            .send(Out::SynStream {
                id,
                headers: headers.clone(),
                fin: false,
            })
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        match tokio::time::timeout(timeout, reply_rx).await {
            Ok(Ok(true)) => Ok(Stream {
                id,
                headers,
                rx,
                writer: StreamWriter {
                    id,
                    shared: Arc::clone(&self.shared),
                    reset,
                    fin_sent: Arc::new(AtomicBool::new(false)),
                },
            }),
            Ok(_) => {
                lock(&self.shared.streams).remove(&id);
                Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("the server refused stream {id} ({headers:?})"),
                ))
            }
            Err(_) => {
                lock(&self.shared.streams).remove(&id);
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("timed out waiting for the reply to stream {id}"),
                ))
            }
        }
    }

    /// Sends GOAWAY (no new streams from the peer will be accepted).
    pub async fn go_away(&self) {
        let last_good = *lock(&self.shared.last_received);
        let _ = self.shared.out.send(Out::GoAway { last_good }).await;
    }

    /// Flushes everything queued so far and shuts the write half of the connection down.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.shared.out.send(Out::Shutdown(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Resolves once the peer closed the connection (or it failed).
    pub async fn closed(&self) {
        let mut rx = self.shared.closed.clone();
        let _ = rx.wait_for(|c| *c).await;
    }

    pub fn is_closed(&self) -> bool {
        *self.shared.closed.borrow()
    }
}

/// One stream: its headers, the peer's data (until its FIN) and a writer.
pub struct Stream {
    id: u32,
    headers: Headers,
    rx: mpsc::Receiver<Bytes>,
    writer: StreamWriter,
}

impl Stream {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The next chunk from the peer; `None` after its FIN, a reset or the connection's end.
    pub async fn read(&mut self) -> Option<Bytes> {
        self.rx.recv().await
    }

    pub fn writer(&self) -> StreamWriter {
        self.writer.clone()
    }

    /// Accepts a stream the peer opened (SYN_REPLY).
    pub async fn reply(&self) -> io::Result<()> {
        self.writer
            .shared
            .out
            .send(Out::SynReply { id: self.id })
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }

    pub fn into_parts(self) -> (mpsc::Receiver<Bytes>, StreamWriter) {
        (self.rx, self.writer)
    }
}

/// The sending half of a stream; clones share the stream.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    shared: Arc<Shared>,
    reset: Arc<AtomicBool>,
    fin_sent: Arc<AtomicBool>,
}

impl StreamWriter {
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Sends `data` (in frames of at most 32 KiB).
    pub async fn write(&self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(MAX_CHUNK) {
            if self.reset.load(Ordering::SeqCst) {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    format!("stream {} was reset", self.id),
                ));
            }
            if self.fin_sent.load(Ordering::SeqCst) {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    format!("write on closed stream {}", self.id),
                ));
            }
            self.shared
                .out
                .send(Out::Data {
                    id: self.id,
                    data: Bytes::copy_from_slice(chunk),
                    fin: false,
                })
                .await
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        }
        Ok(())
    }

    /// Half-closes this side of the stream (an empty DATA frame with FIN), once.
    pub async fn close(&self) {
        if self.fin_sent.swap(true, Ordering::SeqCst) || self.reset.load(Ordering::SeqCst) {
            return;
        }
        let _ = self
            .shared
            .out
            .send(Out::Data {
                id: self.id,
                data: Bytes::new(),
                fin: true,
            })
            .await;
        let mut streams = lock(&self.shared.streams);
        if let Some(slot) = streams.get_mut(&self.id) {
            slot.local_fin = true;
            if slot.data.is_none() {
                streams.remove(&self.id);
            }
        }
    }

    /// Aborts the stream in both directions (RST_STREAM).
    pub async fn reset(&self, status: u32) {
        if self.reset.swap(true, Ordering::SeqCst) {
            return;
        }
        lock(&self.shared.streams).remove(&self.id);
        let _ = self
            .shared
            .out
            .send(Out::Rst {
                id: self.id,
                status,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_is_the_spdy3_one() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b"charset=iso-8859-1,utf-,*,enq=0."));
        // zlib's dictionary id (Adler-32) as every SPDY/3 implementation computes it.
        let mut c = Compress::new(Compression::default(), true);
        let adler = c.set_dictionary(d).unwrap();
        assert_eq!(adler, 0xe3c6_a7c2);
    }

    #[test]
    fn header_blocks_round_trip_through_one_zlib_stream_each_way() {
        let mut c = Compressor::new();
        let mut d = Decompressor::new();
        for i in 0..5 {
            let h = Headers::new()
                .with("streamType", "stdout")
                .with("port", i.to_string())
                .with("X-Multi", "a")
                .with("x-multi", "b");
            let block = c.compress(&h.encode()).unwrap();
            let back = Headers::decode(&d.decompress(&block).unwrap()).unwrap();
            assert_eq!(back.get("streamtype"), Some("stdout"));
            assert_eq!(back.get("PORT"), Some(i.to_string().as_str()));
            let multi: Vec<&str> = back
                .iter()
                .filter(|(n, _)| *n == "x-multi")
                .map(|(_, v)| v)
                .collect();
            assert_eq!(multi, ["a", "b"]);
        }
    }

    #[tokio::test]
    async fn reads_a_syn_stream_compressed_by_another_implementation() {
        // A SYN_STREAM from node-spdy's test suite (zlib with the SPDY/3 dictionary).
        let hex = "800300010000002c0000000100000000000078f9e3c6a7c202e50e507ab442a45a77d7105006b32a4804974d8cfa00000000ffff";
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let mut r = &bytes[..];
        let mut d = Decompressor::new();
        match read_frame(&mut r, &mut d).await.unwrap().unwrap() {
            Frame::SynStream { id, fin, headers } => {
                assert_eq!((id, fin), (1, false));
                assert_eq!(headers.get(":method"), Some("GET"));
                assert_eq!(headers.get(":path"), Some("/"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn streams_carry_data_fin_and_resets_both_ways() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (client, _none) = start(a, Role::Client);
        let (server, mut incoming) = start(b, Role::Server);
        let srv = tokio::spawn(async move {
            let mut s = incoming.next().await.unwrap();
            assert_eq!(s.headers().get("streamtype"), Some("stdin"));
            s.reply().await.unwrap();
            let mut got = Vec::new();
            while let Some(c) = s.read().await {
                got.extend_from_slice(&c);
            }
            let w = s.writer();
            w.write(&got).await.unwrap();
            w.write(&vec![7u8; 100_000]).await.unwrap();
            w.close().await;
            // A second stream is refused.
            let s2 = incoming.next().await.unwrap();
            s2.writer().reset(RST_REFUSED_STREAM).await;
            server.go_away().await;
            server.shutdown().await;
        });
        let s = client
            .open(
                Headers::new().with("streamType", "stdin"),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        let (mut rx, w) = s.into_parts();
        w.write(b"hello").await.unwrap();
        w.close().await;
        let mut back = Vec::new();
        while let Some(c) = rx.recv().await {
            back.extend_from_slice(&c);
        }
        assert_eq!(&back[..5], b"hello");
        assert_eq!(back.len(), 5 + 100_000);
        let e = client
            .open(Headers::new().with("a", "b"), Duration::from_secs(5))
            .await;
        assert!(e.is_err());
        srv.await.unwrap();
        client.closed().await;
    }
}
