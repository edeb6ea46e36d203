//! The files a sandbox gives its containers, as containerd writes them under the sandbox's
//! directory: `hostname`, `resolv.conf`, `hosts`, and the pod's `/dev/shm` tmpfs.
//!
//! The kubelet bind-mounts its own `/etc/hosts` into pod containers; the runtime's `hosts`
//! file is what containers get when it does not (crictl, other clients).

use super::SandboxError;
use cri::runtime::v1::DnsConfig;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The node's resolver configuration, copied when the pod has no DNS config of its own.
pub const HOST_RESOLV_CONF: &str = "/etc/resolv.conf";
/// The node's hosts file, copied for pods in the node's network namespace.
pub const HOST_HOSTS: &str = "/etc/hosts";
/// containerd's default size of a sandbox's /dev/shm: 64 MiB.
pub const DEFAULT_SHM_SIZE: u64 = 64 * 1024 * 1024;

/// Writes `path` atomically (temporary file in the same directory, then rename), mode 0644.
///
/// Not synced: these files are made from the sandbox's config whenever the sandbox is, and
/// a host crash that could lose them also ends the sandbox (its namespaces are gone after
/// a reboot, so the kubelet makes a new one), while a daemon crash keeps them in the page
/// cache. The rename still keeps readers from ever seeing half a file.
fn write_atomic(path: &Path, content: &[u8]) -> Result<(), SandboxError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| SandboxError::io("creating", dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(content)?;
        f.set_permissions(fs::Permissions::from_mode(0o644))?;
        fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        SandboxError::io("writing", path, e)
    })
}

/// `hostname` of the sandbox: the pod's hostname and a newline, like containerd. An empty
/// hostname (hostNetwork pods) means the node's.
pub fn write_hostname(path: &Path, hostname: &str) -> Result<(), SandboxError> {
    let name = if hostname.is_empty() {
        node_hostname()?
    } else {
        hostname.to_string()
    };
    write_atomic(path, format!("{name}\n").as_bytes())
}

fn node_hostname() -> Result<String, SandboxError> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the kernel NUL-terminates names shorter than it.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return Err(SandboxError::sys("gethostname", nix::errno::Errno::last()));
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// resolv.conf content for a CRI DNS config, containerd's format (`search`, `nameserver`
/// lines, `options`); `None` when the config has nothing (the node's file is used then).
pub fn resolv_conf_content(dns: &DnsConfig) -> Option<String> {
    let mut out = String::new();
    if !dns.searches.is_empty() {
        out.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for server in &dns.servers {
        out.push_str(&format!("nameserver {server}\n"));
    }
    if !dns.options.is_empty() {
        out.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    (!out.is_empty()).then_some(out)
}

/// `resolv.conf` of the sandbox: from the pod's DNS config, or a copy of the node's
/// `/etc/resolv.conf` when there is none (or it is empty), as containerd does.
pub fn write_resolv_conf(path: &Path, dns: Option<&DnsConfig>) -> Result<(), SandboxError> {
    write_resolv_conf_from(path, dns, Path::new(HOST_RESOLV_CONF))
}

/// [`write_resolv_conf`] with the node's resolv.conf elsewhere (kubelet `--resolv-conf`).
pub fn write_resolv_conf_from(
    path: &Path,
    dns: Option<&DnsConfig>,
    host_resolv_conf: &Path,
) -> Result<(), SandboxError> {
    match dns.and_then(resolv_conf_content) {
        Some(content) => write_atomic(path, content.as_bytes()),
        None => copy_file(host_resolv_conf, path),
    }
}

/// What a generated hosts file holds besides the localhost entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostsFile {
    pub hostname: String,
    /// The pod's subdomain-qualified name (`<hostname>.<subdomain>.<ns>.svc.<domain>`), if any.
    pub fqdn: Option<String>,
    /// The pod's IPs, each mapped to the hostname.
    pub ips: Vec<IpAddr>,
    /// `hostAliases`: an IP and its names.
    pub host_aliases: Vec<(IpAddr, Vec<String>)>,
}

/// The kubelet's managed hosts file layout.
pub fn hosts_content(hosts: &HostsFile) -> String {
    let mut out = String::from(
        "# Kubernetes-managed hosts file.\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    for ip in &hosts.ips {
        match &hosts.fqdn {
            Some(fqdn) => out.push_str(&format!("{ip}\t{fqdn}\t{}\n", hosts.hostname)),
            None => out.push_str(&format!("{ip}\t{}\n", hosts.hostname)),
        }
    }
    if !hosts.host_aliases.is_empty() {
        out.push_str("\n# Entries added by HostAliases.\n");
        for (ip, names) in &hosts.host_aliases {
            out.push_str(&format!("{ip}\t{}\n", names.join("\t")));
        }
    }
    out
}

/// `hosts` of the sandbox: generated from `hosts`, or a copy of the node's `/etc/hosts` when
/// `None` (hostNetwork pods; containerd always copies).
pub fn write_hosts(path: &Path, hosts: Option<&HostsFile>) -> Result<(), SandboxError> {
    match hosts {
        Some(h) => write_atomic(path, hosts_content(h).as_bytes()),
        None => copy_file(Path::new(HOST_HOSTS), path),
    }
}

fn copy_file(from: &Path, to: &Path) -> Result<(), SandboxError> {
    let content = match fs::read(from) {
        Ok(c) => c,
        // A node without the file gives its pods an empty one rather than failing the pod.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(SandboxError::io("reading", from, e)),
    };
    write_atomic(to, &content)
}

/// Mounts the sandbox's /dev/shm: a tmpfs `shm` of `size` bytes, mode 1777,
/// nosuid,nodev,noexec (containerd's options). `path` is created as a directory.
pub fn mount_shm(path: &Path, size: u64) -> Result<(), SandboxError> {
    fs::create_dir_all(path).map_err(|e| SandboxError::io("creating", path, e))?;
    let data = format!("mode=1777,size={size}");
    mount(
        Some("shm"),
        path,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(data.as_str()),
    )
    .map_err(|e| SandboxError::sys(format!("mounting shm tmpfs on {}", path.display()), e))
}

/// Detaches every mount stacked on `path` (none: nothing to do).
pub(crate) fn detach_all(path: &Path) -> Result<(), SandboxError> {
    loop {
        match umount2(path, MntFlags::MNT_DETACH) {
            Ok(()) => continue,
            Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => return Ok(()),
            Err(e) => {
                return Err(SandboxError::sys(
                    format!("unmounting {}", path.display()),
                    e,
                ));
            }
        }
    }
}

/// Unmounts (every mount stacked on) the sandbox's /dev/shm and removes the directory.
/// Idempotent.
pub fn unmount_shm(path: &Path) -> Result<(), SandboxError> {
    detach_all(path)?;
    match fs::remove_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SandboxError::io("removing", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_resolv_conf_from_dns_config_or_host_copy() {
        let dns = DnsConfig {
            servers: vec!["10.96.0.10".into(), "10.96.0.11".into()],
            searches: vec![
                "default.svc.cluster.local".into(),
                "svc.cluster.local".into(),
            ],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf_content(&dns).unwrap(),
            "search default.svc.cluster.local svc.cluster.local\n\
             nameserver 10.96.0.10\nnameserver 10.96.0.11\noptions ndots:5\n"
        );
        assert_eq!(resolv_conf_content(&DnsConfig::default()), None);

        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("host-resolv.conf");
        fs::write(&host, "nameserver 192.0.2.53\n").unwrap();
        let out = tmp.path().join("sb/resolv.conf");
        write_resolv_conf_from(&out, Some(&DnsConfig::default()), &host).unwrap();
        assert_eq!(fs::read_to_string(&out).unwrap(), "nameserver 192.0.2.53\n");
        write_resolv_conf_from(&out, Some(&dns), &host).unwrap();
        assert!(fs::read_to_string(&out).unwrap().starts_with("search "));
        let mode = fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    #[test]
    fn sandbox_hostname_and_hosts_files() {
        let tmp = tempfile::tempdir().unwrap();
        let h = tmp.path().join("hostname");
        write_hostname(&h, "web-0").unwrap();
        assert_eq!(fs::read_to_string(&h).unwrap(), "web-0\n");

        let hosts = HostsFile {
            hostname: "web-0".into(),
            fqdn: Some("web-0.web.default.svc.cluster.local".into()),
            ips: vec!["10.244.1.5".parse().unwrap()],
            host_aliases: vec![(
                "192.0.2.1".parse().unwrap(),
                vec!["foo.local".into(), "bar.local".into()],
            )],
        };
        let content = hosts_content(&hosts);
        assert!(content.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(content.contains("10.244.1.5\tweb-0.web.default.svc.cluster.local\tweb-0\n"));
        assert!(
            content.ends_with("# Entries added by HostAliases.\n192.0.2.1\tfoo.local\tbar.local\n")
        );
        let p = tmp.path().join("hosts");
        write_hosts(&p, Some(&hosts)).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), content);
    }
}
