//! Pod sandbox and container config files, read as crictl reads them (`sigs.k8s.io/yaml`
//! into the CRI Go structs): JSON or YAML, snake_case (Go) or camelCase (protobuf JSON) keys.

use crate::format::message_from_json;
use cri::runtime::v1::{ContainerConfig, PodSandboxConfig};
use serde_json::Value;

fn read_value(path: &str) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!("config at {path} not found")
        } else {
            format!("read {path}: {e}")
        }
    })?;
    parse_config(&text)
}

/// A config file's text, JSON or YAML, as JSON.
fn parse_config(text: &str) -> Result<Value, String> {
    match serde_json::from_str(text) {
        Ok(v) => Ok(v),
        Err(json_err) => yaml_serde::from_str(text).map_err(|yaml_err| {
            if text.trim_start().starts_with('{') {
                format!("error converting YAML to JSON: {json_err}")
            } else {
                format!("error converting YAML to JSON: {yaml_err}")
            }
        }),
    }
}

fn unmarshal_err(e: String) -> String {
    format!("error unmarshaling JSON: {e}")
}

/// A random RFC 4122 version 4 UUID (crictl fills in a missing pod uid with one).
pub fn new_uuid() -> String {
    let mut b = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_ok();
    if !filled {
        let seed = crate::timefmt::now_ns() as u128 ^ ((std::process::id() as u128) << 64);
        b = seed.to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// crictl's `loadPodSandboxConfig`: metadata with name and namespace required, a missing
/// uid generated.
pub fn load_pod_config(path: &str) -> Result<PodSandboxConfig, String> {
    let v = read_value(path)?;
    let mut cfg: PodSandboxConfig =
        message_from_json("runtime.v1.PodSandboxConfig", v).map_err(unmarshal_err)?;
    let Some(md) = cfg.metadata.as_mut() else {
        return Err("metadata is not set".into());
    };
    if md.uid.is_empty() {
        md.uid = new_uuid();
    }
    if md.name.is_empty() || md.namespace.is_empty() {
        return Err(format!(
            "name or namespace is not in metadata \"name:{:?} uid:{:?} namespace:{:?}\"",
            md.name, md.uid, md.namespace
        ));
    }
    if cfg
        .linux
        .as_ref()
        .is_some_and(|l| l.cgroup_parent.is_empty())
    {
        eprintln!(
            "WARN[0000] cgroup_parent is not set. Use `runtime-config` to get the runtime cgroup driver"
        );
    }
    Ok(cfg)
}

/// crictl's `loadContainerConfig`: metadata.name and image.image required.
pub fn load_container_config(path: &str) -> Result<ContainerConfig, String> {
    let v = read_value(path)?;
    let cfg: ContainerConfig =
        message_from_json("runtime.v1.ContainerConfig", v).map_err(unmarshal_err)?;
    let Some(md) = cfg.metadata.as_ref() else {
        return Err("metadata is not set".into());
    };
    if md.name.is_empty() {
        return Err(format!(
            "name is not in metadata \"name:{:?} attempt:{}\"",
            md.name, md.attempt
        ));
    }
    let Some(image) = cfg.image.as_ref() else {
        return Err("image is not set".into());
    };
    if image.image.is_empty() {
        return Err("image field is not set in image \"\"".into());
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    fn tmpdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("nodus-crictl-cfg-{}", new_uuid()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn pod_config_in_json_and_yaml() {
        let d = tmpdir();
        let json = write(
            &d,
            "pod.json",
            r#"{"metadata": {"name": "web", "namespace": "default", "attempt": 1},
                "log_directory": "/tmp/web", "linux": {}}"#,
        );
        let cfg = load_pod_config(&json).unwrap();
        let md = cfg.metadata.unwrap();
        assert_eq!(md.name, "web");
        assert_eq!(md.uid.len(), 36, "uid generated: {}", md.uid);
        assert_eq!(cfg.log_directory, "/tmp/web");

        let yaml = write(
            &d,
            "pod.yaml",
            "metadata:\n  name: web\n  namespace: default\n  uid: u1\nlogDirectory: /tmp/web\n",
        );
        let cfg = load_pod_config(&yaml).unwrap();
        assert_eq!(cfg.metadata.unwrap().uid, "u1");
        assert_eq!(cfg.log_directory, "/tmp/web");

        let no_ns = write(&d, "bad.json", r#"{"metadata": {"name": "web"}}"#);
        let e = load_pod_config(&no_ns).unwrap_err();
        assert!(e.contains("name or namespace is not in metadata"), "{e}");
        let e = load_pod_config(&write(&d, "none.json", "{}")).unwrap_err();
        assert_eq!(e, "metadata is not set");
        let e = load_pod_config(&d.join("absent.json").display().to_string()).unwrap_err();
        assert!(e.contains("not found"), "{e}");
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn reads_block_and_flow_yaml() {
        let text = r#"
# a pod config
metadata:
  name: web   # the pod name
  namespace: "default"
  attempt: 1
  uid: 'it''s'
log_directory: /tmp/logs
labels: {app: web, tier: "front"}
port_mappings:
  - protocol: 0
    container_port: 80
    host_port: 8080
dns_config:
  servers: [8.8.8.8, "1.1.1.1"]
command:
- sh
- -c
- |
  echo hello
  sleep 1
args: []
linux:
  security_context:
    namespace_options:
      network: 2
folded: >
  a
  b
empty:
"#;
        assert_eq!(
            parse_config(text).unwrap(),
            serde_json::json!({
                "metadata": {"name": "web", "namespace": "default", "attempt": 1, "uid": "it's"},
                "log_directory": "/tmp/logs",
                "labels": {"app": "web", "tier": "front"},
                "port_mappings": [{"protocol": 0, "container_port": 80, "host_port": 8080}],
                "dns_config": {"servers": ["8.8.8.8", "1.1.1.1"]},
                "command": ["sh", "-c", "echo hello\nsleep 1\n"],
                "args": [],
                "linux": {"security_context": {"namespace_options": {"network": 2}}},
                "folded": "a b\n",
                "empty": null
            })
        );
        let json = r#"{"metadata": {"name": "x", "attempt": 2}, "list": [1, 2.5, true, null]}"#;
        assert_eq!(
            parse_config(json).unwrap(),
            serde_json::from_str::<Value>(json).unwrap()
        );
        for bad in ["a: [1, 2", "a: 1\n  b: 2", "a: \"open"] {
            let e = parse_config(bad).unwrap_err();
            assert!(e.starts_with("error converting YAML to JSON: "), "{e}");
        }
    }

    #[test]
    fn container_config_requires_name_and_image() {
        let d = tmpdir();
        let ok = write(
            &d,
            "c.json",
            r#"{"metadata": {"name": "main"}, "image": {"image": "busybox"},
                "command": ["sh", "-c", "echo hi"], "log_path": "main.log",
                "linux": {"resources": {"memory_limit_in_bytes": 16777216}}}"#,
        );
        let cfg = load_container_config(&ok).unwrap();
        assert_eq!(cfg.command, ["sh", "-c", "echo hi"]);
        assert_eq!(cfg.log_path, "main.log");
        assert_eq!(
            cfg.linux.unwrap().resources.unwrap().memory_limit_in_bytes,
            16 << 20
        );
        let no_image = write(&d, "n.json", r#"{"metadata": {"name": "main"}}"#);
        assert_eq!(
            load_container_config(&no_image).unwrap_err(),
            "image is not set"
        );
        let _ = std::fs::remove_dir_all(d);
    }
}
