//! The real distribution registry (`/usr/bin/docker-registry`, v2.8) on 127.0.0.1.
//!
//! [`Registry::start`] writes a `config.yml` into a temp dir (filesystem storage under it,
//! deletes enabled, listening on `127.0.0.1:<free port>`), starts `docker-registry serve`,
//! and waits until `GET /v2/` answers. Variants add htpasswd basic auth
//! ([`Registry::start_with_basic_auth`]) or token auth backed by a [`TokenServer`]
//! ([`Registry::start_with_token_auth`]). Dropping the [`Registry`] kills the process by PID,
//! stops the token server and removes the temp dir. The registry's log is `registry.log` in
//! the temp dir; startup errors quote its last lines.

pub mod client;
pub mod token;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

pub use client::{Challenge, FetchedManifest, RegistryClient};
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
    addr: SocketAddr,
    dir: TempDir,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("addr", &self.addr)
            .field("auth", &self.auth)
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
        let dir = tempfile::Builder::new()
            .prefix("testkit-registry-")
            .tempdir()?;
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
            let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\n\
                     log:\n  level: info\n  formatter: text\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  \
                     maintenance:\n    uploadpurging:\n      enabled: false\n\
                     http:\n  addr: {addr}\n  secret: testkit-registry-secret\n\
                     {auth_yaml}",
                    storage.display()
                ),
            )?;
            let mut cmd = Command::new(REGISTRY_BIN);
            cmd.arg("serve")
                .arg(&config)
                .env_remove("REGISTRY_HTTP_ADDR");
            let mut daemon =
                Daemon::spawn("docker-registry", cmd, &log, Duration::from_millis(500))?;
            match daemon.wait_ready(Duration::from_secs(20), || probe_v2(addr)) {
                Ok(()) => {
                    return Ok(Registry {
                        daemon,
                        token_server,
                        auth,
                        addr,
                        dir,
                    });
                }
                Err(e) => {
                    let in_use = daemon.log_tail(20).contains("address already in use");
                    drop(daemon);
                    if !in_use {
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

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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

    /// A client using the registry's credentials (if any).
    pub fn client(&self) -> RegistryClient {
        RegistryClient::new(&self.host(), self.credentials())
    }

    /// A client without credentials.
    pub fn anonymous_client(&self) -> RegistryClient {
        RegistryClient::new(&self.host(), None)
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
