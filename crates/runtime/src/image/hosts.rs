//! Registry hosts and mirrors, configured as containerd does it: a directory in the
//! `certs.d/<host>/hosts.toml` layout (containerd `docs/hosts.md`,
//! `remotes/docker/config/hosts.go`), so existing mirror configurations work unchanged.
//!
//! For a registry host (`docker.io`, `127.0.0.1:5000`) the directory looked up is, in order,
//! `<root>/<host>_<port>_`, `<root>/<host:port>`, `<root>/_default`; the first that exists
//! wins. Its `hosts.toml` lists `[host."URL"]` mirrors in file order, then `server` (default:
//! the registry itself; `https://registry-1.docker.io` for `docker.io`). A directory without
//! `hosts.toml` uses Docker's certificate layout (`*.crt` CAs, `*.cert`/`*.key` client pairs).
//! The files are read on every call, so edits take effect without a restart.
//!
//! Differences from containerd, on purpose: an unknown key, a malformed value or an
//! unreadable `hosts.toml` is an error naming the key and file (containerd logs and falls
//! back to the certificate layout); `proxy` accepts `http://` and `https://` proxies only
//! (containerd also takes `socks5`/`socks5h`, which are refused here with a clear message).
//!
//! Every key containerd documents is honoured: `server`, `capabilities`, `ca`, `client`,
//! `skip_verify`, `header`, `override_path`, `dial_timeout`, `proxy` and `host` tables.
//!
//! Plain HTTP: a host is plain HTTP when its URL says `http://`. A loopback registry with no
//! configuration follows containerd 1.7.x/2.x (`ConfigureHosts` defaults with
//! `docker.IsLocalhost`): `localhost`, `localhost:443` → HTTPS without certificate
//! verification; `localhost:80` → HTTP; any other port → HTTPS (unverified) first, falling
//! back to HTTP when the TLS connection fails. The same HTTPS-first fallback applies to an
//! `http://` host given TLS settings (`ca`, `client` or `skip_verify`) on a port other than 80.
//! (containerd 1.6 and early 1.7 used plain HTTP straight away for loopback hosts.)

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The operations a host may be trusted with (`capabilities` in hosts.toml).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities(u8);

impl Capabilities {
    pub const PULL: Capabilities = Capabilities(1);
    pub const RESOLVE: Capabilities = Capabilities(2);
    pub const PUSH: Capabilities = Capabilities(4);

    pub const fn all() -> Self {
        Capabilities(7)
    }
    pub const fn empty() -> Self {
        Capabilities(0)
    }
    pub fn contains(self, other: Capabilities) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn union(self, other: Capabilities) -> Capabilities {
        Capabilities(self.0 | other.0)
    }
}

impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = Vec::new();
        for (c, n) in [
            (Self::PULL, "pull"),
            (Self::RESOLVE, "resolve"),
            (Self::PUSH, "push"),
        ] {
            if self.contains(c) {
                names.push(n);
            }
        }
        write!(f, "[{}]", names.join(", "))
    }
}

/// A client certificate for TLS client authentication: a PEM certificate and its key (the
/// key may live in the same file as the certificate).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: Option<PathBuf>,
}

/// One endpoint to try for a registry, in the order they are to be tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryHost {
    /// `https` or `http`.
    pub scheme: String,
    /// `host[:port]` of the endpoint.
    pub host: String,
    /// API root, normally `/v2` (may be anything with `override_path`, or empty).
    pub path: String,
    pub capabilities: Capabilities,
    /// `Some(true)`: accept any certificate; `Some(false)`/`None`: verify.
    pub skip_verify: Option<bool>,
    /// Extra PEM CA files, trusted besides the built-in roots.
    pub ca: Vec<PathBuf>,
    pub client_certs: Vec<ClientCert>,
    /// Headers sent with every request to this host (name, values), in file order.
    pub headers: Vec<(String, Vec<String>)>,
    /// Connect timeout (`dial_timeout`); 30s when unset, as containerd.
    pub dial_timeout: Option<Duration>,
    /// Explicit proxy URL for this host (overrides the `*_PROXY` environment).
    pub proxy: Option<String>,
    /// Try HTTPS first and fall back to plain HTTP when the TLS connection fails
    /// (containerd's `docker.NewHTTPFallback`).
    pub http_fallback: bool,
}

impl RegistryHost {
    /// `scheme://host/path`, e.g. `https://registry-1.docker.io/v2`.
    pub fn base_url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.host, self.path)
    }

    /// Whether TLS settings were given for this host.
    pub fn explicit_tls(&self) -> bool {
        !self.ca.is_empty() || !self.client_certs.is_empty() || self.skip_verify.is_some()
    }
}

/// A hosts.toml that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    #[error("failed to read registry host configuration {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid registry host configuration {}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

/// The registry host configuration directory (`registry-config-dir`, containerd's
/// `config_path`). Without a directory every registry gets the defaults.
#[derive(Debug, Clone, Default)]
pub struct HostsConfig {
    root: Option<PathBuf>,
}

impl HostsConfig {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: Some(root.into()),
        }
    }

    /// No configuration directory: defaults for every registry.
    pub fn none() -> Self {
        Self { root: None }
    }

    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// The directory configuring `registry`, if any (containerd `HostDirFromRoot`).
    pub fn host_dir(&self, registry: &str) -> Result<Option<PathBuf>, HostsError> {
        let Some(root) = &self.root else {
            return Ok(None);
        };
        for p in host_paths(root, registry) {
            match std::fs::metadata(&p) {
                Ok(_) => return Ok(Some(p)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(HostsError::Io { path: p, source: e }),
            }
        }
        Ok(None)
    }

    /// The endpoints for `registry` (a reference's domain), in the order to try them.
    pub fn hosts(&self, registry: &str) -> Result<Vec<RegistryHost>, HostsError> {
        let entries = match self.host_dir(registry)? {
            Some(dir) => load_host_dir(&dir)?,
            None => vec![Entry::default()],
        };
        Ok(finish(registry, entries))
    }
}

/// Parses the text of a `hosts.toml` for `registry`; relative paths are taken from the
/// file's directory. The result is what [`HostsConfig::hosts`] returns for that file.
pub fn parse_hosts_file(
    registry: &str,
    file: &Path,
    text: &str,
) -> Result<Vec<RegistryHost>, HostsError> {
    Ok(finish(registry, parse_file(file, text)?))
}

/// Whether a registry host is local: `localhost` or a loopback address, with or without a
/// port (containerd `docker.IsLocalhost`).
pub fn is_localhost(host: &str) -> bool {
    let (h, _) = split_host_port(host);
    let h = h.trim_start_matches('[').trim_end_matches(']');
    h == "localhost" || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `host:port` → (`host`, `port`); the port is empty when there is none.
fn split_host_port(hostport: &str) -> (&str, &str) {
    if hostport.starts_with('[') {
        if let Some(end) = hostport.find(']') {
            let rest = &hostport[end + 1..];
            return (&hostport[..=end], rest.strip_prefix(':').unwrap_or(""));
        }
        return (hostport, "");
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, p),
        _ => (hostport, ""),
    }
}

fn host_paths(root: &Path, host: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(idx) = host.rfind(':')
        && idx > 0
    {
        out.push(root.join(format!("{}_{}_", &host[..idx], &host[idx + 1..])));
    }
    out.push(root.join(host));
    out.push(root.join("_default"));
    out
}

/// A parsed host entry before defaults; `host` empty means "the registry itself".
#[derive(Debug, Clone, Default)]
struct Entry {
    scheme: String,
    host: String,
    path: String,
    capabilities: Capabilities,
    ca: Option<Vec<PathBuf>>,
    client: Option<Vec<ClientCert>>,
    skip_verify: Option<bool>,
    headers: Vec<(String, Vec<String>)>,
    dial_timeout: Option<Duration>,
    proxy: Option<String>,
}

/// Applies containerd's defaults (`ConfigureHosts`): the trailing entry without a host becomes
/// the registry itself; HTTP hosts with TLS settings get HTTPS-first fallback.
fn finish(registry: &str, mut entries: Vec<Entry>) -> Vec<RegistryHost> {
    if let Some(last) = entries.last_mut()
        && last.host.is_empty()
    {
        if registry == "docker.io" {
            last.scheme = "https".into();
            last.host = "registry-1.docker.io".into();
        } else if is_localhost(registry) {
            last.host = registry.to_string();
            let (_, port) = split_host_port(registry);
            last.scheme = if port.is_empty() || port == "443" {
                "https".into()
            } else {
                "http".into()
            };
            if port != "80" {
                last.skip_verify = Some(true);
            }
        } else {
            last.host = registry.to_string();
            last.scheme = "https".into();
        }
        last.path = "/v2".into();
        last.capabilities = Capabilities::all();
    }
    entries
        .into_iter()
        .map(|e| {
            let explicit_tls = e.ca.is_some() || e.client.is_some() || e.skip_verify.is_some();
            let (_, port) = split_host_port(&e.host);
            let http_fallback =
                e.scheme == "http" && explicit_tls && !port.is_empty() && port != "80";
            RegistryHost {
                scheme: if http_fallback {
                    "https".into()
                } else {
                    e.scheme
                },
                host: e.host,
                path: e.path,
                capabilities: e.capabilities,
                skip_verify: e.skip_verify,
                ca: e.ca.unwrap_or_default(),
                client_certs: e.client.unwrap_or_default(),
                headers: e.headers,
                dial_timeout: e.dial_timeout,
                proxy: e.proxy,
                http_fallback,
            }
        })
        .collect()
}

fn load_host_dir(dir: &Path) -> Result<Vec<Entry>, HostsError> {
    let file = dir.join("hosts.toml");
    match std::fs::read(&file) {
        Ok(bytes) if !bytes.is_empty() => {
            let text = String::from_utf8(bytes).map_err(|_| HostsError::Invalid {
                path: file.clone(),
                message: "not valid UTF-8".into(),
            })?;
            parse_file(&file, &text)
        }
        Ok(_) => load_cert_files(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => load_cert_files(dir),
        Err(e) => Err(HostsError::Io {
            path: file,
            source: e,
        }),
    }
}

/// Docker's certificate layout: `*.crt` are CAs, `*.cert` client certificates with an
/// optional `*.key` beside them (containerd `loadCertFiles`).
fn load_cert_files(dir: &Path) -> Result<Vec<Entry>, HostsError> {
    let io = |e| HostsError::Io {
        path: dir.to_path_buf(),
        source: e,
    };
    let mut entry = Entry::default();
    let mut names: Vec<PathBuf> = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(rd) => {
            for ent in rd {
                let ent = ent.map_err(io)?;
                if !ent.file_type().map_err(io)?.is_dir() {
                    names.push(ent.path());
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    names.sort();
    for p in names {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.ends_with(".crt") {
            entry.ca.get_or_insert_with(Vec::new).push(p.clone());
        }
        if let Some(stem) = name.strip_suffix(".cert") {
            let key = dir.join(format!("{stem}.key"));
            let key = match std::fs::metadata(&key) {
                Ok(_) => Some(key),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    return Err(HostsError::Io {
                        path: key,
                        source: e,
                    });
                }
            };
            entry.client.get_or_insert_with(Vec::new).push(ClientCert {
                cert: p.clone(),
                key,
            });
        }
    }
    Ok(vec![entry])
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRoot {
    server: Option<String>,
    capabilities: Option<Vec<String>>,
    ca: Option<toml::Value>,
    client: Option<toml::Value>,
    skip_verify: Option<bool>,
    header: Option<toml::Table>,
    override_path: Option<bool>,
    dial_timeout: Option<String>,
    proxy: Option<String>,
    host: Option<BTreeMap<String, toml::Spanned<FileHost>>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHost {
    capabilities: Option<Vec<String>>,
    ca: Option<toml::Value>,
    client: Option<toml::Value>,
    skip_verify: Option<bool>,
    header: Option<toml::Table>,
    override_path: Option<bool>,
    dial_timeout: Option<String>,
    proxy: Option<String>,
}

fn parse_file(file: &Path, text: &str) -> Result<Vec<Entry>, HostsError> {
    let invalid = |message: String| HostsError::Invalid {
        path: file.to_path_buf(),
        message,
    };
    let root: FileRoot = toml::from_str(text).map_err(|e| {
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                format!("line {line}: ")
            })
            .unwrap_or_default();
        invalid(format!("{at}{}", e.message().trim()))
    })?;
    let base = file.parent().unwrap_or(Path::new("/"));

    let mut hosts: Vec<(usize, String, FileHost)> = root
        .host
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (v.span().start, k, v.into_inner()))
        .collect();
    // File order, as containerd's getSortedHosts.
    hosts.sort_by_key(|(pos, _, _)| *pos);

    let mut out = Vec::new();
    for (_, url, h) in hosts {
        let ctx = format!("[host.{url:?}]");
        let e = parse_entry(Some(&url), base, h).map_err(|m| invalid(format!("{ctx}: {m}")))?;
        out.push(e);
    }
    let server = root.server.filter(|s| !s.is_empty());
    let e = parse_entry(
        server.as_deref(),
        base,
        FileHost {
            capabilities: root.capabilities,
            ca: root.ca,
            client: root.client,
            skip_verify: root.skip_verify,
            header: root.header,
            override_path: root.override_path,
            dial_timeout: root.dial_timeout,
            proxy: root.proxy,
        },
    )
    .map_err(invalid)?;
    out.push(e);
    Ok(out)
}

/// containerd `parseHostConfig`.
fn parse_entry(server: Option<&str>, base: &Path, c: FileHost) -> Result<Entry, String> {
    let mut e = Entry::default();
    let override_path = c.override_path.unwrap_or(false);
    if let Some(server) = server {
        let full = if server.starts_with("http") {
            server.to_string()
        } else if let Some((scheme, _)) = server.split_once("://") {
            return Err(format!(
                "unable to parse server {server}: scheme {scheme:?} is not http or https"
            ));
        } else {
            format!("https://{server}")
        };
        let u = url::Url::parse(&full)
            .map_err(|err| format!("unable to parse server {full}: {err}"))?;
        if u.scheme() != "http" && u.scheme() != "https" {
            return Err(format!(
                "unable to parse server {full}: scheme must be http or https"
            ));
        }
        let host = u
            .host_str()
            .ok_or_else(|| format!("unable to parse server {full}: no host"))?;
        if u.query().is_some() || u.fragment().is_some() || !u.username().is_empty() {
            return Err(format!(
                "server {full}: a query, fragment or user info is not allowed"
            ));
        }
        e.scheme = u.scheme().to_string();
        e.host = match u.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        let path = clean_path(u.path());
        e.path = if path.is_empty() {
            if override_path {
                String::new()
            } else {
                "/v2".into()
            }
        } else if !path.ends_with("/v2") && !override_path {
            format!("{path}/v2")
        } else {
            path
        };
    }
    e.skip_verify = c.skip_verify;
    e.capabilities = match c.capabilities {
        Some(caps) if !caps.is_empty() => {
            let mut out = Capabilities::empty();
            for cap in caps {
                out = out.union(match cap.to_ascii_lowercase().as_str() {
                    "pull" => Capabilities::PULL,
                    "resolve" => Capabilities::RESOLVE,
                    "push" => Capabilities::PUSH,
                    _ => {
                        return Err(format!(
                            "unknown capability {cap:?} (expected \"pull\", \"resolve\" or \"push\")"
                        ));
                    }
                });
            }
            out
        }
        _ => Capabilities::all(),
    };
    let abs = |p: &str| -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    };
    if let Some(ca) = c.ca {
        e.ca = Some(match ca {
            toml::Value::String(s) => vec![abs(&s)],
            toml::Value::Array(a) => a
                .iter()
                .map(|v| v.as_str().map(abs))
                .collect::<Option<Vec<_>>>()
                .ok_or("invalid value for \"ca\": expected a path or an array of paths")?,
            _ => {
                return Err(
                    "invalid value for \"ca\": expected a path or an array of paths".into(),
                );
            }
        });
    }
    if let Some(client) = c.client {
        const WANT: &str = "invalid value for \"client\": expected a path, an array of paths or an array of [cert, key] pairs";
        let mut pairs = Vec::new();
        match client {
            toml::Value::String(s) => pairs.push(ClientCert {
                cert: abs(&s),
                key: None,
            }),
            toml::Value::Array(a) => {
                for v in a {
                    match v {
                        toml::Value::String(s) => pairs.push(ClientCert {
                            cert: abs(&s),
                            key: None,
                        }),
                        toml::Value::Array(pair) => {
                            let strs: Vec<&str> = pair
                                .iter()
                                .map(|x| x.as_str())
                                .collect::<Option<_>>()
                                .ok_or(WANT)?;
                            let [cert, key] = strs[..] else {
                                return Err(format!(
                                    "invalid pair {strs:?} for \"client\": expected [cert, key]"
                                ));
                            };
                            pairs.push(ClientCert {
                                cert: abs(cert),
                                key: (!key.is_empty()).then(|| abs(key)),
                            });
                        }
                        _ => return Err(WANT.into()),
                    }
                }
            }
            _ => return Err(WANT.into()),
        }
        e.client = Some(pairs);
    }
    if let Some(header) = c.header {
        for (name, value) in header {
            let values = match value {
                toml::Value::String(s) => vec![s],
                toml::Value::Array(a) => a
                    .into_iter()
                    .map(|v| match v {
                        toml::Value::String(s) => Some(s),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        format!("invalid value for header {name:?}: expected a string or an array of strings")
                    })?,
                _ => {
                    return Err(format!(
                        "invalid value for header {name:?}: expected a string or an array of strings"
                    ));
                }
            };
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!("invalid header name {name:?}"));
            }
            for v in &values {
                if http::HeaderValue::from_str(v).is_err() {
                    return Err(format!("invalid value {v:?} for header {name:?}"));
                }
            }
            e.headers.push((name, values));
        }
    }
    if let Some(t) = c.dial_timeout {
        e.dial_timeout =
            Some(parse_go_duration(&t).map_err(|m| format!("invalid dial_timeout {t:?}: {m}"))?);
    }
    if let Some(p) = c.proxy {
        e.proxy = Some(validate_proxy(&p)?);
    }
    Ok(e)
}

/// Go's `path.Clean` for URL paths, with "/" treated as empty.
fn clean_path(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("/{}", parts.join("/"))
    }
}

fn validate_proxy(p: &str) -> Result<String, String> {
    let u = url::Url::parse(p).map_err(|e| format!("invalid proxy {p:?}: {e}"))?;
    match u.scheme() {
        "http" | "https" => {}
        "socks5" | "socks5h" => {
            return Err(format!(
                "invalid proxy {p:?}: SOCKS proxies are not supported by nodus; use an http:// or https:// proxy"
            ));
        }
        s => {
            return Err(format!(
                "invalid proxy {p:?}: scheme {s:?} is not one of http, https"
            ));
        }
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(format!("invalid proxy {p:?}: no host"));
    }
    if (u.path() != "/" && !u.path().is_empty()) || u.query().is_some() || u.fragment().is_some() {
        return Err(format!(
            "invalid proxy {p:?}: a path, query or fragment is not allowed"
        ));
    }
    Ok(p.to_string())
}

/// Go's `time.ParseDuration`: `300ms`, `1.5s`, `1m30s`, `2h` (no sign, no bare numbers
/// except `0`).
fn parse_go_duration(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err("expected a number".into());
        }
        let n: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("invalid number {:?}", &rest[..num_len]))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err("missing unit (one of ns, us, ms, s, m, h)".into()),
            u => return Err(format!("unknown unit {u:?}")),
        };
        total += n * scale;
    }
    Duration::try_from_secs_f64(total).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(registry: &str, text: &str) -> Vec<RegistryHost> {
        parse_hosts_file(registry, Path::new("/etc/certs.d/x/hosts.toml"), text)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn err(text: &str) -> String {
        parse_hosts_file("r.io", Path::new("/etc/certs.d/r.io/hosts.toml"), text)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn defaults_without_configuration() {
        let c = HostsConfig::none();
        let h = c.hosts("docker.io").unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].base_url(), "https://registry-1.docker.io/v2");
        assert_eq!(h[0].capabilities, Capabilities::all());
        assert!(!h[0].http_fallback);
        assert_eq!(h[0].skip_verify, None);

        let h = c.hosts("registry.k8s.io").unwrap();
        assert_eq!(h[0].base_url(), "https://registry.k8s.io/v2");

        // Loopback with a port: HTTPS (unverified) first, then HTTP.
        let h = c.hosts("127.0.0.1:5000").unwrap();
        assert_eq!(h[0].base_url(), "https://127.0.0.1:5000/v2");
        assert!(h[0].http_fallback);
        assert_eq!(h[0].skip_verify, Some(true));
        let h = c.hosts("localhost:5000").unwrap();
        assert!(h[0].http_fallback);
        let h = c.hosts("[::1]:5000").unwrap();
        assert!(h[0].http_fallback);
        // Port 80 is plain HTTP, no port (or 443) is HTTPS.
        let h = c.hosts("localhost:80").unwrap();
        assert_eq!(h[0].base_url(), "http://localhost:80/v2");
        assert!(!h[0].http_fallback);
        let h = c.hosts("localhost").unwrap();
        assert_eq!(h[0].base_url(), "https://localhost/v2");
        assert!(!h[0].http_fallback);
        assert_eq!(h[0].skip_verify, Some(true));
        // Not loopback.
        let h = c.hosts("10.0.0.1:5000").unwrap();
        assert_eq!(h[0].base_url(), "https://10.0.0.1:5000/v2");
        assert!(!h[0].http_fallback);
    }

    #[test]
    fn hosts_in_file_order_then_server() {
        let h = parse(
            "docker.io",
            r#"
server = "https://registry-1.docker.io"

[host."https://zz-mirror.example.com"]
  capabilities = ["pull"]
[host."http://aa-mirror.internal:5000/v2/upstream"]
  capabilities = ["pull", "resolve"]
  override_path = true
  [host."http://aa-mirror.internal:5000/v2/upstream".header]
    x-custom = ["a", "b"]
    x-single = "c"
[host."https://mm.example.com/prefix"]
  ca = "mirror.crt"
  client = [["/abs/c.cert", "/abs/c.key"], "both.pem"]
  dial_timeout = "1.5s"
  proxy = "http://proxy:3128"
"#,
        );
        let urls: Vec<String> = h.iter().map(|h| h.base_url()).collect();
        assert_eq!(
            urls,
            [
                "https://zz-mirror.example.com/v2",
                "http://aa-mirror.internal:5000/v2/upstream",
                "https://mm.example.com/prefix/v2",
                "https://registry-1.docker.io/v2",
            ]
        );
        assert_eq!(h[0].capabilities, Capabilities::PULL);
        assert_eq!(
            h[1].capabilities,
            Capabilities::PULL.union(Capabilities::RESOLVE)
        );
        assert_eq!(
            h[1].headers,
            vec![
                (
                    "x-custom".to_string(),
                    vec!["a".to_string(), "b".to_string()]
                ),
                ("x-single".to_string(), vec!["c".to_string()]),
            ]
        );
        assert_eq!(h[2].ca, vec![PathBuf::from("/etc/certs.d/x/mirror.crt")]);
        assert_eq!(
            h[2].client_certs,
            vec![
                ClientCert {
                    cert: "/abs/c.cert".into(),
                    key: Some("/abs/c.key".into())
                },
                ClientCert {
                    cert: "/etc/certs.d/x/both.pem".into(),
                    key: None
                },
            ]
        );
        assert_eq!(h[2].dial_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(h[2].proxy.as_deref(), Some("http://proxy:3128"));
        assert_eq!(h[3].capabilities, Capabilities::all());
    }

    #[test]
    fn server_defaults_and_root_settings() {
        // No server: the registry itself, with the root-level TLS settings.
        let h = parse("r.io", "skip_verify = true\n[host.\"https://m.io\"]\n");
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].base_url(), "https://m.io/v2");
        assert_eq!(h[1].base_url(), "https://r.io/v2");
        assert_eq!(h[1].skip_verify, Some(true));

        // Server without scheme is HTTPS; plain HTTP only when said.
        let h = parse("r.io", "server = \"other.io:5000\"\n");
        assert_eq!(h[0].base_url(), "https://other.io:5000/v2");
        let h = parse("r.io", "server = \"http://127.0.0.1:5000\"\n");
        assert_eq!(h[0].base_url(), "http://127.0.0.1:5000/v2");
        assert!(!h[0].http_fallback);

        // An http:// host with TLS settings on a non-80 port tries HTTPS first.
        let h = parse("r.io", "server = \"http://m.io:5000\"\nca = \"/ca.pem\"\n");
        assert_eq!(h[0].base_url(), "https://m.io:5000/v2");
        assert!(h[0].http_fallback);
        let h = parse("r.io", "server = \"http://m.io\"\nskip_verify = false\n");
        assert_eq!(h[0].base_url(), "http://m.io/v2");
        assert!(!h[0].http_fallback);

        // Paths: /v2 appended unless present or override_path.
        let h = parse("r.io", "server = \"https://m.io/a/b/\"\n");
        assert_eq!(h[0].base_url(), "https://m.io/a/b/v2");
        let h = parse("r.io", "server = \"https://m.io/a/v2\"\n");
        assert_eq!(h[0].base_url(), "https://m.io/a/v2");
        let h = parse("r.io", "server = \"https://m.io\"\noverride_path = true\n");
        assert_eq!(h[0].base_url(), "https://m.io");
        // Docker Hub's directory without server still means registry-1.docker.io.
        let h = parse(
            "docker.io",
            "[host.\"https://m.io\"]\ncapabilities = [\"pull\"]\n",
        );
        assert_eq!(h[1].base_url(), "https://registry-1.docker.io/v2");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let e = err("server = \"https://r.io\"\nmirrors = [\"x\"]\n");
        assert!(e.contains("/etc/certs.d/r.io/hosts.toml"), "{e}");
        assert!(e.contains("unknown field `mirrors`"), "{e}");
        assert!(e.contains("line 2"), "{e}");

        let e = err("[host.\"https://m.io\"]\n  capabilites = [\"pull\"]\n");
        assert!(e.contains("unknown field `capabilites`"), "{e}");

        // Nested hosts are not supported (containerd docs).
        let e = err("[host.\"https://m.io\"]\n[host.\"https://m.io\".host.\"https://n.io\"]\n");
        assert!(e.contains("unknown field `host`"), "{e}");

        let e = err("[host.\"https://m.io\"]\ncapabilities = [\"pull\", \"fetch\"]\n");
        assert!(
            e.contains("[host.\"https://m.io\"]: unknown capability \"fetch\""),
            "{e}"
        );

        let e = err("ca = 3\n");
        assert!(e.contains("invalid value for \"ca\""), "{e}");
        let e = err("client = [[\"a\"]]\n");
        assert!(e.contains("expected [cert, key]"), "{e}");
        let e = err("dial_timeout = \"10\"\n");
        assert!(e.contains("invalid dial_timeout \"10\""), "{e}");
        let e = err("proxy = \"socks5://p:1080\"\n");
        assert!(e.contains("SOCKS proxies are not supported"), "{e}");
        let e = err("proxy = \"http://p:1080/path\"\n");
        assert!(e.contains("path, query or fragment"), "{e}");
        let e = err("[header]\n\"bad header\" = \"x\"\n");
        assert!(e.contains("invalid header name"), "{e}");
        let e = err("skip_verify = \"yes\"\n");
        assert!(e.contains("invalid type"), "{e}");
        let e = err("server = \"ftp://r.io\"\n");
        assert!(
            e.contains("https://ftp://r.io") || e.contains("scheme"),
            "{e}"
        );
    }

    #[test]
    fn directory_lookup_and_cert_layout() {
        let root = tempfile::tempdir().unwrap();
        let c = HostsConfig::new(root.path());

        // host_port_ is preferred over host:port, and _default is the last resort.
        std::fs::create_dir_all(root.path().join("_default")).unwrap();
        std::fs::write(
            root.path().join("_default/hosts.toml"),
            "[host.\"https://default-mirror.io\"]\ncapabilities = [\"pull\"]\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.path().join("r.io_5000_")).unwrap();
        std::fs::write(
            root.path().join("r.io_5000_/hosts.toml"),
            "server = \"http://r.io:5000\"\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.path().join("r.io:5000")).unwrap();
        std::fs::write(
            root.path().join("r.io:5000/hosts.toml"),
            "server = \"https://wrong\"\n",
        )
        .unwrap();

        let h = c.hosts("r.io:5000").unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].base_url(), "http://r.io:5000/v2");

        let h = c.hosts("quay.io").unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].base_url(), "https://default-mirror.io/v2");
        assert_eq!(h[1].base_url(), "https://quay.io/v2");

        // Docker's certificate layout when there is no hosts.toml.
        let d = root.path().join("certs.io");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("ca.crt"), "x").unwrap();
        std::fs::write(d.join("client.cert"), "x").unwrap();
        std::fs::write(d.join("client.key"), "x").unwrap();
        let h = c.hosts("certs.io").unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].base_url(), "https://certs.io/v2");
        assert_eq!(h[0].ca, vec![d.join("ca.crt")]);
        assert_eq!(
            h[0].client_certs,
            vec![ClientCert {
                cert: d.join("client.cert"),
                key: Some(d.join("client.key"))
            }]
        );

        // A broken hosts.toml is an error naming the file.
        let b = root.path().join("broken.io");
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("hosts.toml"), "server = [\n").unwrap();
        let e = c.hosts("broken.io").unwrap_err().to_string();
        assert!(e.contains("broken.io/hosts.toml"), "{e}");
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(
            parse_go_duration("300ms").unwrap(),
            Duration::from_millis(300)
        );
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_go_duration("5").is_err());
        assert!(parse_go_duration("-1s").is_err());
        assert!(parse_go_duration("1d").is_err());
    }

    #[test]
    fn localhost_detection() {
        assert!(is_localhost("localhost"));
        assert!(is_localhost("localhost:5000"));
        assert!(is_localhost("127.0.0.1:5000"));
        assert!(is_localhost("127.1.2.3"));
        assert!(is_localhost("[::1]:5000"));
        assert!(!is_localhost("10.0.0.1:5000"));
        assert!(!is_localhost("docker.io"));
        assert!(!is_localhost("localhost.example.com"));
    }
}
