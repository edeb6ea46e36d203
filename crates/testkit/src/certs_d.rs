//! containerd-style registry host directories: `certs.d/<host>/hosts.toml`.
//!
//! Both containerd (`[plugins."io.containerd.grpc.v1.cri".registry] config_path`) and nodus
//! (`registry-config-dir`) read this layout, so mirror tests write it once with [`CertsD`]
//! and point either runtime at [`CertsD::path`].
//!
//! ```
//! use testkit::{CertsD, HostEntry};
//! let certs = CertsD::new().unwrap();
//! certs.add("docker.io", None, &[HostEntry::new("http://127.0.0.1:5000")]).unwrap();
//! let toml = std::fs::read_to_string(certs.path().join("docker.io/hosts.toml")).unwrap();
//! assert!(toml.contains(r#"[host."http://127.0.0.1:5000"]"#));
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tempfile::TempDir;

/// One `[host."<url>"]` table of a `hosts.toml`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostEntry {
    /// `scheme://host[:port]`, e.g. `http://127.0.0.1:5000`.
    pub url: String,
    /// Default `["pull", "resolve"]`.
    pub capabilities: Vec<String>,
    /// Default `true`.
    pub skip_verify: bool,
    /// `override_path`: the URL already holds the API path (default `false`).
    pub override_path: bool,
    /// Extra request headers (`[host."<url>".header]`).
    pub headers: BTreeMap<String, String>,
}

impl HostEntry {
    /// A pull/resolve mirror at `url`, TLS verification skipped.
    pub fn new(url: impl Into<String>) -> HostEntry {
        HostEntry {
            url: url.into(),
            capabilities: vec!["pull".into(), "resolve".into()],
            skip_verify: true,
            override_path: false,
            headers: BTreeMap::new(),
        }
    }

    /// Sets the capabilities (`pull`, `resolve`, `push`).
    pub fn capabilities(mut self, caps: &[&str]) -> HostEntry {
        self.capabilities = caps.iter().map(|c| c.to_string()).collect();
        self
    }

    /// Sets `skip_verify`.
    pub fn skip_verify(mut self, skip: bool) -> HostEntry {
        self.skip_verify = skip;
        self
    }

    /// Sets `override_path`.
    pub fn override_path(mut self, value: bool) -> HostEntry {
        self.override_path = value;
        self
    }

    /// Adds a request header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> HostEntry {
        self.headers.insert(name.into(), value.into());
        self
    }
}

fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The text of a `hosts.toml`: optional `server`, then one table per host, in order (the
/// order is the order containerd tries them in).
pub fn hosts_toml(server: Option<&str>, hosts: &[HostEntry]) -> String {
    let mut out = String::new();
    if let Some(s) = server {
        let _ = writeln!(out, "server = {}\n", quote(s));
    }
    for h in hosts {
        let caps: Vec<String> = h.capabilities.iter().map(|c| quote(c)).collect();
        let _ = writeln!(out, "[host.{}]", quote(&h.url));
        let _ = writeln!(out, "  capabilities = [{}]", caps.join(", "));
        let _ = writeln!(out, "  skip_verify = {}", h.skip_verify);
        if h.override_path {
            let _ = writeln!(out, "  override_path = true");
        }
        if !h.headers.is_empty() {
            let _ = writeln!(out, "  [host.{}.header]", quote(&h.url));
            for (k, v) in &h.headers {
                let _ = writeln!(out, "    {} = [{}]", quote(k), quote(v));
            }
        }
        out.push('\n');
    }
    out
}

/// A temp `certs.d` directory, removed on drop.
#[derive(Debug)]
pub struct CertsD {
    dir: TempDir,
}

impl CertsD {
    /// An empty `certs.d` directory.
    pub fn new() -> Result<CertsD> {
        Ok(CertsD {
            dir: tempfile::Builder::new()
                .prefix("testkit-certs.d-")
                .tempdir()?,
        })
    }

    /// The directory to pass as containerd's `config_path` / nodus's `registry-config-dir`.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `<dir>/<host>/hosts.toml` (`host` as in image references: `docker.io`,
    /// `127.0.0.1:5000`, or `_default`). Returns the file's path.
    pub fn add(&self, host: &str, server: Option<&str>, hosts: &[HostEntry]) -> Result<PathBuf> {
        let dir = self.dir.path().join(host);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let file = dir.join("hosts.toml");
        std::fs::write(&file, hosts_toml(server, hosts))?;
        Ok(file)
    }

    /// Shorthand: images of `host` are pulled from the plain-HTTP mirror `mirror_host`
    /// (`127.0.0.1:PORT`) first, then from `server` if given.
    pub fn mirror(&self, host: &str, mirror_host: &str, server: Option<&str>) -> Result<PathBuf> {
        self.add(
            host,
            server,
            &[HostEntry::new(format!("http://{mirror_host}"))],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_parseable_hosts_toml() {
        let c = CertsD::new().unwrap();
        let file = c
            .add(
                "127.0.0.1:5000",
                Some("http://127.0.0.1:5000"),
                &[
                    HostEntry::new("http://127.0.0.1:6000"),
                    HostEntry::new("https://127.0.0.1:7000")
                        .capabilities(&["pull"])
                        .skip_verify(false)
                        .override_path(true)
                        .header("X-Test", "1"),
                ],
            )
            .unwrap();
        assert_eq!(file, c.path().join("127.0.0.1:5000/hosts.toml"));
        let v: toml::Value = toml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(v["server"].as_str(), Some("http://127.0.0.1:5000"));
        let a = &v["host"]["http://127.0.0.1:6000"];
        assert_eq!(a["capabilities"].as_array().unwrap().len(), 2);
        assert_eq!(a["skip_verify"].as_bool(), Some(true));
        let b = &v["host"]["https://127.0.0.1:7000"];
        assert_eq!(b["override_path"].as_bool(), Some(true));
        assert_eq!(b["header"]["X-Test"][0].as_str(), Some("1"));
        let path = c.path().to_path_buf();
        drop(c);
        assert!(!path.exists());
    }
}
