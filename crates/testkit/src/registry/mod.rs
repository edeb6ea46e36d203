//! The real distribution registry (`/usr/bin/docker-registry`, v2.8) on 127.0.0.1.
//!
//! [`Registry::start`] writes a `config.yml` into a temp dir (filesystem storage under it,
//! deletes enabled, listening on `127.0.0.1:<free port>`), starts `docker-registry serve`,
//! and waits until `GET /v2/` answers. Variants add htpasswd basic auth
//! ([`Registry::start_with_basic_auth`]) or token auth backed by a [`TokenServer`]
//! ([`Registry::start_with_token_auth`]). Dropping the [`Registry`] kills the process by PID,
//! stops the token server and removes the temp dir. The registry's log is `registry.log` in
//! the temp dir; startup errors quote its last lines.
//!
//! HTTPS: [`Registry::start_tls`] (or [`RegistryOptions::tls`] with any auth mode) generates a
//! throwaway CA ([`tls::TestCa`]) and a server certificate for `127.0.0.1`, `::1` and
//! `localhost`, and serves them with `http.tls.certificate`/`http.tls.key`; readiness is
//! probed over TLS trusting that CA. The CA is [`Registry::ca_pem`], also written to
//! [`Registry::ca_pem_path`] (`ca.pem` in the temp dir) for `hosts.toml`'s `ca = ...`.
//! [`RegistryOptions::client_auth`] also requires client certificates signed by the CA
//! (`http.tls.clientcas`); one is written to [`Registry::client_cert_path`] /
//! [`Registry::client_key_path`]. [`Registry::client`] (and so [`Registry::push`]) trusts the
//! CA and presents the client certificate. The token server of a token-auth registry stays
//! plain HTTP.

pub mod client;
pub mod tls;
pub mod token;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

pub use client::{Challenge, FetchedManifest, RegistryClient};
pub use tls::{CertPem, ClientTls, TestCa};
pub use token::{Access, TokenIssuer, TokenServer};

use crate::daemon::Daemon;
use crate::image::{Image, ImageIndex};
use crate::port::free_port;

/// The registry binary.
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// `auth.token.service` of token-auth registries (the JWT audience).
pub const TOKEN_SERVICE: &str = "testkit-registry";

/// How clients must authenticate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryAuth {
    /// Anonymous pull and push.
    None,
    /// htpasswd (bcrypt) basic auth for one user.
    Basic { user: String, pass: String },
    /// Bearer tokens from testkit's token server, which checks one user's basic credentials.
    Token { user: String, pass: String },
}

/// How to start a [`Registry`]: [`Registry::start_with_options`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryOptions {
    /// How clients must authenticate.
    pub auth: RegistryAuth,
    /// Serve HTTPS with a certificate from a fresh test CA.
    pub tls: bool,
    /// Require TLS client certificates signed by the test CA (implies `tls`).
    pub client_auth: bool,
    /// Listen on `127.0.0.1:<port>` instead of a free port picked at random (no retry when
    /// it is taken).
    pub port: Option<u16>,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            auth: RegistryAuth::None,
            tls: false,
            client_auth: false,
            port: None,
        }
    }
}

/// The TLS files of an HTTPS registry, all in its temp dir.
#[derive(Clone, Debug)]
struct TlsFiles {
    ca_pem: String,
    ca_path: PathBuf,
    cert_path: PathBuf,
    key_path: PathBuf,
    /// Client certificate and key paths, and the identity PEM, when client auth is required.
    client: Option<(PathBuf, PathBuf, String)>,
}

impl TlsFiles {
    fn generate(dir: &Path, client_auth: bool) -> Result<TlsFiles> {
        let ca = TestCa::generate("testkit registry CA")?;
        let server = ca.server_cert(&["127.0.0.1", "::1", "localhost"])?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
            Ok(p)
        };
        let client = if client_auth {
            let c = ca.client_cert("testkit registry client")?;
            Some((
                write("client.cert", &c.cert_pem)?,
                write("client.key", &c.key_pem)?,
                c.identity_pem(),
            ))
        } else {
            None
        };
        Ok(TlsFiles {
            ca_pem: ca.cert_pem().to_string(),
            ca_path: write("ca.pem", ca.cert_pem())?,
            cert_path: write("server.crt", &server.cert_pem)?,
            key_path: write("server.key", &server.key_pem)?,
            client,
        })
    }

    fn yaml(&self) -> String {
        let mut y = format!(
            "  tls:\n    certificate: {}\n    key: {}\n",
            self.cert_path.display(),
            self.key_path.display()
        );
        if self.client.is_some() {
            y.push_str(&format!(
                "    clientcas:\n      - {}\n",
                self.ca_path.display()
            ));
        }
        y
    }

    fn client_tls(&self) -> ClientTls {
        ClientTls {
            ca_pem: Some(self.ca_pem.clone()),
            identity_pem: self.client.as_ref().map(|(_, _, id)| id.clone()),
        }
    }
}

/// How [`Registry::corrupt_blob`] damages a stored blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// XOR the byte at this offset (modulo the length) with 0xff.
    FlipByte(usize),
    /// Cut the blob to this many bytes.
    Truncate(usize),
}

/// A running registry. See the [module docs](self).
pub struct Registry {
    // Field order is drop order: stop the process before removing its files.
    daemon: Daemon,
    token_server: Option<TokenServer>,
    auth: RegistryAuth,
    tls: Option<TlsFiles>,
    addr: SocketAddr,
    dir: TempDir,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("addr", &self.addr)
            .field("auth", &self.auth)
            .field("tls", &self.tls.is_some())
            .field("dir", &self.dir.path())
            .field("pid", &self.daemon.pid())
            .finish()
    }
}

impl Registry {
    /// An anonymous registry.
    pub fn start() -> Result<Registry> {
        Registry::start_with(RegistryAuth::None)
    }

    /// A registry requiring HTTP basic auth (`htpasswd` with a bcrypt hash of `pass`).
    pub fn start_with_basic_auth(user: &str, pass: &str) -> Result<Registry> {
        Registry::start_with(RegistryAuth::Basic {
            user: user.into(),
            pass: pass.into(),
        })
    }

    /// A registry requiring bearer tokens from a testkit [`TokenServer`] that accepts
    /// `user`/`pass`.
    pub fn start_with_token_auth(user: &str, pass: &str) -> Result<Registry> {
        Registry::start_with(RegistryAuth::Token {
            user: user.into(),
            pass: pass.into(),
        })
    }

    /// Starts a registry with the given auth mode.
    pub fn start_with(auth: RegistryAuth) -> Result<Registry> {
        Registry::start_with_options(RegistryOptions {
            auth,
            ..RegistryOptions::default()
        })
    }

    /// An anonymous HTTPS registry with a certificate from a fresh test CA
    /// ([`Registry::ca_pem_path`]).
    pub fn start_tls() -> Result<Registry> {
        Registry::start_with_options(RegistryOptions {
            tls: true,
            ..RegistryOptions::default()
        })
    }

    /// Starts a registry as `options` say. See the [module docs](self).
    pub fn start_with_options(options: RegistryOptions) -> Result<Registry> {
        let RegistryOptions {
            auth,
            tls,
            client_auth,
            port,
        } = options;
        let dir = tempfile::Builder::new()
            .prefix("testkit-registry-")
            .tempdir()?;
        let tls = if tls || client_auth {
            Some(TlsFiles::generate(dir.path(), client_auth)?)
        } else {
            None
        };
        let tls_yaml = tls.as_ref().map(TlsFiles::yaml).unwrap_or_default();
        let (auth_yaml, token_server) = match &auth {
            RegistryAuth::None => (String::new(), None),
            RegistryAuth::Basic { user, pass } => {
                let hash = bcrypt::hash(pass, 4).context("bcrypt the registry password")?;
                let htpasswd = dir.path().join("htpasswd");
                std::fs::write(&htpasswd, format!("{user}:{hash}\n"))?;
                (
                    format!(
                        "auth:\n  htpasswd:\n    realm: testkit-basic-realm\n    path: {}\n",
                        htpasswd.display()
                    ),
                    None,
                )
            }
            RegistryAuth::Token { user, pass } => {
                let server = TokenServer::start(user, pass)?;
                let bundle = dir.path().join("token-ca.pem");
                std::fs::write(&bundle, server.issuer().cert_pem())?;
                (
                    format!(
                        "auth:\n  token:\n    realm: {}\n    service: {TOKEN_SERVICE}\n    \
                         issuer: {}\n    rootcertbundle: {}\n",
                        server.realm(),
                        token::ISSUER,
                        bundle.display()
                    ),
                    Some(server),
                )
            }
        };
        let storage = dir.path().join("storage");
        std::fs::create_dir_all(&storage)?;
        let log = dir.path().join("registry.log");
        let mut last_err = None;
        for _attempt in 0..5 {
            let addr: SocketAddr = ([127, 0, 0, 1], port.unwrap_or_else(free_port)).into();
            // Another listener there would answer the readiness probe for us.
            if let Err(e) = std::net::TcpListener::bind(addr) {
                let e = anyhow::anyhow!("registry address {addr} is taken: {e}");
                if port.is_some() {
                    return Err(e);
                }
                last_err = Some(e);
                continue;
            }
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\n\
                     log:\n  level: info\n  formatter: text\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  \
                     maintenance:\n    uploadpurging:\n      enabled: false\n\
                     http:\n  addr: {addr}\n  secret: testkit-registry-secret\n\
                     {tls_yaml}{auth_yaml}",
                    storage.display()
                ),
            )?;
            let mut cmd = Command::new(REGISTRY_BIN);
            cmd.arg("serve")
                .arg(&config)
                .env_remove("REGISTRY_HTTP_ADDR");
            let mut daemon =
                Daemon::spawn("docker-registry", cmd, &log, Duration::from_millis(500))?;
            let client_tls = tls.as_ref().map(TlsFiles::client_tls);
            let ready = || match &client_tls {
                None => probe_v2(addr),
                Some(t) => probe_v2_tls(addr, t),
            };
            match daemon.wait_ready(Duration::from_secs(20), ready) {
                Ok(()) => {
                    return Ok(Registry {
                        daemon,
                        token_server,
                        auth,
                        tls,
                        addr,
                        dir,
                    });
                }
                Err(e) => {
                    let in_use = daemon.log_tail(20).contains("address already in use");
                    drop(daemon);
                    if !in_use || port.is_some() {
                        return Err(e);
                    }
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("registry did not start")))
    }

    /// `127.0.0.1:PORT` as a socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:PORT`: the registry host in image references and `certs.d`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `http://127.0.0.1:PORT`, or `https://127.0.0.1:PORT` for a TLS registry.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme(), self.addr)
    }

    /// `https` for a TLS registry, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Whether the registry serves HTTPS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The test CA's certificate (PEM) of a TLS registry.
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// `<temp dir>/ca.pem`, the test CA's certificate, of a TLS registry: the file to name in
    /// `hosts.toml`'s `ca = ...`.
    pub fn ca_pem_path(&self) -> Option<&Path> {
        self.tls.as_ref().map(|t| t.ca_path.as_path())
    }

    /// `<temp dir>/client.cert`, a client certificate signed by the test CA, of a registry
    /// started with [`RegistryOptions::client_auth`].
    pub fn client_cert_path(&self) -> Option<&Path> {
        self.tls
            .as_ref()
            .and_then(|t| t.client.as_ref())
            .map(|(c, _, _)| c.as_path())
    }

    /// `<temp dir>/client.key`, the key of [`Registry::client_cert_path`].
    pub fn client_key_path(&self) -> Option<&Path> {
        self.tls
            .as_ref()
            .and_then(|t| t.client.as_ref())
            .map(|(_, k, _)| k.as_path())
    }

    /// What a client needs to talk to this TLS registry (its CA, and the client certificate
    /// when one is required).
    pub fn client_tls(&self) -> Option<ClientTls> {
        self.tls.as_ref().map(TlsFiles::client_tls)
    }

    /// `127.0.0.1:PORT/<repo>:<tag>`.
    pub fn image_ref(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.addr)
    }

    /// The auth mode.
    pub fn auth(&self) -> &RegistryAuth {
        &self.auth
    }

    /// `(user, pass)` when the registry requires auth.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        match &self.auth {
            RegistryAuth::None => None,
            RegistryAuth::Basic { user, pass } | RegistryAuth::Token { user, pass } => {
                Some((user, pass))
            }
        }
    }

    /// The token server of a token-auth registry.
    pub fn token_server(&self) -> Option<&TokenServer> {
        self.token_server.as_ref()
    }

    /// A client using the registry's credentials (if any); HTTPS trusting the test CA for a
    /// TLS registry.
    pub fn client(&self) -> RegistryClient {
        self.client_as(self.credentials())
    }

    /// A client without credentials.
    pub fn anonymous_client(&self) -> RegistryClient {
        self.client_as(None)
    }

    fn client_as(&self, credentials: Option<(&str, &str)>) -> RegistryClient {
        match &self.tls {
            None => RegistryClient::new(&self.host(), credentials),
            Some(t) => RegistryClient::with_tls(&self.host(), credentials, &t.client_tls())
                .expect("TLS client from the registry's generated certificates"),
        }
    }

    /// Pushes `image` as `<repo>:<tag>` (blobs, manifest by digest, then by tag).
    /// Returns the manifest digest.
    pub async fn push(&self, repo: &str, tag: &str, image: &Image) -> Result<String> {
        self.client().push_image(repo, tag, image).await
    }

    /// Pushes `index` and all its child images as `<repo>:<tag>`. Returns the index digest.
    pub async fn push_index(&self, repo: &str, tag: &str, index: &ImageIndex) -> Result<String> {
        self.client().push_index(repo, tag, index).await
    }

    /// Deletes the manifest `digest` from `repo` (its tags go with it).
    pub async fn delete_manifest(&self, repo: &str, digest: &str) -> Result<()> {
        self.client().delete_manifest(repo, digest).await
    }

    /// Where the registry stores blob `digest` on disk.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2.min(hex.len())])
            .join(hex)
            .join("data")
    }

    /// Damages a stored blob in place, so the registry serves bytes that do not match the
    /// digest (distribution does not re-verify on reads).
    pub fn corrupt_blob(&self, digest: &str, how: Corruption) -> Result<()> {
        let path = self.blob_path(digest);
        let mut data =
            std::fs::read(&path).with_context(|| format!("read stored blob {}", path.display()))?;
        match how {
            Corruption::FlipByte(offset) => {
                if data.is_empty() {
                    bail!("cannot flip a byte of an empty blob");
                }
                let i = offset % data.len();
                data[i] ^= 0xff;
            }
            Corruption::Truncate(len) => data.truncate(len),
        }
        std::fs::write(&path, data)?;
        Ok(())
    }

    /// The temp dir holding config, storage and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The registry's log file.
    pub fn log_path(&self) -> &Path {
        self.daemon.log_path()
    }

    /// The registry's PID.
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }
}

/// True once `GET https://ADDR/v2/` answers 200 or 401 over TLS verified with `tls`'s CA.
///
/// Runs reqwest on a private current-thread runtime in a scoped thread, so it works whether
/// or not the caller is inside a tokio runtime.
fn probe_v2_tls(addr: SocketAddr, tls: &ClientTls) -> bool {
    if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        return false;
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return false;
            };
            rt.block_on(async {
                let Ok(b) = tls.apply(reqwest::Client::builder().no_proxy()) else {
                    return false;
                };
                let Ok(client) = b.timeout(Duration::from_secs(2)).build() else {
                    return false;
                };
                match client.get(format!("https://{addr}/v2/")).send().await {
                    Ok(r) => matches!(r.status().as_u16(), 200 | 401),
                    Err(_) => false,
                }
            })
        })
        .join()
        .unwrap_or(false)
    })
}

/// True once `GET /v2/` answers 200 or 401.
fn probe_v2(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("GET /v2/ HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 16];
    let mut n = 0;
    while n < buf.len() {
        match s.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    head.starts_with("HTTP/1.") && (head.contains(" 200") || head.contains(" 401"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::{busybox, busybox_multiplatform};

    fn plain() -> reqwest::Client {
        reqwest::Client::builder().no_proxy().build().unwrap()
    }

    fn trusting(reg: &Registry) -> reqwest::Client {
        reg.client_tls()
            .unwrap()
            .apply(reqwest::Client::builder().no_proxy())
            .unwrap()
            .build()
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn tls_registry_serves_https_with_the_test_ca() {
        let reg = Registry::start_tls().unwrap();
        assert!(reg.is_tls());
        assert_eq!(reg.url(), format!("https://{}", reg.addr()));
        let ca = reg.ca_pem_path().unwrap();
        assert!(ca.starts_with(reg.dir()));
        assert_eq!(std::fs::read_to_string(ca).unwrap(), reg.ca_pem().unwrap());
        assert!(reg.client_cert_path().is_none());

        let img = busybox();
        let digest = reg.push("library/busybox", "1.36", &img).await.unwrap();
        assert_eq!(digest, img.manifest_digest);
        let index = busybox_multiplatform(crate::image::ManifestFormat::Oci);
        let idx = reg.push_index("multi", "latest", &index).await.unwrap();
        let m = reg.client().get_manifest("multi", "latest").await.unwrap();
        assert_eq!(m.digest.as_deref(), Some(idx.as_str()));

        // Verified by the CA, for the IP and for localhost.
        for host in [
            format!("127.0.0.1:{}", reg.addr().port()),
            format!("localhost:{}", reg.addr().port()),
        ] {
            let r = trusting(&reg)
                .get(format!("https://{host}/v2/library/busybox/manifests/1.36"))
                .header("accept", img.media_type())
                .send()
                .await
                .unwrap_or_else(|e| panic!("GET via {host}: {e:?}"));
            assert_eq!(r.status(), 200, "via {host}");
            assert_eq!(r.headers()["docker-content-digest"], digest.as_str());
        }

        // Not trusted without the CA; plain HTTP is refused by the TLS listener.
        let e = plain()
            .get(format!("{}/v2/", reg.url()))
            .send()
            .await
            .unwrap_err();
        assert!(format!("{e:?}").contains("UnknownIssuer"), "{e:?}");
        let r = plain()
            .get(format!("http://{}/v2/", reg.addr()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn tls_with_basic_auth() {
        let reg = Registry::start_with_options(RegistryOptions {
            auth: RegistryAuth::Basic {
                user: "u".into(),
                pass: "p".into(),
            },
            tls: true,
            ..RegistryOptions::default()
        })
        .unwrap();
        reg.push("a", "b", &busybox()).await.unwrap();
        let e = reg.anonymous_client().get_manifest("a", "b").await;
        assert!(e.is_err(), "anonymous read of a basic-auth registry");
        reg.client().get_manifest("a", "b").await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn tls_with_token_auth() {
        let reg = Registry::start_with_options(RegistryOptions {
            auth: RegistryAuth::Token {
                user: "u".into(),
                pass: "p".into(),
            },
            tls: true,
            ..RegistryOptions::default()
        })
        .unwrap();
        reg.push("a", "b", &busybox()).await.unwrap();
        reg.client().get_manifest("a", "b").await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn client_auth_requires_a_certificate_from_the_ca() {
        let reg = Registry::start_with_options(RegistryOptions {
            client_auth: true,
            ..RegistryOptions::default()
        })
        .unwrap();
        assert!(reg.is_tls());
        let cert = reg.client_cert_path().unwrap();
        let key = reg.client_key_path().unwrap();
        assert!(cert.starts_with(reg.dir()) && key.starts_with(reg.dir()));
        reg.push("a", "b", &busybox()).await.unwrap();

        // The CA alone is not enough.
        let ca_only = ClientTls {
            ca_pem: reg.ca_pem().map(str::to_string),
            identity_pem: None,
        };
        let c = RegistryClient::with_tls(&reg.host(), None, &ca_only).unwrap();
        assert!(c.get_manifest("a", "b").await.is_err());

        // A certificate from another CA is refused.
        let other = TestCa::generate("other").unwrap();
        let foreign = ClientTls {
            ca_pem: reg.ca_pem().map(str::to_string),
            identity_pem: Some(other.client_cert("x").unwrap().identity_pem()),
        };
        let c = RegistryClient::with_tls(&reg.host(), None, &foreign).unwrap();
        assert!(c.get_manifest("a", "b").await.is_err());

        // The files on disk make a working identity.
        let id = format!(
            "{}{}",
            std::fs::read_to_string(cert).unwrap(),
            std::fs::read_to_string(key).unwrap()
        );
        let from_files = ClientTls {
            ca_pem: reg.ca_pem().map(str::to_string),
            identity_pem: Some(id),
        };
        let c = RegistryClient::with_tls(&reg.host(), None, &from_files).unwrap();
        c.get_manifest("a", "b").await.unwrap();
    }

    #[test]
    fn plain_registry_has_no_tls_files() {
        let reg = Registry::start().unwrap();
        assert!(!reg.is_tls());
        assert_eq!(reg.scheme(), "http");
        assert!(reg.ca_pem().is_none() && reg.ca_pem_path().is_none());
        assert!(!reg.dir().join("ca.pem").exists());

        // A chosen port; taken, it is an error rather than another port.
        let port = free_port();
        let fixed = Registry::start_with_options(RegistryOptions {
            port: Some(port),
            ..RegistryOptions::default()
        })
        .unwrap();
        assert_eq!(fixed.addr().port(), port);
        assert!(
            Registry::start_with_options(RegistryOptions {
                port: Some(port),
                ..RegistryOptions::default()
            })
            .is_err()
        );
    }
}
