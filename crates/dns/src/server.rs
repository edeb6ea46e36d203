//! UDP and TCP listeners. Answers from the store are computed inline on the receiving task
//! (microseconds, under a read lock); queries that go upstream run on their own task so a
//! slow upstream never holds the socket.

use crate::answer::{self, Reply, Zone};
use crate::forward::Forwarder;
use crate::records::Records;
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// How long an idle TCP connection is kept (miekg/dns, CoreDNS's server: 8 s idle).
const TCP_IDLE: Duration = Duration::from_secs(8);
/// Receiving threads per UDP socket: one per core keeps both cores answering.
const UDP_WORKERS: usize = 2;
/// How often an idle UDP thread looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);
/// The UDP receive buffer asked for (see [`grow_receive_buffer`]).
const UDP_RCVBUF: libc::c_int = 4 << 20;

/// Everything a query needs.
pub(crate) struct Handler {
    pub(crate) zone: Zone,
    pub(crate) store: Arc<RwLock<Records>>,
    pub(crate) forwarder: Forwarder,
}

/// The transport a query came over: UDP responses must fit the client's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    Udp,
    Tcp,
}

/// What to send back, now or after an upstream exchange.
enum Step {
    Done(Option<Vec<u8>>),
    Later(Box<Pending>),
}

/// A query waiting on the forwarder.
struct Pending {
    req: Message,
    bytes: Vec<u8>,
    chase: Option<(Message, Name, RecordType)>,
}

fn encode(m: &Message, transport: Transport, limit: usize) -> Option<Vec<u8>> {
    let bytes = m.to_vec().ok()?;
    if transport == Transport::Udp && bytes.len() > limit {
        return answer::truncated(m).to_vec().ok();
    }
    Some(bytes)
}

impl Handler {
    fn step(&self, bytes: &[u8], transport: Transport) -> Step {
        let req = match answer::decode(bytes) {
            Ok(r) => r,
            Err(rejected) => return Step::Done(rejected.response().and_then(|m| m.to_vec().ok())),
        };
        let reply = {
            let Ok(store) = self.store.read() else {
                return Step::Done(None);
            };
            answer::answer(&self.zone, &store, &req)
        };
        match reply {
            Reply::Local(m) => Step::Done(encode(&m, transport, answer::udp_limit(&req))),
            Reply::Forward => Step::Later(Box::new(Pending {
                req,
                bytes: bytes.to_vec(),
                chase: None,
            })),
            Reply::Chase {
                response,
                target,
                qtype,
            } => Step::Later(Box::new(Pending {
                req,
                bytes: Vec::new(),
                chase: Some((response, target, qtype)),
            })),
        }
    }

    async fn finish(&self, p: Box<Pending>, transport: Transport) -> Option<Vec<u8>> {
        let limit = answer::udp_limit(&p.req);
        if let Some((mut response, target, qtype)) = p.chase {
            // The CNAME stands even when the target cannot be resolved.
            let mut q = Message::query();
            q.metadata.recursion_desired = true;
            q.add_query(Query::query(target, qtype));
            if let Ok(bytes) = q.to_vec()
                && let Ok(up) = self.forwarder.exchange(&bytes).await
                && let Ok(up) = Message::from_vec(&up)
            {
                response.answers.extend(up.answers);
            }
            return encode(&response, transport, limit);
        }
        match self.forwarder.exchange(&p.bytes).await {
            Ok(bytes) => {
                if transport == Transport::Udp && bytes.len() > limit {
                    // The upstream answered over TCP or with a bigger EDNS size than our
                    // client accepts.
                    let m = Message::from_vec(&bytes).ok()?;
                    return answer::truncated(&m).to_vec().ok();
                }
                Some(bytes)
            }
            Err(e) => {
                tracing::debug!(error = %e, "forwarding failed");
                encode(
                    &answer::response(&p.req, ResponseCode::ServFail),
                    transport,
                    limit,
                )
            }
        }
    }
}

/// Serves UDP on `sock` from [`UDP_WORKERS`] threads of their own until `stop` is set.
///
/// Blocking `recvfrom` on dedicated threads rather than tasks on the async runtime: an
/// answer then costs two syscalls and no reactor round trip or task wake-up (under
/// dnsperf, tasks dropped queries and reached p99 4-7 ms at 30,000 q/s; see
/// docs/PERFORMANCE.md). Forwarded queries still go to the runtime.
pub(crate) fn serve_udp(
    h: Arc<Handler>,
    sock: std::net::UdpSocket,
    rt: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    // Wake up now and then to notice `stop`.
    sock.set_read_timeout(Some(STOP_POLL))?;
    let sock = Arc::new(sock);
    let mut threads = Vec::new();
    for i in 0..UDP_WORKERS {
        let (h, sock, rt, stop) = (h.clone(), sock.clone(), rt.clone(), stop.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("dns-udp-{i}"))
                .spawn(move || udp_worker(&h, &sock, &rt, &stop))?,
        );
    }
    Ok(threads)
}

fn udp_worker(
    h: &Arc<Handler>,
    sock: &Arc<std::net::UdpSocket>,
    rt: &tokio::runtime::Handle,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; 65535];
    while !stop.load(Ordering::Relaxed) {
        let (n, peer) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            // The poll timeout, or an ICMP error from an earlier send: keep serving.
            Err(_) => continue,
        };
        match h.step(&buf[..n], Transport::Udp) {
            Step::Done(Some(out)) => {
                let _ = sock.send_to(&out, peer);
            }
            Step::Done(None) => {}
            Step::Later(p) => {
                let (h, sock) = (h.clone(), sock.clone());
                rt.spawn(async move {
                    if let Some(out) = h.finish(p, Transport::Udp).await {
                        // A datagram send does not wait for the peer: only a full socket
                        // buffer could block it, briefly.
                        let _ = sock.send_to(&out, peer);
                    }
                });
            }
        }
    }
}

/// Asks for a receive buffer of [`UDP_RCVBUF`] bytes: the kernel default (~200 KiB) holds
/// only a few milliseconds of queries at tens of thousands per second, and a server
/// thread descheduled that long would drop them. Root may exceed `net.core.rmem_max`.
fn grow_receive_buffer(sock: &std::net::UdpSocket) {
    use std::os::fd::AsRawFd as _;
    let size: libc::c_int = UDP_RCVBUF;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt reads an int we own for the socket we own.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return;
        }
    }
}

/// Serves TCP on `l` until the task is dropped.
pub(crate) async fn serve_tcp(h: Arc<Handler>, l: TcpListener) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = l.accept() => match accepted {
                Ok((s, _)) => {
                    let h = h.clone();
                    conns.spawn(async move { tcp_conn(h, s).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "tcp accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next() => {}
        }
    }
}

/// Length-prefixed messages, answered in order, until EOF, an idle timeout or a frame we
/// cannot answer.
async fn tcp_conn(h: Arc<Handler>, mut s: TcpStream) {
    loop {
        let Ok(Ok(len)) = tokio::time::timeout(TCP_IDLE, s.read_u16()).await else {
            return;
        };
        let mut buf = vec![0u8; len as usize];
        if tokio::time::timeout(TCP_IDLE, s.read_exact(&mut buf))
            .await
            .ok()
            .and_then(Result::ok)
            .is_none()
        {
            return;
        }
        let out = match h.step(&buf, Transport::Tcp) {
            Step::Done(out) => out,
            Step::Later(p) => h.finish(p, Transport::Tcp).await,
        };
        let Some(out) = out else { return };
        let Ok(n) = u16::try_from(out.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(out.len() + 2);
        framed.extend_from_slice(&n.to_be_bytes());
        framed.extend_from_slice(&out);
        if s.write_all(&framed).await.is_err() {
            return;
        }
    }
}

/// Binds UDP and TCP on every address.
pub(crate) async fn bind(
    listen: &[SocketAddr],
) -> std::io::Result<(Vec<std::net::UdpSocket>, Vec<TcpListener>)> {
    let mut udp = Vec::new();
    let mut tcp = Vec::new();
    for a in listen {
        let u = std::net::UdpSocket::bind(a)
            .map_err(|e| std::io::Error::new(e.kind(), format!("binding udp {a}: {e}")))?;
        grow_receive_buffer(&u);
        udp.push(u);
        tcp.push(
            TcpListener::bind(a)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("binding tcp {a}: {e}")))?,
        );
    }
    Ok((udp, tcp))
}
