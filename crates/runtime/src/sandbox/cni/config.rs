//! CNI network configuration: loading the conf dir the way libcni and ocicni do, the
//! per-plugin configuration handed to a plugin on stdin, and nodus's default conflist.

use super::CniError;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Extensions libcni's `ConfFiles` looks at; other files in the conf dir are ignored.
pub const CONF_EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

/// Spec versions a configuration may declare.
pub const SUPPORTED_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// A network: a named chain of plugins (a `.conflist`, or a single `.conf` made into one).
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfigList {
    pub name: String,
    pub cni_version: String,
    pub disable_check: bool,
    pub plugins: Vec<PluginConfig>,
    /// The list as JSON bytes (synthesised for a single `.conf`): what the cache records.
    pub bytes: Vec<u8>,
    /// The file it came from.
    pub source: Option<PathBuf>,
}

/// One plugin of a chain.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    /// The plugin binary's name (`type`).
    pub plugin_type: String,
    /// Capabilities the plugin declares `true` (`portMappings`, `bandwidth`, `dns`, ...).
    pub capabilities: BTreeSet<String>,
    /// The plugin's configuration object as written.
    pub raw: Map<String, Value>,
}

/// libcni's rule for network names (they become cache file names).
pub fn valid_network_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn plugin_from_value(v: &Value, index: usize) -> Result<PluginConfig, String> {
    let raw = v
        .as_object()
        .ok_or_else(|| format!("plugin #{index} is not a JSON object"))?
        .clone();
    let plugin_type = raw
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if plugin_type.is_empty() {
        return Err(format!("plugin #{index} has no \"type\""));
    }
    if plugin_type.contains('/') || plugin_type == "." || plugin_type == ".." {
        return Err(format!(
            "plugin #{index} has an invalid type {plugin_type:?}: a type is a binary name, not a path"
        ));
    }
    let capabilities = match raw.get("capabilities") {
        None | Some(Value::Null) => BTreeSet::new(),
        Some(Value::Object(caps)) => caps
            .iter()
            .filter(|(_, on)| on.as_bool() == Some(true))
            .map(|(k, _)| k.clone())
            .collect(),
        Some(_) => {
            return Err(format!(
                "plugin #{index}: \"capabilities\" must be an object"
            ));
        }
    };
    Ok(PluginConfig {
        plugin_type,
        capabilities,
        raw,
    })
}

fn parse_version(v: Option<&Value>) -> Result<String, String> {
    match v {
        None | Some(Value::Null) => Ok("0.1.0".into()),
        Some(Value::String(s)) if s.is_empty() => Ok("0.1.0".into()),
        Some(Value::String(s)) if SUPPORTED_VERSIONS.contains(&s.as_str()) => Ok(s.clone()),
        Some(Value::String(s)) => Err(format!(
            "unsupported cniVersion {s:?} (supported: {})",
            SUPPORTED_VERSIONS.join(", ")
        )),
        Some(_) => Err("\"cniVersion\" must be a string".into()),
    }
}

fn parse_bool(v: Option<&Value>, key: &str) -> Result<bool, String> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(_) => Err(format!("{key:?} must be true or false")),
    }
}

fn parse_name(v: Option<&Value>) -> Result<String, String> {
    let name = v.and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        return Err("no \"name\"".into());
    }
    if !valid_network_name(name) {
        return Err(format!(
            "invalid network name {name:?}: letters, digits, '_', '.', '-', starting with a letter or digit"
        ));
    }
    Ok(name.to_string())
}

impl NetworkConfigList {
    /// A `.conflist`: `{name, cniVersion, disableCheck?, plugins: [...]}`.
    pub fn from_conflist_bytes(bytes: &[u8], source: Option<&Path>) -> Result<Self, String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let obj = v.as_object().ok_or("not a JSON object")?;
        let name = parse_name(obj.get("name"))?;
        let cni_version = parse_version(obj.get("cniVersion"))?;
        let disable_check = parse_bool(obj.get("disableCheck"), "disableCheck")?;
        let plugins = match obj.get("plugins") {
            None => return Err("no \"plugins\" key".into()),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, p)| plugin_from_value(p, i))
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err("\"plugins\" must be an array".into()),
        };
        if plugins.is_empty() {
            return Err("the list has no plugins".into());
        }
        Ok(NetworkConfigList {
            name,
            cni_version,
            disable_check,
            plugins,
            bytes: bytes.to_vec(),
            source: source.map(Path::to_path_buf),
        })
    }

    /// A single-plugin `.conf`/`.json`, made into a one-element list (libcni's
    /// `ConfListFromConf`).
    pub fn from_conf_bytes(bytes: &[u8], source: Option<&Path>) -> Result<Self, String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let obj = v.as_object().ok_or("not a JSON object")?;
        if obj.get("type").is_none() && obj.get("plugins").is_some() {
            return Err("no \"type\"; perhaps this is a .conflist?".into());
        }
        let name = parse_name(obj.get("name"))?;
        let cni_version = parse_version(obj.get("cniVersion"))?;
        let plugin = plugin_from_value(&v, 0)?;
        let list = json!({"cniVersion": cni_version, "name": name, "plugins": [v]});
        Ok(NetworkConfigList {
            name,
            cni_version,
            disable_check: false,
            plugins: vec![plugin],
            bytes: serde_json::to_vec(&list).unwrap_or_default(),
            source: source.map(Path::to_path_buf),
        })
    }

    /// Reads a file, as a list when it ends in `.conflist`, else as a single plugin.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let bytes = fs::read(path).map_err(|e| e.to_string())?;
        if path.extension().is_some_and(|e| e == "conflist") {
            Self::from_conflist_bytes(&bytes, Some(path))
        } else {
            Self::from_conf_bytes(&bytes, Some(path))
        }
    }

    /// Whether the list's version is at least `v` (`"0.4.0"` for CHECK and DEL's prevResult).
    pub fn version_at_least(&self, v: &str) -> bool {
        version_tuple(&self.cni_version) >= version_tuple(v)
    }
}

fn version_tuple(v: &str) -> (u32, u32, u32) {
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    )
}

/// The configuration files of `dir` in lexical order of their names (libcni `ConfFiles`):
/// regular files (or links to them) ending in `.conf`, `.conflist` or `.json`.
pub fn conf_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if !path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| CONF_EXTENSIONS.contains(&e))
        {
            continue;
        }
        if fs::metadata(&path).map(|m| m.is_file()).unwrap_or(false) {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// The default network: the first valid configuration of `dir`. Invalid files are skipped with
/// a warning (ocicni); when none is valid the error lists why each was skipped.
pub fn load_dir(dir: &Path) -> Result<NetworkConfigList, CniError> {
    let files = match conf_files(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(CniError::NotInitialized {
                reason: format!("reading network config dir {}: {e}", dir.display()),
            });
        }
    };
    let mut skipped = Vec::new();
    for file in files {
        match NetworkConfigList::from_file(&file) {
            Ok(list) => return Ok(list),
            Err(reason) => {
                tracing::warn!(file = %file.display(), %reason, "skipping invalid CNI network config");
                skipped.push(format!("{}: {reason}", file.display()));
            }
        }
    }
    let mut reason = format!("no network config found in {}", dir.display());
    if !skipped.is_empty() {
        reason.push_str(&format!(" (skipped invalid files: {})", skipped.join("; ")));
    }
    Err(CniError::NotInitialized { reason })
}

/// The configuration one plugin reads on stdin: its own object with the list's `name` and
/// `cniVersion`, `prevResult` when given, and `runtimeConfig` holding the capability
/// arguments it declared (libcni `buildOneConfig` / `injectRuntimeConfig`).
pub fn plugin_stdin(
    list: &NetworkConfigList,
    plugin: &PluginConfig,
    prev_result: Option<&Value>,
    capability_args: &Map<String, Value>,
) -> Vec<u8> {
    let mut conf = plugin.raw.clone();
    conf.insert("name".into(), Value::String(list.name.clone()));
    conf.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
    if let Some(prev) = prev_result {
        conf.insert("prevResult".into(), prev.clone());
    }
    let runtime_config: Map<String, Value> = plugin
        .capabilities
        .iter()
        .filter_map(|cap| capability_args.get(cap).map(|v| (cap.clone(), v.clone())))
        .collect();
    if !runtime_config.is_empty() {
        conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
    }
    serde_json::to_vec(&Value::Object(conf)).unwrap_or_default()
}

/// The loopback network every sandbox gets first, on `lo` (containerd's `WithLoNetwork`).
pub fn loopback_list() -> NetworkConfigList {
    let bytes = br#"{"cniVersion":"1.0.0","name":"cni-loopback","plugins":[{"type":"loopback"}]}"#;
    NetworkConfigList {
        name: super::LOOPBACK_NETWORK.into(),
        cni_version: "1.0.0".into(),
        disable_check: false,
        plugins: vec![PluginConfig {
            plugin_type: "loopback".into(),
            capabilities: BTreeSet::new(),
            raw: serde_json::from_slice::<Map<String, Value>>(br#"{"type":"loopback"}"#)
                .unwrap_or_default(),
        }],
        bytes: bytes.to_vec(),
        source: None,
    }
}

/// nodus's default network, written when the conf dir is empty: a bridge with host-local
/// IPAM over the pod CIDR(s), and portmap for hostPorts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultNetwork {
    /// File name in the conf dir.
    pub file_name: String,
    /// Network name.
    pub name: String,
    /// Linux bridge on the node.
    pub bridge: String,
    /// Pod subnets, one per IP family (the node's `podCIDRs`).
    pub subnets: Vec<String>,
    /// host-local's allocation directory (its default is /var/lib/cni/networks).
    pub ipam_data_dir: Option<PathBuf>,
    /// The bridge plugin masquerades traffic leaving the pod subnet; off when a pod network
    /// agent masquerades only traffic leaving the whole cluster's pod network.
    pub ip_masq: bool,
}

/// The subnet used when the node has no pod CIDR (containerd's and CRI-O's default).
pub const DEFAULT_SUBNET: &str = "10.88.0.0/16";

impl DefaultNetwork {
    /// `pod_cidr` may be a comma-separated dual-stack list (`10.244.1.0/24,fd00:1::/64`).
    pub fn new(pod_cidr: Option<&str>) -> Self {
        let subnets: Vec<String> = pod_cidr
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        DefaultNetwork {
            file_name: "10-nodus.conflist".into(),
            name: "nodus".into(),
            bridge: "cni0".into(),
            subnets: if subnets.is_empty() {
                vec![DEFAULT_SUBNET.into()]
            } else {
                subnets
            },
            ipam_data_dir: None,
            ip_masq: true,
        }
    }

    pub fn with_ip_masq(mut self, on: bool) -> Self {
        self.ip_masq = on;
        self
    }

    pub fn with_ipam_data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.ipam_data_dir = Some(dir.into());
        self
    }

    /// The conflist.
    pub fn conflist(&self) -> Result<Value, CniError> {
        let bad = |reason: String| CniError::InvalidConfig {
            path: PathBuf::from(&self.file_name),
            reason,
        };
        if !valid_network_name(&self.name) {
            return Err(bad(format!("invalid network name {:?}", self.name)));
        }
        let mut ranges = Vec::new();
        let mut routes = Vec::new();
        let (mut v4, mut v6) = (false, false);
        for subnet in &self.subnets {
            let ip = parse_cidr(subnet).map_err(|e| bad(format!("pod CIDR {subnet:?}: {e}")))?;
            ranges.push(json!([{ "subnet": subnet }]));
            match ip {
                IpAddr::V4(_) if !v4 => {
                    v4 = true;
                    routes.push(json!({ "dst": "0.0.0.0/0" }));
                }
                IpAddr::V6(_) if !v6 => {
                    v6 = true;
                    routes.push(json!({ "dst": "::/0" }));
                }
                _ => {
                    return Err(bad(format!(
                        "two pod CIDRs of the same IP family: {subnet}"
                    )));
                }
            }
        }
        let mut ipam = json!({ "type": "host-local", "ranges": ranges, "routes": routes });
        if let Some(dir) = &self.ipam_data_dir {
            ipam["dataDir"] = Value::String(dir.to_string_lossy().into_owned());
        }
        Ok(json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": true,
                    "ipMasq": self.ip_masq,
                    "hairpinMode": true,
                    // When the node's pod CIDR replaces the default subnet, a bridge made
                    // under the old one is re-addressed instead of refusing every new pod.
                    "forceAddress": true,
                    "ipam": ipam,
                },
                { "type": "portmap", "capabilities": { "portMappings": true } },
            ],
        }))
    }
}

/// Parses `ip/prefix`, returning the address.
pub fn parse_cidr(s: &str) -> Result<IpAddr, String> {
    let (ip, prefix) = s.split_once('/').ok_or("missing /prefix")?;
    let ip: IpAddr = ip.parse().map_err(|_| format!("bad address {ip:?}"))?;
    let prefix: u8 = prefix
        .parse()
        .map_err(|_| format!("bad prefix length {prefix:?}"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(format!("prefix length {prefix} exceeds {max}"));
    }
    Ok(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_cni_conf_dir_is_read_in_lexical_order_skipping_invalid_files() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        assert!(matches!(
            load_dir(&d.join("missing")),
            Err(CniError::NotInitialized { .. })
        ));
        let err = load_dir(d).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "cni plugin not initialized: no network config found in {}",
                d.display()
            )
        );

        fs::write(
            d.join("99-last.conflist"),
            r#"{"cniVersion":"1.0.0","name":"last","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        fs::write(d.join("50-single.conf"), r#"{"cniVersion":"0.4.0","name":"single","type":"ptp","capabilities":{"portMappings":true,"bandwidth":false}}"#).unwrap();
        fs::write(d.join("10-broken.json"), "{not json").unwrap();
        fs::write(d.join("05-readme.txt"), "ignored").unwrap();
        fs::write(
            d.join("07-noplugins.conflist"),
            r#"{"cniVersion":"1.0.0","name":"x","plugins":[]}"#,
        )
        .unwrap();
        fs::create_dir(d.join("01-dir.conf")).unwrap();

        let names: Vec<_> = conf_files(d)
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "07-noplugins.conflist",
                "10-broken.json",
                "50-single.conf",
                "99-last.conflist"
            ]
        );
        let list = load_dir(d).unwrap();
        assert_eq!(list.name, "single");
        assert_eq!(list.cni_version, "0.4.0");
        assert_eq!(list.plugins.len(), 1);
        assert_eq!(list.plugins[0].plugin_type, "ptp");
        assert_eq!(
            list.plugins[0].capabilities,
            BTreeSet::from(["portMappings".to_string()])
        );
        assert!(list.version_at_least("0.4.0"));
        // The synthesised list round-trips.
        let again = NetworkConfigList::from_conflist_bytes(&list.bytes, None).unwrap();
        assert_eq!(again.plugins, list.plugins);

        fs::remove_file(d.join("50-single.conf")).unwrap();
        assert_eq!(load_dir(d).unwrap().name, "last");
        fs::remove_file(d.join("99-last.conflist")).unwrap();
        let err = load_dir(d).unwrap_err().to_string();
        assert!(err.contains("no network config found in"), "{err}");
        assert!(err.contains("10-broken.json: not JSON"), "{err}");
        assert!(
            err.contains("07-noplugins.conflist: the list has no plugins"),
            "{err}"
        );
    }

    #[test]
    fn sandbox_cni_invalid_configs_say_why() {
        let cases: &[(&str, bool, &str)] = &[
            (
                r#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#,
                true,
                "no \"name\"",
            ),
            (
                r#"{"name":"n","cniVersion":"9.9.9","plugins":[{"type":"bridge"}]}"#,
                true,
                "unsupported cniVersion",
            ),
            (
                r#"{"name":"n","plugins":[{"bridge":"cni0"}]}"#,
                true,
                "plugin #0 has no \"type\"",
            ),
            (
                r#"{"name":"n","plugins":[{"type":"../evil"}]}"#,
                true,
                "not a path",
            ),
            (
                r#"{"name":"n/x","plugins":[{"type":"bridge"}]}"#,
                true,
                "invalid network name",
            ),
            (r#"{"name":"n"}"#, true, "no \"plugins\" key"),
            (
                r#"{"name":"n","plugins":[{"type":"bridge"}]}"#,
                false,
                "perhaps this is a .conflist",
            ),
        ];
        for (json, is_list, want) in cases {
            let err = if *is_list {
                NetworkConfigList::from_conflist_bytes(json.as_bytes(), None).unwrap_err()
            } else {
                NetworkConfigList::from_conf_bytes(json.as_bytes(), None).unwrap_err()
            };
            assert!(err.contains(want), "{json}: {err}");
        }
        // No cniVersion means 0.1.0.
        let l = NetworkConfigList::from_conflist_bytes(
            br#"{"name":"n","plugins":[{"type":"b"}]}"#,
            None,
        )
        .unwrap();
        assert_eq!(l.cni_version, "0.1.0");
        assert!(!l.version_at_least("0.4.0"));
    }

    #[test]
    fn sandbox_cni_plugin_stdin_injects_name_version_prev_result_and_runtime_config() {
        let list = NetworkConfigList::from_conflist_bytes(
            br#"{"cniVersion":"1.0.0","name":"net1","plugins":[
                {"type":"bridge","bridge":"cni0"},
                {"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false},"runtimeConfig":{"old":1}}]}"#,
            None,
        )
        .unwrap();
        let mut caps = Map::new();
        caps.insert(
            "portMappings".into(),
            json!([{"hostPort":80,"containerPort":8080,"protocol":"tcp"}]),
        );
        caps.insert("bandwidth".into(), json!({"ingressRate":1}));
        let prev = json!({"cniVersion":"1.0.0","ips":[]});

        let first: Value =
            serde_json::from_slice(&plugin_stdin(&list, &list.plugins[0], None, &caps)).unwrap();
        assert_eq!(
            first,
            json!({"type":"bridge","bridge":"cni0","name":"net1","cniVersion":"1.0.0"})
        );

        let second: Value =
            serde_json::from_slice(&plugin_stdin(&list, &list.plugins[1], Some(&prev), &caps))
                .unwrap();
        assert_eq!(second["prevResult"], prev);
        assert_eq!(second["name"], "net1");
        // Only declared capabilities, and runtimeConfig is replaced as a whole.
        assert_eq!(
            second["runtimeConfig"],
            json!({"portMappings":[{"hostPort":80,"containerPort":8080,"protocol":"tcp"}]})
        );
    }

    #[test]
    fn sandbox_cni_default_conflist() {
        let v = DefaultNetwork::new(None).conflist().unwrap();
        assert_eq!(v["name"], "nodus");
        assert_eq!(v["plugins"][0]["type"], "bridge");
        assert_eq!(v["plugins"][0]["bridge"], "cni0");
        assert_eq!(v["plugins"][0]["isGateway"], true);
        assert_eq!(v["plugins"][0]["ipMasq"], true);
        assert_eq!(v["plugins"][0]["hairpinMode"], true);
        assert_eq!(v["plugins"][0]["forceAddress"], true);
        assert_eq!(
            v["plugins"][0]["ipam"]["ranges"],
            json!([[{"subnet":"10.88.0.0/16"}]])
        );
        assert_eq!(
            v["plugins"][0]["ipam"]["routes"],
            json!([{"dst":"0.0.0.0/0"}])
        );
        assert!(v["plugins"][0]["ipam"].get("dataDir").is_none());
        assert_eq!(
            v["plugins"][1],
            json!({"type":"portmap","capabilities":{"portMappings":true}})
        );

        let dual = DefaultNetwork::new(Some("10.244.7.0/24, fd00:7::/64"))
            .with_ipam_data_dir("/tmp/x/ipam")
            .conflist()
            .unwrap();
        let ipam = &dual["plugins"][0]["ipam"];
        assert_eq!(
            ipam["ranges"],
            json!([[{"subnet":"10.244.7.0/24"}],[{"subnet":"fd00:7::/64"}]])
        );
        assert_eq!(ipam["routes"], json!([{"dst":"0.0.0.0/0"},{"dst":"::/0"}]));
        assert_eq!(ipam["dataDir"], "/tmp/x/ipam");
        assert_eq!(dual["plugins"][0]["ipMasq"], true);
        let no_masq = DefaultNetwork::new(None)
            .with_ip_masq(false)
            .conflist()
            .unwrap();
        assert_eq!(no_masq["plugins"][0]["ipMasq"], false);
        let bytes = serde_json::to_vec(&dual).unwrap();
        assert_eq!(
            NetworkConfigList::from_conflist_bytes(&bytes, None)
                .unwrap()
                .plugins
                .len(),
            2
        );

        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "nonsense/8",
            "10.0.0.0/8,10.1.0.0/16",
        ] {
            assert!(DefaultNetwork::new(Some(bad)).conflist().is_err(), "{bad}");
        }
    }
}
