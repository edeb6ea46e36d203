//! Protocol tests against a tiny in-process HTTP/1.1 registry on 127.0.0.1.

use super::manifest::*;
use super::*;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Debug, Clone)]
struct Req {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }
    fn query(&self) -> Vec<(String, String)> {
        match self.target.split_once('?') {
            Some((_, q)) => url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect(),
            None => vec![],
        }
    }
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Send the whole body's `Content-Length` but only this many body bytes, then close.
    cut: Option<usize>,
}

impl Resp {
    fn cut(mut self, after: usize) -> Resp {
        self.cut = Some(after);
        self
    }
}

fn resp(status: u16, headers: &[(&str, &str)], body: impl Into<Vec<u8>>) -> Resp {
    Resp {
        status,
        headers: headers
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        body: body.into(),
        cut: None,
    }
}

type Handler = Arc<dyn Fn(&Req) -> Resp + Send + Sync>;

struct Server {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Req>>>,
}

impl Server {
    fn host(&self) -> String {
        self.addr.to_string()
    }
    fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }
}

async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

fn serve(listener: TcpListener, handler: Handler) -> Server {
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = Arc::clone(&log);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let handler = Arc::clone(&handler);
            let log = Arc::clone(&log2);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    let Ok(n) = sock.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if buf[0] == 0x16 {
                        // A TLS ClientHello on a plain-HTTP port: answer as Go's server does.
                        let _ = sock
                            .write_all(b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
                            .await;
                        return;
                    }
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let mut lines = head.split("\r\n");
                let mut first = lines.next().unwrap_or_default().split(' ');
                let method = first.next().unwrap_or_default().to_string();
                let target = first.next().unwrap_or_default().to_string();
                let headers: Vec<(String, String)> = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(a, b)| (a.trim().to_string(), b.trim().to_string()))
                    .collect();
                let len: usize = headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                let mut body = buf[head_end + 4..].to_vec();
                while body.len() < len {
                    let Ok(n) = sock.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        break;
                    }
                    body.extend_from_slice(&chunk[..n]);
                }
                let req = Req {
                    method,
                    target,
                    headers,
                    body,
                };
                let r = handler(&req);
                log.lock().unwrap().push(req);
                let mut out = format!(
                    "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                    r.status,
                    r.body.len()
                );
                for (n, v) in &r.headers {
                    out.push_str(&format!("{n}: {v}\r\n"));
                }
                out.push_str("\r\n");
                let mut bytes = out.into_bytes();
                let sent = r.cut.unwrap_or(r.body.len()).min(r.body.len());
                bytes.extend_from_slice(&r.body[..sent]);
                let _ = sock.write_all(&bytes).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    Server { addr, log }
}

/// An image: config, two layers, an amd64 manifest and an index (amd64 + arm64).
struct Image {
    blobs: HashMap<Digest, Vec<u8>>,
    config: Digest,
    layers: Vec<Digest>,
    manifest: Vec<u8>,
    index: Vec<u8>,
}

fn image() -> Image {
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec();
    let l1 = vec![1u8; 100_000];
    let l2 = b"layer two".to_vec();
    let d = |b: &[u8]| Digest::of(b);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": d(&config).to_string(), "size": config.len()},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d(&l1).to_string(), "size": l1.len()},
            {"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": d(&l2).to_string(), "size": l2.len()},
        ]
    })
    .to_string()
    .into_bytes();
    let arm = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"x","digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":0},"layers":[]}"#;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_INDEX,
        "manifests": [
            {"mediaType": MEDIA_TYPE_OCI_MANIFEST, "digest": d(arm).to_string(), "size": arm.len(), "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"}},
            {"mediaType": MEDIA_TYPE_OCI_MANIFEST, "digest": d(&manifest).to_string(), "size": manifest.len(), "platform": {"architecture": "amd64", "os": "linux"}},
        ]
    })
    .to_string()
    .into_bytes();
    let mut blobs = HashMap::new();
    for b in [&config, &l1, &l2] {
        blobs.insert(d(b), b.clone());
    }
    Image {
        config: d(&config),
        layers: vec![d(&l1), d(&l2)],
        manifest,
        index,
        blobs,
    }
}

#[derive(Clone)]
enum Auth {
    None,
    Basic(&'static str, &'static str),
    /// Bearer token `token`; the token service at `/token` wants these basic credentials
    /// (or none) and answers with `field`.
    Bearer {
        token: &'static str,
        creds: Option<(&'static str, &'static str)>,
        field: &'static str,
    },
    /// Bearer token obtained by POSTing this refresh token.
    Refresh(&'static str),
    /// A fixed bearer token, no token service.
    Static(&'static str),
}

fn basic(u: &str, p: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
    )
}

/// A registry serving `img` as `app:v1` (index) and `single:v1` (the amd64 manifest).
fn registry_handler(img: &Image, auth: Auth, addr: SocketAddr) -> Handler {
    let mut manifests: HashMap<String, (String, Vec<u8>)> = HashMap::new();
    for repo in ["app", "single"] {
        manifests.insert(
            format!("{repo}/{}", Digest::of(&img.manifest)),
            (MEDIA_TYPE_OCI_MANIFEST.into(), img.manifest.clone()),
        );
        manifests.insert(
            format!("{repo}/{}", Digest::of(&img.index)),
            (MEDIA_TYPE_OCI_INDEX.into(), img.index.clone()),
        );
    }
    manifests.insert(
        "app/v1".into(),
        (MEDIA_TYPE_OCI_INDEX.into(), img.index.clone()),
    );
    manifests.insert(
        "single/v1".into(),
        (MEDIA_TYPE_OCI_MANIFEST.into(), img.manifest.clone()),
    );
    let blobs = img.blobs.clone();
    Arc::new(move |req: &Req| {
        let realm = format!("http://{addr}/token");
        if req.path() == "/token" {
            return match &auth {
                Auth::Bearer {
                    token,
                    creds,
                    field,
                } => {
                    let ok = match creds {
                        Some((u, p)) => req.header("authorization") == Some(&basic(u, p)),
                        None => req.header("authorization").is_none(),
                    };
                    if ok && req.method == "GET" {
                        resp(
                            200,
                            &[("Content-Type", "application/json")],
                            format!(r#"{{"{field}":"{token}","expires_in":300}}"#),
                        )
                    } else {
                        resp(
                            401,
                            &[],
                            r#"{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}"#,
                        )
                    }
                }
                Auth::Refresh(rt) => {
                    let form: HashMap<String, String> = url::form_urlencoded::parse(&req.body)
                        .into_owned()
                        .collect();
                    if req.method == "POST"
                        && form.get("grant_type").map(String::as_str) == Some("refresh_token")
                        && form.get("refresh_token").map(String::as_str) == Some(*rt)
                    {
                        resp(
                            200,
                            &[],
                            r#"{"access_token":"from-refresh","expires_in":300}"#,
                        )
                    } else {
                        resp(400, &[], "")
                    }
                }
                _ => resp(404, &[], ""),
            };
        }
        let authorized = match &auth {
            Auth::None => true,
            Auth::Basic(u, p) => req.header("authorization") == Some(&basic(u, p)),
            Auth::Bearer { token, .. } => {
                req.header("authorization") == Some(&format!("Bearer {token}"))
            }
            Auth::Refresh(_) => req.header("authorization") == Some("Bearer from-refresh"),
            Auth::Static(t) => req.header("authorization") == Some(&format!("Bearer {t}")),
        };
        if !authorized {
            let challenge = match &auth {
                Auth::Basic(..) => r#"Basic realm="test""#.to_string(),
                _ => {
                    let scope = req
                        .path()
                        .strip_prefix("/v2/")
                        .and_then(|p| p.split_once("/manifests/").or(p.split_once("/blobs/")))
                        .map(|(repo, _)| format!("repository:{repo}:pull"))
                        .unwrap_or_default();
                    let err = if req.header("authorization").is_some() {
                        r#","error="insufficient_scope""#
                    } else {
                        ""
                    };
                    format!(
                        r#"Bearer realm="{realm}",service="test-registry",scope="{scope}"{err}"#
                    )
                }
            };
            return resp(
                401,
                &[("WWW-Authenticate", &challenge)],
                r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
            );
        }
        let Some(rest) = req.path().strip_prefix("/v2/") else {
            return resp(404, &[], "");
        };
        if let Some((repo, reference)) = rest.split_once("/manifests/") {
            return match manifests.get(&format!("{repo}/{reference}")) {
                Some((ct, body)) => resp(
                    200,
                    &[
                        ("Content-Type", ct),
                        ("Docker-Content-Digest", &Digest::of(body).to_string()),
                    ],
                    body.clone(),
                ),
                None => resp(
                    404,
                    &[],
                    r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
                ),
            };
        }
        if let Some((_, d)) = rest.split_once("/blobs/") {
            return match d.parse::<Digest>().ok().and_then(|d| blobs.get(&d)) {
                Some(b) => resp(
                    200,
                    &[("Content-Type", "application/octet-stream")],
                    b.clone(),
                ),
                None => resp(
                    404,
                    &[],
                    r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}"#,
                ),
            };
        }
        resp(404, &[], "")
    })
}

async fn registry(img: &Image, auth: Auth) -> Server {
    let l = bind().await;
    let addr = l.local_addr().unwrap();
    serve(l, registry_handler(img, auth, addr))
}

fn amd64() -> ClientOptions {
    ClientOptions {
        platform: Platform::new("linux", "amd64", None),
        // Retries as in production, without the waiting.
        retry: RetryPolicy {
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(4),
            ..RetryPolicy::default()
        },
        ..ClientOptions::default()
    }
}

/// A client whose certs.d has `toml` for `registry` (plain HTTP server by default).
fn client(dir: &tempfile::TempDir, registry: &str, toml: Option<String>) -> RegistryClient {
    let toml = toml.unwrap_or_else(|| format!("server = \"http://{registry}\"\n"));
    let d = dir.path().join(registry);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("hosts.toml"), toml).unwrap();
    RegistryClient::with_options(HostsConfig::new(dir.path()), amd64())
}

fn r(s: &str) -> Reference {
    Reference::parse(s).unwrap()
}

async fn read_all(mut s: BlobStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(c) = s.next().await {
        out.extend_from_slice(&c.unwrap());
    }
    out
}

#[tokio::test]
async fn resolves_index_and_streams_blobs() {
    let img = image();
    let srv = registry(&img, Auth::None).await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let res = c
        .resolve(
            &r(&format!("{}/app:v1", srv.host())),
            &Credentials::default(),
        )
        .await
        .unwrap();
    assert_eq!(res.top_digest(), &Digest::of(&img.index));
    assert_eq!(res.top_media_type(), MEDIA_TYPE_OCI_INDEX);
    assert_eq!(res.index().unwrap().1, &img.index[..]);
    assert_eq!(res.manifest_digest(), &Digest::of(&img.manifest));
    assert_eq!(res.manifest_blob().1, &img.manifest[..]);
    assert_eq!(res.platform().unwrap().to_string(), "linux/amd64");
    assert_eq!(res.host, srv.host());
    let m = res.manifest();
    assert_eq!(m.config.digest, img.config);
    assert_eq!(m.layers.len(), 2);
    assert_eq!(
        m.layers[1].media_type,
        "application/vnd.docker.image.rootfs.diff.tar.gzip"
    );

    for (d, want) in &img.blobs {
        let s = c.fetch_blob(&res, d, want.len() as u64).await.unwrap();
        assert_eq!(s.content_length, Some(want.len() as u64));
        assert_eq!(&read_all(s).await, want);
    }
    let cfg = c
        .fetch_blob_bytes(&res, &img.config, img.blobs[&img.config].len() as u64)
        .await
        .unwrap();
    assert_eq!(&cfg[..], &img.blobs[&img.config][..]);

    let reqs = srv.requests();
    let first = &reqs[0];
    assert_eq!(first.path(), "/v2/app/manifests/v1");
    let accept = first.header("accept").unwrap();
    for mt in [
        MEDIA_TYPE_OCI_INDEX,
        MEDIA_TYPE_OCI_MANIFEST,
        MEDIA_TYPE_DOCKER_MANIFEST,
        MEDIA_TYPE_DOCKER_MANIFEST_LIST,
    ] {
        assert!(accept.contains(mt), "{accept}");
    }
    // The registry itself gets no ns parameter.
    assert!(reqs.iter().all(|q| q.query().is_empty()));

    // A single manifest: no index, no platform; by digest too.
    let res = c
        .resolve(
            &r(&format!("{}/single:v1", srv.host())),
            &Credentials::default(),
        )
        .await
        .unwrap();
    assert!(res.index().is_none());
    assert!(res.platform().is_none());
    assert_eq!(res.top_digest(), &Digest::of(&img.manifest));
    let by_digest = c
        .resolve(
            &r(&format!(
                "{}/app:ignored@{}",
                srv.host(),
                Digest::of(&img.index)
            )),
            &Credentials::default(),
        )
        .await
        .unwrap();
    assert_eq!(by_digest.reference.tag, None);
    assert_eq!(by_digest.manifest_digest(), &Digest::of(&img.manifest));
}

#[tokio::test]
async fn loopback_without_configuration_falls_back_to_http() {
    let img = image();
    let srv = registry(&img, Auth::None).await;
    let c = RegistryClient::with_options(HostsConfig::none(), amd64());
    let res = c
        .resolve(
            &r(&format!("{}/app:v1", srv.host())),
            &Credentials::default(),
        )
        .await
        .unwrap();
    assert_eq!(res.manifest_digest(), &Digest::of(&img.manifest));
    // Later requests go straight to HTTP.
    let s = c.fetch_blob(&res, &img.layers[1], 9).await.unwrap();
    assert_eq!(read_all(s).await, b"layer two");
}

#[tokio::test]
async fn basic_auth() {
    let img = image();
    let srv = registry(&img, Auth::Basic("alice", "s3cret")).await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let reference = r(&format!("{}/single:v1", srv.host()));

    let creds = Credentials {
        username: "alice".into(),
        password: "s3cret".into(),
        ..Default::default()
    };
    let res = c.resolve(&reference, &creds).await.unwrap();
    let s = c.fetch_blob(&res, &img.layers[1], 9).await.unwrap();
    assert_eq!(read_all(s).await, b"layer two");
    // The blob request carried the credentials up front (no second 401).
    let reqs = srv.requests();
    assert_eq!(
        reqs.iter()
            .filter(|q| q.header("authorization").is_none())
            .count(),
        1
    );

    // The same credentials as `auth`.
    use base64::Engine as _;
    let creds = Credentials {
        auth: base64::engine::general_purpose::STANDARD.encode("alice:s3cret"),
        ..Default::default()
    };
    c.resolve(&reference, &creds).await.unwrap();

    let bad = Credentials {
        username: "alice".into(),
        password: "wrong".into(),
        ..Default::default()
    };
    let e = c.resolve(&reference, &bad).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized);
    assert_eq!(
        e.to_string(),
        format!(
            "failed to resolve reference \"{}/single:v1\": pull access denied, repository does not exist or may require authorization: authorization failed",
            srv.host()
        )
    );
    let e = c
        .resolve(&reference, &Credentials::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized);
    assert!(e.to_string().ends_with("no basic auth credentials"), "{e}");

    // Credentials for another server are not sent.
    let other = Credentials {
        username: "alice".into(),
        password: "s3cret".into(),
        server_address: "other.example.com".into(),
        ..Default::default()
    };
    let e = c.resolve(&reference, &other).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized);
}

#[tokio::test]
async fn bearer_tokens_are_fetched_once_and_cached() {
    let img = image();
    let srv = registry(
        &img,
        Auth::Bearer {
            token: "tok-1",
            creds: Some(("bob", "pw")),
            field: "token",
        },
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let creds = Credentials {
        username: "bob".into(),
        password: "pw".into(),
        ..Default::default()
    };
    let res = c
        .resolve(&r(&format!("{}/app:v1", srv.host())), &creds)
        .await
        .unwrap();
    for d in &img.layers {
        let want = &img.blobs[d];
        let s = c.fetch_blob(&res, d, want.len() as u64).await.unwrap();
        assert_eq!(&read_all(s).await, want);
    }
    let reqs = srv.requests();
    let tokens: Vec<&Req> = reqs.iter().filter(|q| q.path() == "/token").collect();
    assert_eq!(tokens.len(), 1, "one token request for the whole pull");
    let q = tokens[0].query();
    assert!(
        q.contains(&("service".into(), "test-registry".into())),
        "{q:?}"
    );
    assert!(
        q.contains(&("scope".into(), "repository:app:pull".into())),
        "{q:?}"
    );
    // Only the very first registry request met a 401.
    let unauthenticated = reqs
        .iter()
        .filter(|q| q.path() != "/token" && q.header("authorization").is_none())
        .count();
    assert_eq!(unauthenticated, 1);

    // Wrong credentials: the token service refuses.
    let c2 = client(&tempfile::tempdir().unwrap(), &srv.host(), None);
    let bad = Credentials {
        username: "bob".into(),
        password: "nope".into(),
        ..Default::default()
    };
    let e = c2
        .resolve(&r(&format!("{}/app:v1", srv.host())), &bad)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized);
    let msg = e.to_string();
    assert!(msg.contains("pull access denied"), "{msg}");
    assert!(
        msg.contains("failed to fetch basic-auth token: unexpected status from GET request to"),
        "{msg}"
    );
    assert!(msg.contains("401 Unauthorized"), "{msg}");
}

#[tokio::test]
async fn anonymous_bearer_and_access_token_field() {
    let img = image();
    let srv = registry(
        &img,
        Auth::Bearer {
            token: "anon",
            creds: None,
            field: "access_token",
        },
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let res = c
        .resolve(
            &r(&format!("{}/single:v1", srv.host())),
            &Credentials::default(),
        )
        .await
        .unwrap();
    assert_eq!(res.manifest_digest(), &Digest::of(&img.manifest));
}

#[tokio::test]
async fn identity_token_is_posted_as_refresh_token() {
    let img = image();
    let srv = registry(&img, Auth::Refresh("refresh-me")).await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let creds = Credentials {
        identity_token: "refresh-me".into(),
        ..Default::default()
    };
    c.resolve(&r(&format!("{}/single:v1", srv.host())), &creds)
        .await
        .unwrap();
    let reqs = srv.requests();
    let post = reqs.iter().find(|q| q.path() == "/token").unwrap();
    assert_eq!(post.method, "POST");
    let form: HashMap<String, String> = url::form_urlencoded::parse(&post.body)
        .into_owned()
        .collect();
    assert_eq!(form["scope"], "repository:single:pull");
    assert_eq!(form["service"], "test-registry");
}

#[tokio::test]
async fn registry_token_is_sent_as_is() {
    let img = image();
    let srv = registry(&img, Auth::Static("given")).await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let creds = Credentials {
        registry_token: "given".into(),
        ..Default::default()
    };
    c.resolve(&r(&format!("{}/single:v1", srv.host())), &creds)
        .await
        .unwrap();
    assert!(srv.requests().iter().all(|q| q.path() != "/token"));
}

#[tokio::test]
async fn not_found_reads_like_containerd() {
    let img = image();
    let srv = registry(&img, Auth::None).await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let e = c
        .resolve(&r(&format!("{}/nope", srv.host())), &Credentials::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let h = srv.host();
    assert_eq!(
        e.to_string(),
        format!("failed to resolve reference \"{h}/nope:latest\": {h}/nope:latest: not found")
    );
    // A missing blob.
    let res = c
        .resolve(&r(&format!("{h}/single:v1")), &Credentials::default())
        .await
        .unwrap();
    let e = c
        .fetch_blob(&res, &Digest::of(b"missing"), 7)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("not found"), "{e}");
}

#[tokio::test]
async fn unavailable_registries() {
    // Connection refused.
    let l = bind().await;
    let host = l.local_addr().unwrap().to_string();
    drop(l);
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &host, None);
    let e = c
        .resolve(&r(&format!("{host}/x")), &Credentials::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("failed to resolve reference \"{host}/x:latest\": failed to do request: GET \"http://{host}/v2/x/manifests/latest\"")), "{msg}");
    assert!(msg.to_lowercase().contains("connection refused"), "{msg}");

    // 503.
    let srv = serve(bind().await, Arc::new(|_: &Req| resp(503, &[], "")));
    let c = client(&dir, &srv.host(), None);
    let e = c
        .resolve(&r(&format!("{}/x", srv.host())), &Credentials::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.to_string().contains("503 Service Unavailable"), "{e}");
}

#[tokio::test]
async fn digests_are_verified() {
    let img = image();
    let body = img.manifest.clone();
    let wrong = Digest::of(b"something else");
    let wrong2 = wrong.clone();
    let srv = serve(
        bind().await,
        Arc::new(move |_: &Req| {
            resp(
                200,
                &[
                    ("Content-Type", MEDIA_TYPE_OCI_MANIFEST),
                    ("Docker-Content-Digest", &wrong2.to_string()),
                ],
                body.clone(),
            )
        }),
    );
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let e = c
        .resolve(&r(&format!("{}/x:v1", srv.host())), &Credentials::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DigestMismatch);
    assert!(e.to_string().contains("Docker-Content-Digest"), "{e}");
    let e = c
        .resolve(
            &r(&format!("{}/x@{wrong}", srv.host())),
            &Credentials::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DigestMismatch);
    assert!(
        e.to_string().contains(&format!("expected digest {wrong}")),
        "{e}"
    );
}

#[tokio::test]
async fn mirrors_first_with_ns_then_server() {
    let img = image();
    let main = registry(&img, Auth::None).await;
    // The mirror has the blobs but no manifests.
    let blobs = img.blobs.clone();
    let mirror = serve(
        bind().await,
        Arc::new(move |req: &Req| {
            if let Some((_, d)) = req.path().split_once("/blobs/")
                && let Some(b) = d.parse::<Digest>().ok().and_then(|d| blobs.get(&d))
            {
                return resp(200, &[], b.clone());
            }
            resp(404, &[], "")
        }),
    );
    let pull_only = serve(bind().await, Arc::new(|_: &Req| resp(404, &[], "")));
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "server = \"http://{m}\"\n\n[host.\"http://{p}\"]\n  capabilities = [\"pull\"]\n[host.\"http://{x}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
        m = main.host(),
        p = pull_only.host(),
        x = mirror.host()
    );
    let c = client(&dir, &main.host(), Some(toml));
    let res = c
        .resolve(
            &r(&format!("{}/app:v1", main.host())),
            &Credentials::default(),
        )
        .await
        .unwrap();
    assert_eq!(res.host, main.host());
    let s = c.fetch_blob(&res, &img.layers[0], 100_000).await.unwrap();
    assert_eq!(s.host, mirror.host());
    assert_eq!(read_all(s).await.len(), 100_000);

    // The pull-only mirror was not asked to resolve the tag, only for the child manifest
    // (by digest) and the blob; every mirror request names the registry.
    let pull_reqs = pull_only.requests();
    assert!(
        pull_reqs
            .iter()
            .all(|q| !q.path().ends_with("/manifests/v1")),
        "{pull_reqs:?}"
    );
    assert!(
        pull_reqs
            .iter()
            .any(|q| q.path().contains("/manifests/sha256:"))
    );
    for q in pull_reqs.iter().chain(mirror.requests().iter()) {
        assert_eq!(q.query(), vec![("ns".to_string(), main.host())], "{q:?}");
    }
    assert!(
        mirror
            .requests()
            .iter()
            .any(|q| q.path() == "/v2/app/manifests/v1")
    );
}

#[tokio::test]
async fn blob_redirects_drop_authorization_across_hosts() {
    let img = image();
    let layer = img.blobs[&img.layers[1]].clone();
    let storage = serve(
        bind().await,
        Arc::new(move |_: &Req| resp(200, &[], layer.clone())),
    );
    let l = bind().await;
    let addr = l.local_addr().unwrap();
    let inner = registry_handler(&img, Auth::Basic("u", "p"), addr);
    let target = format!("http://localhost:{}/storage/blob", storage.addr.port());
    let srv = serve(
        l,
        Arc::new(move |req: &Req| {
            if req.path().contains("/blobs/") && req.header("authorization").is_some() {
                return resp(307, &[("Location", &target)], "");
            }
            inner(req)
        }),
    );
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let creds = Credentials {
        username: "u".into(),
        password: "p".into(),
        ..Default::default()
    };
    let res = c
        .resolve(&r(&format!("{}/single:v1", srv.host())), &creds)
        .await
        .unwrap();
    let s = c.fetch_blob(&res, &img.layers[1], 9).await.unwrap();
    assert_eq!(read_all(s).await, b"layer two");
    let st = storage.requests();
    assert_eq!(st.len(), 1);
    assert!(st[0].header("authorization").is_none(), "{st:?}");
}

#[tokio::test]
async fn bad_manifests_and_platforms() {
    let schema1 =
        br#"{"schemaVersion":1,"name":"x","tag":"v1","fsLayers":[],"signatures":[]}"#.to_vec();
    let arm = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"x","digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":0},"layers":[]}"#;
    let arm_only = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_DOCKER_MANIFEST_LIST,
        "manifests": [{"mediaType": MEDIA_TYPE_DOCKER_MANIFEST, "digest": Digest::of(arm).to_string(), "size": arm.len(), "platform": {"architecture": "arm64", "os": "linux"}}]
    })
    .to_string();
    let srv = serve(
        bind().await,
        Arc::new(move |req: &Req| match req.path() {
            "/v2/old/manifests/v1" => resp(
                200,
                &[("Content-Type", MEDIA_TYPE_DOCKER_SCHEMA1_SIGNED)],
                schema1.clone(),
            ),
            "/v2/arm/manifests/v1" => resp(
                200,
                &[("Content-Type", MEDIA_TYPE_DOCKER_MANIFEST_LIST)],
                arm_only.clone(),
            ),
            "/v2/junk/manifests/v1" => resp(
                200,
                &[("Content-Type", MEDIA_TYPE_OCI_MANIFEST)],
                "{not json",
            ),
            _ => resp(404, &[], ""),
        }),
    );
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let h = srv.host();
    let e = c
        .resolve(&r(&format!("{h}/old:v1")), &Credentials::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidManifest);
    assert!(e.to_string().contains("schema 1"), "{e}");
    let e = c
        .resolve(&r(&format!("{h}/junk:v1")), &Credentials::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidManifest);
    let e = c
        .resolve(&r(&format!("{h}/arm:v1")), &Credentials::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoMatchingPlatform);
    let msg = e.to_string();
    assert!(msg.contains("no match for platform in manifest"), "{msg}");
    assert!(
        msg.contains("want linux/amd64; the index has linux/arm64"),
        "{msg}"
    );
}

#[tokio::test]
async fn unusable_hosts_configuration_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, "r.example", Some("mirrors = []\n".into()));
    let e = c
        .resolve(&r("r.example/x"), &Credentials::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    let msg = e.to_string();
    assert!(
        msg.contains("hosts.toml") && msg.contains("unknown field `mirrors`"),
        "{msg}"
    );
}

/// Bytes that differ from their neighbours, so a misplaced or repeated piece shows.
fn patterned(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// The start of a `Range: bytes=<start>-` header.
fn range_start(req: &Req) -> Option<usize> {
    req.header("range")?
        .strip_prefix("bytes=")?
        .strip_suffix('-')?
        .parse()
        .ok()
}

/// A registry serving `img` as [`registry_handler`] does, whose answers to GETs of blob
/// `digest` come from `blob` instead.
async fn registry_with_blob(
    img: &Image,
    digest: Digest,
    blob: impl Fn(&Req) -> Resp + Send + Sync + 'static,
) -> Server {
    registry_with_blob_auth(img, Auth::None, digest, blob).await
}

/// [`registry_with_blob`] behind `auth`.
async fn registry_with_blob_auth(
    img: &Image,
    auth: Auth,
    digest: Digest,
    blob: impl Fn(&Req) -> Resp + Send + Sync + 'static,
) -> Server {
    let l = bind().await;
    let inner = registry_handler(img, auth, l.local_addr().unwrap());
    let path = format!("/v2/single/blobs/{digest}");
    serve(
        l,
        Arc::new(move |req: &Req| {
            let r = inner(req);
            if req.path() == path && r.status != 401 {
                blob(req)
            } else {
                r
            }
        }),
    )
}

async fn resolve_single(c: &RegistryClient, srv: &Server) -> Resolved {
    c.resolve(
        &r(&format!("{}/single:v1", srv.host())),
        &Credentials::default(),
    )
    .await
    .unwrap()
}

fn blob_requests(srv: &Server, digest: &Digest) -> Vec<Req> {
    srv.requests()
        .into_iter()
        .filter(|q| q.path().ends_with(&format!("/blobs/{digest}")))
        .collect()
}

#[tokio::test]
async fn interrupted_blob_is_resumed_with_range_requests() {
    let img = image();
    // 30 pieces: more resumes than the no-progress limits, all making progress.
    let blob = patterned(3000);
    let digest = Digest::of(&blob);
    let served = blob.clone();
    let srv = registry_with_blob(&img, digest.clone(), move |req| {
        let start = range_start(req).unwrap_or(0);
        let r = if req.header("range").is_some() {
            let range = format!("bytes {start}-{}/{}", served.len() - 1, served.len());
            resp(206, &[("Content-Range", &range)], served[start..].to_vec())
        } else {
            resp(200, &[], served.clone())
        };
        r.cut(100)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let res = resolve_single(&c, &srv).await;
    let s = c.fetch_blob(&res, &digest, 3000).await.unwrap();
    assert_eq!(s.content_length, Some(3000));
    assert!(read_all(s).await == blob, "the exact blob, in order");
    let reqs = blob_requests(&srv, &digest);
    assert_eq!(reqs.len(), 30);
    assert!(reqs[0].header("range").is_none());
    for (i, q) in reqs.iter().enumerate().skip(1) {
        assert_eq!(
            q.header("range"),
            Some(format!("bytes={}-", i * 100).as_str())
        );
    }
}

#[tokio::test]
async fn resumed_blob_skips_what_a_range_ignoring_server_resends() {
    let img = image();
    let blob = patterned(1000);
    let digest = Digest::of(&blob);
    let served = blob.clone();
    let count = Arc::new(Mutex::new(0usize));
    let srv = registry_with_blob(&img, digest.clone(), move |_req| {
        // Always the whole blob from the start, each time a little more of it.
        let mut n = count.lock().unwrap();
        *n += 1;
        resp(200, &[], served.clone()).cut(150 * *n)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let res = resolve_single(&c, &srv).await;
    let s = c.fetch_blob(&res, &digest, 1000).await.unwrap();
    assert!(read_all(s).await == blob, "the exact blob, in order");
    let reqs = blob_requests(&srv, &digest);
    assert_eq!(reqs.len(), 7, "cut at 150, 300, ... 900, then whole");
    assert_eq!(reqs[1].header("range"), Some("bytes=150-"));
}

#[tokio::test]
async fn resuming_without_progress_gives_up() {
    let img = image();
    let blob = patterned(1000);
    let digest = Digest::of(&blob);
    let served = blob.clone();
    let srv = registry_with_blob(&img, digest.clone(), move |req| {
        let start = range_start(req).unwrap_or(0);
        let range = format!("bytes {start}-999/1000");
        if req.header("range").is_some() {
            // Headers, then the connection drops before the first byte.
            resp(206, &[("Content-Range", &range)], served[start..].to_vec()).cut(0)
        } else {
            resp(200, &[], served.clone()).cut(100)
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let res = resolve_single(&c, &srv).await;
    let mut s = c.fetch_blob(&res, &digest, 1000).await.unwrap();
    let mut got = Vec::new();
    let err = loop {
        match s.next().await {
            Some(Ok(b)) => got.extend_from_slice(&b),
            Some(Err(e)) => break e,
            None => panic!("the stream ended without an error"),
        }
    };
    assert!(s.next().await.is_none(), "nothing after the error");
    assert_eq!(got, blob[..100]);
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("blob {digest} from {}", srv.host())),
        "{msg}"
    );
    assert!(msg.contains("offset 100"), "{msg}");
    let reqs = blob_requests(&srv, &digest);
    assert_eq!(
        reqs.len(),
        6,
        "the first request and 5 resumes without progress"
    );
    assert!(
        reqs[1..]
            .iter()
            .all(|q| q.header("range") == Some("bytes=100-"))
    );
}

#[tokio::test]
async fn resume_answered_with_an_error_fails() {
    let img = image();
    let blob = patterned(1000);
    let digest = Digest::of(&blob);
    let served = blob.clone();
    let srv = registry_with_blob(&img, digest.clone(), move |req| {
        if req.header("range").is_some() {
            resp(416, &[("Content-Range", "bytes */1000")], "")
        } else {
            resp(200, &[], served.clone()).cut(100)
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let res = resolve_single(&c, &srv).await;
    let mut s = c.fetch_blob(&res, &digest, 1000).await.unwrap();
    let mut err = None;
    while let Some(r) = s.next().await {
        if let Err(e) = r {
            err = Some(e);
        }
    }
    let err = err.expect("an error");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    let msg = err.to_string();
    assert!(msg.contains(&digest.to_string()), "{msg}");
    assert!(msg.contains("416"), "{msg}");
    assert_eq!(blob_requests(&srv, &digest).len(), 2, "no retry of a 416");
}

#[tokio::test]
async fn blob_requests_are_retried_before_the_next_host() {
    let img = image();
    let blob = patterned(500);
    let digest = Digest::of(&blob);
    // The registry fails twice, then serves.
    let served = blob.clone();
    let count = Arc::new(Mutex::new(0usize));
    let main = registry_with_blob(&img, digest.clone(), move |_req| {
        let mut n = count.lock().unwrap();
        *n += 1;
        if *n <= 2 {
            resp(503, &[], "")
        } else {
            resp(200, &[], served.clone())
        }
    })
    .await;
    // A mirror that is always down for blobs.
    let mirror = serve(bind().await, Arc::new(|_: &Req| resp(502, &[], "")));
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "server = \"http://{m}\"\n\n[host.\"http://{x}\"]\n  capabilities = [\"pull\"]\n",
        m = main.host(),
        x = mirror.host()
    );
    let c = client(&dir, &main.host(), Some(toml));
    let res = resolve_single(&c, &main).await;
    let s = c.fetch_blob(&res, &digest, 500).await.unwrap();
    assert_eq!(s.host, main.host());
    assert!(read_all(s).await == blob);
    assert_eq!(
        blob_requests(&mirror, &digest).len(),
        4,
        "the first request and 3 retries"
    );
    assert_eq!(blob_requests(&main, &digest).len(), 3);
}

#[tokio::test]
async fn resumes_are_authenticated_like_the_first_request() {
    let img = image();
    let blob = patterned(1000);
    let digest = Digest::of(&blob);
    let served = blob.clone();
    let auth = Auth::Bearer {
        token: "tok",
        creds: None,
        field: "token",
    };
    let srv = registry_with_blob_auth(&img, auth, digest.clone(), move |req| {
        let start = range_start(req).unwrap_or(0);
        let range = format!("bytes {start}-999/1000");
        resp(206, &[("Content-Range", &range)], served[start..].to_vec()).cut(300)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let c = client(&dir, &srv.host(), None);
    let res = resolve_single(&c, &srv).await;
    let s = c.fetch_blob(&res, &digest, 1000).await.unwrap();
    assert!(read_all(s).await == blob);
    let reqs = blob_requests(&srv, &digest);
    assert_eq!(reqs.len(), 4);
    assert!(
        reqs.iter()
            .all(|q| q.header("authorization") == Some("Bearer tok")),
        "{reqs:?}"
    );
    let tokens = srv
        .requests()
        .iter()
        .filter(|q| q.path() == "/token")
        .count();
    assert_eq!(tokens, 1, "the cached token serves the resumes");
}
