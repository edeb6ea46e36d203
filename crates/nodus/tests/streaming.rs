//! The CRI streaming server of `nodus runtime`: Exec, Attach and PortForward URLs served over
//! SPDY/3.1 and WebSocket, driven by crictl's client library and by `nodus crictl`, against
//! real containers on a test node in its own network namespace (as in runtime_service.rs).
//!
//! The streaming server listens on 127.0.0.1 inside the node's namespace, so the test
//! dials it from a thread that entered that namespace.

mod common;

use common::*;
use cri::runtime::v1 as pb;
use nodus_crictl::stream::{
    self, Output, SpdyPortForward, StreamError, StreamOptions, TerminalSize, Transport,
};
use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const SUBNET: &str = "10.98.0.0/24";

async fn node() -> TestNode {
    TestNode::new(SUBNET).await
}

/// Streaming requests to a test node and connections inside its network namespace.
impl TestNode {
    async fn exec_url(
        &self,
        id: &str,
        cmd: &[&str],
        o: StreamOptions,
    ) -> Result<String, tonic::Status> {
        self.c
            .runtime
            .clone()
            .exec(pb::ExecRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                tty: o.tty,
                stdin: o.stdin,
                stdout: o.stdout,
                stderr: o.stderr,
            })
            .await
            .map(|r| r.into_inner().url)
    }

    async fn attach_url(&self, id: &str, o: StreamOptions) -> Result<String, tonic::Status> {
        self.c
            .runtime
            .clone()
            .attach(pb::AttachRequest {
                container_id: id.into(),
                tty: o.tty,
                stdin: o.stdin,
                stdout: o.stdout,
                stderr: o.stderr,
            })
            .await
            .map(|r| r.into_inner().url)
    }

    async fn port_forward_url(
        &self,
        sandbox: &str,
        ports: &[i32],
    ) -> Result<String, tonic::Status> {
        self.c
            .runtime
            .clone()
            .port_forward(pb::PortForwardRequest {
                pod_sandbox_id: sandbox.into(),
                port: ports.to_vec(),
            })
            .await
            .map(|r| r.into_inner().url)
    }

    /// A TCP connection to `addr` made inside the node's network namespace.
    fn dial_std(&self, addr: SocketAddr) -> std::net::TcpStream {
        let ns = std::fs::File::open(self.netns.path()).expect("open netns");
        std::thread::spawn(move || {
            // SAFETY: setns on this short-lived thread only.
            assert_eq!(
                unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
                0,
                "setns: {}",
                std::io::Error::last_os_error()
            );
            std::net::TcpStream::connect(addr).expect("connect in the node's netns")
        })
        .join()
        .expect("dialer thread")
    }

    /// A connection to the streaming server of `url`.
    fn dial(&self, url: &str) -> tokio::net::TcpStream {
        let s = self.dial_std(addr_of(url));
        s.set_nonblocking(true).unwrap();
        tokio::net::TcpStream::from_std(s).unwrap()
    }

    fn crictl(&self) -> std::process::Command {
        let mut c = self.netns.command(nodus_bin()).unwrap();
        c.arg("crictl").arg("-r").arg(self.rt.endpoint());
        c
    }
}

fn addr_of(url: &str) -> SocketAddr {
    let rest = url.strip_prefix("http://").expect("http URL");
    rest.split('/').next().unwrap().parse().expect("host:port")
}

fn opts(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> StreamOptions {
    StreamOptions {
        stdin,
        stdout,
        stderr,
        tty,
    }
}

/// Everything a session printed, and how it ended.
struct Ran {
    stdout: String,
    stderr: String,
    result: Result<(), StreamError>,
}

/// Runs a session to its end, feeding `input` to stdin (then ending it) and `sizes` to the
/// terminal before the input.
async fn drive(
    n: &TestNode,
    url: &str,
    transport: Transport,
    o: StreamOptions,
    sizes: &[TerminalSize],
    input: &[&str],
) -> Ran {
    let mut s = stream::start(n.dial(url), url, transport, o)
        .await
        .expect("session");
    if let Some(r) = &s.resize {
        for size in sizes {
            r.send(*size).await.unwrap();
        }
    }
    if let Some(tx) = s.stdin.take() {
        let input: Vec<String> = input.iter().map(|c| c.to_string()).collect();
        tokio::spawn(async move {
            for chunk in input {
                if chunk == "<pause>" {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    continue;
                }
                if tx.send(chunk.into_bytes().into()).await.is_err() {
                    return;
                }
            }
        });
    }
    let mut ran = Ran {
        stdout: String::new(),
        stderr: String::new(),
        result: Ok(()),
    };
    let collect = async {
        while let Some(o) = s.output.recv().await {
            match o {
                Output::Stdout(b) => ran.stdout.push_str(&String::from_utf8_lossy(&b)),
                Output::Stderr(b) => ran.stderr.push_str(&String::from_utf8_lossy(&b)),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), collect)
        .await
        .expect("session output ends");
    ran.result = tokio::time::timeout(Duration::from_secs(10), s.wait())
        .await
        .expect("session outcome");
    ran
}

/// One raw HTTP request to the streaming server; returns the status line.
fn http_status(n: &TestNode, url: &str) -> String {
    let path = &url["http://".len()..];
    let path = &path[path.find('/').unwrap()..];
    let mut s = n.dial_std(addr_of(url));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.lines().next().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_over_spdy_and_websocket_with_stdin_tty_exit_codes_and_errors() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("exec");
    let sb = n.run_sandbox(&sb_cfg).await;
    let id = n
        .run(&sb, &sb_cfg, n.container_config("main", &["sleep", "3600"]))
        .await;

    for t in [Transport::Websocket, Transport::Spdy] {
        // stdout and stderr apart, the exit code through the status.
        let cmd = ["sh", "-c", "echo out; echo err >&2; exit 3"];
        let url = n
            .exec_url(&id, &cmd, opts(false, true, true, false))
            .await
            .unwrap();
        assert!(url.contains("/exec/"), "{url}");
        let r = drive(&n, &url, t, opts(false, true, true, false), &[], &[]).await;
        assert_eq!(
            (r.stdout.as_str(), r.stderr.as_str()),
            ("out\n", "err\n"),
            "{t:?}"
        );
        assert_eq!(
            r.result.as_ref().err().and_then(|e| e.exit_code()),
            Some(3),
            "{t:?}: {:?}",
            r.result
        );

        // stdin piped to cat, its end is cat's end of input.
        let url = n
            .exec_url(&id, &["cat"], opts(true, true, true, false))
            .await
            .unwrap();
        let r = drive(
            &n,
            &url,
            t,
            opts(true, true, true, false),
            &[],
            &["hello ", "world\n"],
        )
        .await;
        assert_eq!(r.stdout, "hello world\n", "{t:?}");
        assert!(r.result.is_ok(), "{t:?}: {:?}", r.result);

        // A terminal: sized before the command reads it, resized while it runs.
        let o = opts(true, true, false, true);
        let url = n.exec_url(&id, &["sh"], o).await.unwrap();
        let r = drive(
            &n,
            &url,
            t,
            o,
            &[TerminalSize {
                width: 123,
                height: 45,
            }],
            &[
                "<pause>",
                "stty size\n",
                "<pause>",
                "tty\n",
                "<pause>",
                "exit 7\n",
            ],
        )
        .await;
        assert!(r.stdout.contains("45 123"), "{t:?}: {:?}", r.stdout);
        assert!(r.stdout.contains("/dev/pts/"), "{t:?}: {:?}", r.stdout);
        assert_eq!(
            r.result.as_ref().err().and_then(|e| e.exit_code()),
            Some(7),
            "{t:?}: {:?}",
            r.result
        );
    }

    // A resize after the start reaches the running command (SIGWINCH + TIOCSWINSZ).
    let o = opts(true, true, false, true);
    let url = n.exec_url(&id, &["sh"], o).await.unwrap();
    let mut s = stream::start(n.dial(&url), &url, Transport::Spdy, o)
        .await
        .unwrap();
    let resize = s.resize.clone().unwrap();
    let stdin = s.stdin.take().unwrap();
    resize
        .send(TerminalSize {
            width: 100,
            height: 30,
        })
        .await
        .unwrap();
    // The resize and stdin travel on different streams: ask until the new size shows
    // instead of guessing how long the resize takes.
    let mut out = String::new();
    for _ in 0..50 {
        stdin.send(b"stty size\n".to_vec().into()).await.unwrap();
        while let Ok(Some(o)) =
            tokio::time::timeout(Duration::from_millis(200), s.output.recv()).await
        {
            if let Output::Stdout(b) = o {
                out.push_str(&String::from_utf8_lossy(&b));
            }
        }
        if out.contains("30 100") {
            break;
        }
    }
    stdin.send(b"exit 0\n".to_vec().into()).await.unwrap();
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(10), s.output.recv()).await {}
    assert!(out.contains("30 100"), "{out:?}");
    assert!(s.wait().await.is_ok());

    // A command that cannot start: the runtime's error, not an exit code.
    let url = n
        .exec_url(&id, &["/no/such/binary"], opts(false, true, true, false))
        .await
        .unwrap();
    let r = drive(
        &n,
        &url,
        Transport::Spdy,
        opts(false, true, true, false),
        &[],
        &[],
    )
    .await;
    let e = r.result.unwrap_err().to_string();
    assert!(
        e.contains("/no/such/binary") && e.contains("Internal error occurred"),
        "{e}"
    );

    // Tokens: single use, unknown ones are 404s; a session's token is gone once used.
    let url = n
        .exec_url(&id, &["true"], opts(false, true, false, false))
        .await
        .unwrap();
    let bogus = format!("{}/exec/AAAAAAAAAAA", &url[..url.find("/exec/").unwrap()]);
    assert!(http_status(&n, &bogus).contains(" 404 "), "unknown token");
    let plain = http_status(&n, &url);
    assert!(plain.contains(" 400 "), "no upgrade headers: {plain}");
    assert!(
        http_status(&n, &url).contains(" 404 "),
        "the token was used up"
    );
    let pf = n.port_forward_url(&sb, &[80]).await.unwrap();
    let wrong = pf.replace("/portforward/", "/exec/");
    assert!(
        http_status(&n, &wrong).contains(" 404 "),
        "a token only opens its own kind"
    );

    // Validation, as the kubelet's streaming server and containerd answer.
    let e = n
        .exec_url(&id, &["true"], opts(false, true, true, true))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("tty and stderr cannot both be true"),
        "{e:?}"
    );
    let e = n
        .exec_url(&id, &["true"], opts(false, false, false, false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(e.message(), "one of stdin, stdout, or stderr must be set");
    let e = n
        .exec_url(&id, &[], opts(false, true, false, false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = n
        .exec_url("nope", &["true"], opts(false, true, false, false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let e = n
        .attach_url(&id, opts(false, false, false, false))
        .await
        .unwrap_err();
    assert_eq!(e.message(), "one of stdin, stdout, and stderr must be set");
    let e = n.port_forward_url("nope", &[80]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let e = n.port_forward_url("", &[80]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let done = n
        .run(&sb, &sb_cfg, n.container_config("done", &["true"]))
        .await;
    let mut state = 0;
    for _ in 0..100 {
        let s =
            n.c.runtime
                .clone()
                .container_status(pb::ContainerStatusRequest {
                    container_id: done.clone(),
                    verbose: false,
                })
                .await
                .unwrap()
                .into_inner()
                .status
                .unwrap();
        state = s.state;
        if state == pb::ContainerState::ContainerExited as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, pb::ContainerState::ContainerExited as i32);
    let e = n
        .exec_url(&done, &["true"], opts(false, true, false, false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("CONTAINER_EXITED"), "{e:?}");
    let e = n
        .attach_url(&done, opts(false, true, false, false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");

    // nodus crictl: output, exit status and message as crictl's.
    let out = n
        .crictl()
        .args(["exec", &id, "sh", "-c", "echo hi; exit 3"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("command terminated with exit code 3"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // --sync (ExecSync) exits with the command's own code, as crictl does.
    let out = n
        .crictl()
        .args(["exec", "--sync", &id, "sh", "-c", "echo synced; exit 4"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("synced"));
    assert_eq!(out.status.code(), Some(4));
    let mut child = n
        .crictl()
        .args(["exec", "-i", "-r", "websocket", &id, "cat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"piped\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "piped\n");
    assert!(out.status.success());

    n.stop_and_remove_sandbox(&sb).await;
    assert!(testkit::leftovers::pod_mounts_under(n.rt.dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn attach_and_port_forward_over_spdy_and_websocket() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("net");
    let sb = n.run_sandbox(&sb_cfg).await;

    // Attach: a container reading its stdin.
    let mut cfg = n.container_config(
        "echo",
        &[
            "sh",
            "-c",
            "while read l; do [ \"$l\" = quit ] && { echo bye; exit 0; }; echo \"got $l\"; echo \"err $l\" >&2; done",
        ],
    );
    cfg.stdin = true;
    let echo = n.run(&sb, &sb_cfg, cfg).await;
    for t in [Transport::Spdy, Transport::Websocket] {
        let o = opts(true, true, true, false);
        let url = n.attach_url(&echo, o).await.unwrap();
        assert!(url.contains("/attach/"), "{url}");
        let mut s = stream::start(n.dial(&url), &url, t, o).await.unwrap();
        let stdin = s.stdin.take().unwrap();
        // The attach is live once the container's answers flow: send until one arrives.
        let (mut out, mut err) = (String::new(), String::new());
        for i in 0..50 {
            stdin
                .send(format!("{t:?}{i}\n").into_bytes().into())
                .await
                .unwrap();
            if let Ok(Some(o)) =
                tokio::time::timeout(Duration::from_millis(200), s.output.recv()).await
            {
                match o {
                    Output::Stdout(b) => out.push_str(&String::from_utf8_lossy(&b)),
                    Output::Stderr(b) => err.push_str(&String::from_utf8_lossy(&b)),
                }
                break;
            }
        }
        while let Ok(Some(o)) =
            tokio::time::timeout(Duration::from_millis(500), s.output.recv()).await
        {
            match o {
                Output::Stdout(b) => out.push_str(&String::from_utf8_lossy(&b)),
                Output::Stderr(b) => err.push_str(&String::from_utf8_lossy(&b)),
            }
        }
        assert!(out.contains(&format!("got {t:?}")), "{t:?}: {out:?}");
        assert!(err.contains(&format!("err {t:?}")), "{t:?}: {err:?}");
        // The end of the client's stdin detaches (the container is not stdin-once).
        drop(stdin);
        while tokio::time::timeout(Duration::from_secs(10), s.output.recv())
            .await
            .expect("attach ends")
            .is_some()
        {}
        assert!(s.wait().await.is_ok());
    }
    // Two attached clients: an output-only one sees what the other's input causes, and
    // ends when the container exits.
    let watch_url = n
        .attach_url(&echo, opts(false, true, false, false))
        .await
        .unwrap();
    let mut watcher = stream::start(
        n.dial(&watch_url),
        &watch_url,
        Transport::Websocket,
        opts(false, true, false, false),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let url = n
        .attach_url(&echo, opts(true, false, false, false))
        .await
        .unwrap();
    let r = drive(
        &n,
        &url,
        Transport::Spdy,
        opts(true, false, false, false),
        &[],
        &["quit\n"],
    )
    .await;
    assert!(r.result.is_ok(), "{:?}", r.result);
    let mut seen = String::new();
    while let Some(o) = tokio::time::timeout(Duration::from_secs(10), watcher.output.recv())
        .await
        .expect("the watcher's attach ends with the container")
    {
        if let Output::Stdout(b) = o {
            seen.push_str(&String::from_utf8_lossy(&b));
        }
    }
    assert!(seen.contains("bye"), "{seen:?}");
    assert!(watcher.wait().await.is_ok());

    // Port-forward to a web server listening in the pod.
    let web = n
        .run(
            &sb,
            &sb_cfg,
            n.container_config(
                "web",
                &[
                    "sh",
                    "-c",
                    "mkdir -p /www && echo hi-from-pod > /www/index.html && exec httpd -f -p 8080 -h /www",
                ],
            ),
        )
        .await;
    let _ = web;
    async fn get(local: tokio::io::DuplexStream) -> String {
        let (mut rd, mut wr) = tokio::io::split(local);
        wr.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), rd.read_to_string(&mut body)).await;
        body
    }
    let url = n.port_forward_url(&sb, &[8080]).await.unwrap();
    assert!(url.contains("/portforward/"), "{url}");
    let pf = Arc::new(SpdyPortForward::connect(n.dial(&url), &url).await.unwrap());
    let mut body = String::new();
    for _ in 0..50 {
        // The server may still be starting: retry until it answers.
        let (mine, theirs) = tokio::io::duplex(64 * 1024);
        let pf2 = Arc::clone(&pf);
        let fwd = tokio::spawn(async move { pf2.forward(8080, theirs).await });
        body = get(mine).await;
        let _ = fwd.await;
        if body.contains("hi-from-pod") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(body.contains("hi-from-pod"), "SPDY: {body:?}");
    // A second connection over the same SPDY connection, and a port nobody listens on.
    let (mine, theirs) = tokio::io::duplex(64 * 1024);
    let pf2 = Arc::clone(&pf);
    let fwd = tokio::spawn(async move { pf2.forward(8080, theirs).await });
    assert!(get(mine).await.contains("hi-from-pod"));
    assert!(fwd.await.unwrap().is_ok());
    let (_mine, theirs) = tokio::io::duplex(1024);
    let e = pf.forward(9, theirs).await.unwrap_err().to_string();
    assert!(e.contains("error forwarding port 9 to pod"), "{e}");

    let url = n.port_forward_url(&sb, &[]).await.unwrap();
    let (mine, theirs) = tokio::io::duplex(64 * 1024);
    let conn = n.dial(&url);
    let u = url.clone();
    let fwd = tokio::spawn(async move { stream::ws_port_forward(conn, &u, 8080, theirs).await });
    let body = get(mine).await;
    assert!(body.contains("hi-from-pod"), "WebSocket: {body:?}");
    assert!(fwd.await.unwrap().is_ok());

    // nodus crictl port-forward: a local listener in the node's namespace.
    let mut child = n
        .crictl()
        .args(["port-forward", &sb, ":8080"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let result = (|| {
        let port: u16 = line
            .trim()
            .strip_prefix("Forwarding from 127.0.0.1:")
            .and_then(|r| r.split(' ').next())
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("unexpected first line {line:?}"))?;
        let mut s = n.dial_std(SocketAddr::from(([127, 0, 0, 1], port)));
        s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut body = String::new();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.read_to_string(&mut body);
        Ok::<_, String>(body)
    })();
    let _ = child.kill();
    let _ = child.wait();
    let body = result.unwrap();
    assert!(
        body.contains("hi-from-pod"),
        "crictl port-forward: {body:?}"
    );

    n.stop_and_remove_sandbox(&sb).await;
    assert!(testkit::leftovers::pod_mounts_under(n.rt.dir.path()).is_empty());
}

/// A stand-in for the API server, just enough for `kubectl exec` and `kubectl
/// port-forward` to one pod "p" (container "c") of the node: discovery, the pod, and the
/// exec/portforward subresources, which it turns into CRI Exec/PortForward calls and then
/// relays, bytes for bytes, to the streaming URL — as the API server and the kubelet relay
/// them to the runtime's streaming server.
async fn fake_apiserver(
    n: Arc<TestNode>,
    container: String,
    sandbox: String,
    upgrades: Arc<std::sync::Mutex<Vec<String>>>,
) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((sock, _)) = l.accept().await {
            let n = Arc::clone(&n);
            let (container, sandbox) = (container.clone(), sandbox.clone());
            let upgrades = Arc::clone(&upgrades);
            tokio::spawn(async move {
                let _ = serve_api(n, sock, &container, &sandbox, &upgrades).await;
            });
        }
    });
    addr
}

async fn serve_api(
    n: Arc<TestNode>,
    mut sock: tokio::net::TcpStream,
    container: &str,
    sandbox: &str,
    upgrades: &std::sync::Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if sock.read(&mut b).await? == 0 {
            return Ok(());
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("").to_string();
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let params: Vec<(String, String)> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), nodus_serving::query::percent_decode(v)))
        .collect();
    let flag = |k: &str| {
        params
            .iter()
            .any(|(pk, v)| pk == k && (v == "true" || v == "1"))
    };
    let pod = "/api/v1/namespaces/default/pods/p";
    let json = |body: serde_json::Value| {
        let body = body.to_string();
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let resp = match path {
        "/api" => json(
            serde_json::json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        ),
        "/apis" => {
            json(serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}))
        }
        "/api/v1" => json(
            serde_json::json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod", "verbs": ["get", "list"], "shortNames": ["po"]},
            {"name": "pods/exec", "singularName": "", "namespaced": true, "kind": "PodExecOptions", "verbs": ["create", "get"]},
            {"name": "pods/portforward", "singularName": "", "namespaced": true, "kind": "PodPortForwardOptions", "verbs": ["create", "get"]}]}),
        ),
        p if p == pod => json(serde_json::json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "busybox", "imageID": "", "state": {"running": {}}}]}})),
        p if p == format!("{pod}/exec") || p == format!("{pod}/portforward") => {
            let url = if p.ends_with("/exec") {
                let cmd: Vec<&str> = params
                    .iter()
                    .filter(|(k, _)| k == "command")
                    .map(|(_, v)| v.as_str())
                    .collect();
                n.exec_url(
                    container,
                    &cmd,
                    opts(flag("stdin"), flag("stdout"), flag("stderr"), flag("tty")),
                )
                .await
            } else {
                n.port_forward_url(sandbox, &[]).await
            };
            let url = url.map_err(|e| std::io::Error::other(e.to_string()))?;
            let new_target = &url[url.find("://").unwrap() + 3..];
            let new_target = &new_target[new_target.find('/').unwrap()..];
            let mut upstream = n.dial(&url);
            let rest: Vec<&str> = lines.collect();
            // Which transport kubectl chose, for the test to check.
            if let Some(u) = rest.iter().find_map(|h| {
                h.split_once(':')
                    .filter(|(k, _)| k.eq_ignore_ascii_case("upgrade"))
            }) {
                upgrades.lock().unwrap().push(format!(
                    "{} {}",
                    path.rsplit('/').next().unwrap_or(""),
                    u.1.trim()
                ));
            }
            upstream
                .write_all(
                    format!("{method} {new_target} HTTP/1.1\r\n{}", rest.join("\r\n")).as_bytes(),
                )
                .await?;
            tokio::io::copy_bidirectional(&mut sock, &mut upstream).await?;
            return Ok(());
        }
        _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string(),
    };
    sock.write_all(resp.as_bytes()).await?;
    sock.shutdown().await
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_exec_and_port_forward_reach_the_streaming_server() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("kubectl");
    let sb = n.run_sandbox(&sb_cfg).await;
    let id = n
        .run(
            &sb,
            &sb_cfg,
            n.container_config(
                "c",
                &["sh", "-c", "mkdir -p /www && echo hi-from-pod > /www/index.html && exec httpd -f -p 8080 -h /www"],
            ),
        )
        .await;
    let n = Arc::new(n);
    let upgrades = Arc::new(std::sync::Mutex::new(Vec::new()));
    let api = fake_apiserver(
        Arc::clone(&n),
        id.clone(),
        sb.clone(),
        Arc::clone(&upgrades),
    )
    .await;
    let cache = tempfile::tempdir().unwrap();
    let kubectl = |ws: bool| {
        let mut c = tokio::process::Command::new("kubectl");
        c.arg(format!("--server=http://{api}"))
            .arg(format!("--cache-dir={}", cache.path().display()))
            .env("KUBECONFIG", "/dev/null")
            .env(
                "KUBECTL_REMOTE_COMMAND_WEBSOCKETS",
                if ws { "true" } else { "false" },
            )
            .env(
                "KUBECTL_PORT_FORWARD_WEBSOCKETS",
                if ws { "true" } else { "false" },
            )
            .kill_on_drop(true);
        c
    };
    for ws in [false, true] {
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            kubectl(ws)
                .args([
                    "exec",
                    "p",
                    "-c",
                    "c",
                    "--",
                    "sh",
                    "-c",
                    "echo out; echo err >&2; exit 3",
                ])
                .output(),
        )
        .await
        .expect("kubectl exec finishes")
        .unwrap();
        let (o, e) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(o, "out\n", "websocket={ws}: {e}");
        assert!(e.starts_with("err\n"), "websocket={ws}: {e}");
        assert!(
            e.contains("command terminated with exit code 3"),
            "websocket={ws}: {e}"
        );
        assert_eq!(out.status.code(), Some(3), "websocket={ws}: {e}");

        let mut child = kubectl(ws)
            .args(["exec", "-i", "p", "--", "cat"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"through kubectl\n").await.unwrap();
        drop(stdin);
        let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .expect("kubectl exec -i finishes")
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "through kubectl\n",
            "websocket={ws}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success());
    }

    // kubectl port-forward (SPDY; with websockets it first tries the tunnelling protocol
    // and falls back to SPDY when the server refuses it).
    for ws in [false, true] {
        let mut child = kubectl(ws)
            .args(["port-forward", "p", ":8080"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(30),
            tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line),
        )
        .await
        .expect("kubectl port-forward listens")
        .unwrap();
        let port: u16 = line
            .trim()
            .strip_prefix("Forwarding from 127.0.0.1:")
            .and_then(|r| r.split(' ').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        for _ in 0..2 {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
                .await
                .unwrap();
            let mut body = String::new();
            let _ =
                tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut body)).await;
            assert!(body.contains("hi-from-pod"), "websocket={ws}: {body:?}");
        }
        let _ = child.kill().await;
    }
    let seen = upgrades.lock().unwrap().clone();
    for want in [
        "exec SPDY/3.1",
        "exec websocket",
        "portforward SPDY/3.1",
        "portforward websocket",
    ] {
        assert!(
            seen.iter().any(|s| s.eq_ignore_ascii_case(want)),
            "{want}: {seen:?}"
        );
    }
    n.stop_and_remove_sandbox(&sb).await;
}
