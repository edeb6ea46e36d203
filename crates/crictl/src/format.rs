//! crictl's presentation rules: human sizes, truncated ids, aligned tables, protobuf JSON.

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::Value;
use std::sync::OnceLock;

/// go-units' `HumanSizeWithPrecision(size, 3)`: decimal units, three significant digits
/// (what `crictl images` prints).
pub fn human_size(size: u64) -> String {
    human_size_prec(size, 3)
}

/// go-units' `HumanSize`: four significant digits (what `crictl stats` prints).
pub fn human_size4(size: u64) -> String {
    human_size_prec(size, 4)
}

fn human_size_prec(size: u64, precision: usize) -> String {
    const UNITS: [&str; 9] = ["B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    let mut v = size as f64;
    let mut i = 0;
    while v >= 1000.0 && i < UNITS.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    format!("{}{}", go_g(v, precision), UNITS[i])
}

/// Go's `%.<p>g` for the values human sizes produce (0 ≤ v < 1000).
fn go_g(v: f64, p: usize) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits_before = if v >= 100.0 {
        3
    } else if v >= 10.0 {
        2
    } else {
        1
    };
    let decimals = p.saturating_sub(digits_before);
    let rounded = format!("{v:.decimals$}");
    // Rounding can carry into a digit more than the precision allows (999.5 with p=3 →
    // "1000"): Go switches to exponent form then.
    let int_digits = rounded.split('.').next().map(str::len).unwrap_or(0);
    if int_digits > p {
        let mantissa = rounded.trim_start_matches('0');
        let exp = int_digits - 1;
        let lead = &mantissa[..1];
        let rest = mantissa[1..].replace('.', "");
        let rest: String = rest.chars().take(p.saturating_sub(1)).collect();
        let rest = rest.trim_end_matches('0');
        let mant = if rest.is_empty() {
            lead.to_string()
        } else {
            format!("{lead}.{rest}")
        };
        return format!("{mant}e+{exp:02}");
    }
    if rounded.contains('.') {
        rounded
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        rounded
    }
}

/// crictl shows the first 13 characters of an id after its `sha256:` prefix.
pub fn truncate_id(id: &str) -> String {
    let id = id.strip_prefix("sha256:").unwrap_or(id);
    id.chars().take(13).collect()
}

/// crictl's `getTruncatedID(id, "")`: the first 13 characters of a container or pod id.
pub fn trunc13(id: &str) -> String {
    id.chars().take(13).collect()
}

/// `crictl ps`'s IMAGE column: an image reference that parses as a digest
/// (`sha256:<64 hex>`, as the kubelet passes image ids) is cut to 13 hex digits; a name
/// is shown whole.
pub fn truncate_image(image: &str) -> String {
    let Some((algo, hex)) = image.split_once(':') else {
        return image.to_string();
    };
    let len = match algo {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return image.to_string(),
    };
    if hex.len() == len
        && hex
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    {
        trunc13(hex)
    } else {
        image.to_string()
    }
}

/// Left-aligned columns as crictl's tabwriter lays them out (minwidth 20, padding 3): each
/// column is its widest cell plus 3 spaces, and at least 20 wide.
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; cols];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                let w = (widths[i] + 3).max(20);
                line.push_str(&format!("{c:<w$}"));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(cri::FILE_DESCRIPTOR_SET).unwrap_or_else(|e| {
            panic!("the CRI descriptor set compiled into nodus is invalid: {e}")
        })
    })
}

/// A CRI message as protobuf JSON (camelCase names, 64-bit integers as strings, defaults
/// included), which is what crictl prints.
pub fn proto_json<M: prost::Message>(full_name: &str, msg: &M) -> Value {
    let Some(desc) = pool().get_message_by_name(full_name) else {
        return Value::Null;
    };
    let Ok(dynamic) = DynamicMessage::decode(desc, msg.encode_to_vec().as_slice()) else {
        return Value::Null;
    };
    let opts = SerializeOptions::new().skip_default_fields(false);
    dynamic
        .serialize_with_options(serde_json::value::Serializer, &opts)
        .unwrap_or(Value::Null)
}

/// crictl's status + verbose info layout: `{"status": …, "<key>": …}` where an info value
/// that looks like a JSON object is parsed and anything else is kept as a string with its
/// surrounding double quotes trimmed.
pub fn status_with_info(status: Value, info: &std::collections::HashMap<String, String>) -> Value {
    let mut obj = serde_json::Map::new();
    obj.insert("status".into(), status);
    let mut keys: Vec<_> = info.keys().collect();
    keys.sort();
    for k in keys {
        let v = &info[k];
        let parsed = if v.starts_with('{') {
            serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.clone()))
        } else {
            Value::String(v.trim_matches('"').to_string())
        };
        obj.insert(k.clone(), parsed);
    }
    Value::Object(obj)
}

/// crictl prints one status object alone and several as a JSON array.
pub fn one_or_array(mut items: Vec<Value>) -> Value {
    if items.len() == 1 {
        items.pop().unwrap_or(Value::Null)
    } else {
        Value::Array(items)
    }
}

/// Go's `%v` of a `map[string]string`: `map[k1:v1 k2:v2]` with sorted keys.
pub fn go_map(m: &std::collections::HashMap<String, String>) -> String {
    let mut keys: Vec<_> = m.keys().collect();
    keys.sort();
    let parts: Vec<String> = keys.iter().map(|k| format!("{k}:{}", m[*k])).collect();
    format!("map[{}]", parts.join(" "))
}

/// `-o` values crictl's list commands accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

impl Output {
    /// Parses `-o`; `default` applies when the flag is absent or empty.
    pub fn parse(v: Option<&str>, default: Output) -> Result<Output, crate::CrictlError> {
        match v.unwrap_or("") {
            "" => Ok(default),
            "table" => Ok(Output::Table),
            "json" => Ok(Output::Json),
            "yaml" => Ok(Output::Yaml),
            "go-template" => Err(crate::CrictlError::Usage(
                "unsupported output format \"go-template\": nodus crictl prints json, yaml or table"
                    .into(),
            )),
            other => Err(crate::CrictlError::Usage(format!(
                "unsupported output format {other:?}"
            ))),
        }
    }
}

/// A CRI message in protobuf JSON the way crictl's `protojson` output looks: fields in
/// declaration order, map keys sorted, two-space indentation, defaults included.
pub fn proto_json_pretty<M: prost::Message>(full_name: &str, msg: &M) -> String {
    let v = proto_json(full_name, msg);
    let mut out = String::new();
    match pool().get_message_by_name(full_name) {
        Some(desc) => write_ordered(Some(&desc), &v, 0, &mut out),
        None => write_ordered(None, &v, 0, &mut out),
    }
    out
}

/// `v` as a YAML document, as crictl's `yaml.JSONToYAML` prints it: block style, keys
/// sorted (serde_json's map keeps them so), sequences not indented under their key.
pub fn to_yaml(v: &Value) -> String {
    // A JSON value has string keys only, so serializing it cannot fail.
    yaml_serde::to_string(v).unwrap_or_default()
}

/// A CRI message as YAML (`yaml.JSONToYAML` of its protobuf JSON).
pub fn proto_yaml<M: prost::Message>(full_name: &str, msg: &M) -> String {
    to_yaml(&proto_json(full_name, msg))
}

/// Writes `msg` as crictl's `-o json` (protobuf JSON + newline) or `-o yaml` (YAML + an
/// empty line, as Go's `fmt.Println` of the YAML text leaves).
pub fn write_message<M: prost::Message>(
    out: &mut (dyn std::io::Write + Send),
    output: Output,
    full_name: &str,
    msg: &M,
) -> std::io::Result<()> {
    match output {
        Output::Yaml => writeln!(out, "{}", proto_yaml(full_name, msg)),
        _ => writeln!(out, "{}", proto_json_pretty(full_name, msg)),
    }
}

/// Writes a plain JSON value as crictl's `outputStatusData` does: indented JSON, or YAML.
pub fn write_value(
    out: &mut (dyn std::io::Write + Send),
    output: Output,
    v: &Value,
) -> std::io::Result<()> {
    match output {
        Output::Yaml => writeln!(out, "{}", to_yaml(v)),
        _ => writeln!(out, "{}", pretty(v)),
    }
}

fn indent(out: &mut String, n: usize) {
    for _ in 0..n {
        out.push_str("  ");
    }
}

fn write_ordered(
    desc: Option<&prost_reflect::MessageDescriptor>,
    v: &Value,
    depth: usize,
    out: &mut String,
) {
    use prost_reflect::Kind;
    match v {
        Value::Object(map) if map.is_empty() => out.push_str("{}"),
        Value::Object(map) => {
            // Keys in field order for a message; sorted (the map's own order) otherwise.
            let mut entries: Vec<(
                &String,
                &Value,
                Option<prost_reflect::MessageDescriptor>,
                bool,
            )> = Vec::new();
            match desc {
                Some(d) => {
                    for f in d.fields() {
                        if let Some(val) = map.get(f.json_name()) {
                            let (sub, is_map) = match f.kind() {
                                Kind::Message(m) if f.is_map() => {
                                    let vk = m.map_entry_value_field().kind();
                                    (vk.as_message().cloned(), true)
                                }
                                Kind::Message(m) => (Some(m), false),
                                _ => (None, false),
                            };
                            let key = map.get_key_value(f.json_name()).map(|(k, _)| k);
                            if let Some(k) = key {
                                entries.push((k, val, sub, is_map));
                            }
                        }
                    }
                    // Anything the descriptor does not name (should not happen) goes last.
                    for (k, val) in map {
                        if !d.fields().any(|f| f.json_name() == k) {
                            entries.push((k, val, None, false));
                        }
                    }
                }
                None => {
                    for (k, val) in map {
                        entries.push((k, val, None, false));
                    }
                }
            }
            out.push_str("{\n");
            let n = entries.len();
            for (i, (k, val, sub, is_map)) in entries.into_iter().enumerate() {
                indent(out, depth + 1);
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                if is_map {
                    write_map_values(sub.as_ref(), val, depth + 1, out);
                } else {
                    write_ordered(sub.as_ref(), val, depth + 1, out);
                }
                if i + 1 < n {
                    out.push(',');
                }
                out.push('\n');
            }
            indent(out, depth);
            out.push('}');
        }
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Array(items) => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                indent(out, depth + 1);
                write_ordered(desc, item, depth + 1, out);
                if i + 1 < items.len() {
                    out.push(',');
                }
                out.push('\n');
            }
            indent(out, depth);
            out.push(']');
        }
        scalar => out.push_str(&serde_json::to_string(scalar).unwrap_or_default()),
    }
}

/// A map field: keys sorted, values messages of `value_desc` (if any).
fn write_map_values(
    value_desc: Option<&prost_reflect::MessageDescriptor>,
    v: &Value,
    depth: usize,
    out: &mut String,
) {
    let Value::Object(map) = v else {
        write_ordered(None, v, depth, out);
        return;
    };
    if map.is_empty() {
        out.push_str("{}");
        return;
    }
    out.push_str("{\n");
    let n = map.len();
    for (i, (k, val)) in map.iter().enumerate() {
        indent(out, depth + 1);
        out.push_str(&serde_json::to_string(k).unwrap_or_default());
        out.push_str(": ");
        write_ordered(value_desc, val, depth + 1, out);
        if i + 1 < n {
            out.push(',');
        }
        out.push('\n');
    }
    indent(out, depth);
    out.push('}');
}

/// Reads a CRI message from crictl's config-file JSON: protobuf JSON names (`logDirectory`)
/// or the Go struct names crictl's loader matches (`log_directory`), case-insensitively;
/// 64-bit integers as numbers or strings; enums as numbers or names; unknown keys ignored
/// (as Go's `encoding/json` does); scalars given for string fields taken as their text.
pub fn message_from_json<M: prost::Message + Default>(
    full_name: &str,
    v: Value,
) -> Result<M, String> {
    let desc = pool()
        .get_message_by_name(full_name)
        .ok_or_else(|| format!("unknown message {full_name}"))?;
    let normalized = normalize(&desc, v)?;
    let opts = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
    let dynamic = DynamicMessage::deserialize_with_options(desc, normalized, &opts)
        .map_err(|e| e.to_string())?;
    M::decode(prost::Message::encode_to_vec(&dynamic).as_slice()).map_err(|e| e.to_string())
}

fn normalize(desc: &prost_reflect::MessageDescriptor, v: Value) -> Result<Value, String> {
    use prost_reflect::Kind;
    let Value::Object(map) = v else {
        if v.is_null() {
            return Ok(Value::Object(Default::default()));
        }
        return Err(format!(
            "cannot unmarshal {} into a {}",
            json_type(&v),
            desc.name()
        ));
    };
    let mut out = serde_json::Map::new();
    for (k, val) in map {
        let Some(f) = desc
            .fields()
            .find(|f| f.name().eq_ignore_ascii_case(&k) || f.json_name().eq_ignore_ascii_case(&k))
        else {
            continue;
        };
        if val.is_null() {
            continue;
        }
        let scalar = |kind: &Kind, val: Value| -> Value {
            match (kind, val) {
                (Kind::String, Value::Number(n)) => Value::String(n.to_string()),
                (Kind::String, Value::Bool(b)) => Value::String(b.to_string()),
                (_, other) => other,
            }
        };
        let fixed = if f.is_map() {
            let Kind::Message(entry) = f.kind() else {
                continue;
            };
            let vk = entry.map_entry_value_field().kind();
            match val {
                Value::Object(m) => {
                    let mut nm = serde_json::Map::new();
                    for (mk, mv) in m {
                        let mv = match &vk {
                            Kind::Message(d) => normalize(d, mv)?,
                            other => scalar(other, mv),
                        };
                        nm.insert(mk, mv);
                    }
                    Value::Object(nm)
                }
                other => other,
            }
        } else if f.is_list() {
            match val {
                Value::Array(items) => Value::Array(
                    items
                        .into_iter()
                        .map(|i| match f.kind() {
                            Kind::Message(d) => normalize(&d, i),
                            other => Ok(scalar(&other, i)),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                other => other,
            }
        } else {
            match f.kind() {
                Kind::Message(d) => normalize(&d, val)?,
                other => scalar(&other, val),
            }
        };
        out.insert(f.name().to_string(), fixed);
    }
    Ok(Value::Object(out))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

pub fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// Go's names for gRPC codes, as grpc-go prints them.
pub fn code_name(c: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match c {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_is_laid_out_like_sigs_k8s_yaml() {
        let v = serde_json::json!({
            "containers": [
                {"id": "abc", "labels": {"app": "web"}, "createdAt": "1700000000000000000",
                 "annotations": {}, "metadata": {"name": "main", "attempt": 0},
                 "state": "CONTAINER_RUNNING", "image": {"image": "docker.io/library/busybox:latest"}}
            ],
            "empty": [],
            "msg": "a: b",
            "blank": "",
            "yes": "true",
            "hash": "x #y",
            "multi": "line1\nline2\n"
        });
        // sigs.k8s.io/yaml quotes with `"` where the crate uses `'`; the layout is the same.
        let want = "\
blank: ''
containers:
- annotations: {}
  createdAt: '1700000000000000000'
  id: abc
  image:
    image: docker.io/library/busybox:latest
  labels:
    app: web
  metadata:
    attempt: 0
    name: main
  state: CONTAINER_RUNNING
empty: []
hash: 'x #y'
msg: 'a: b'
multi: |
  line1
  line2
yes: 'true'
";
        assert_eq!(to_yaml(&v), want);
        // What it prints reads back.
        let back: Value = yaml_serde::from_str(&to_yaml(&v)).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn sizes_match_go_units() {
        assert_eq!(human_size(0), "0B");
        assert_eq!(human_size(999), "999B");
        assert_eq!(human_size(1000), "1kB");
        assert_eq!(human_size(4_261_550), "4.26MB");
        assert_eq!(human_size(123_456_789), "123MB");
        assert_eq!(human_size(12_345_678), "12.3MB");
        assert_eq!(human_size(1_500_000_000), "1.5GB");
    }

    #[test]
    fn stats_sizes_use_four_digits() {
        assert_eq!(human_size4(0), "0B");
        assert_eq!(human_size4(4_261_550), "4.262MB");
        assert_eq!(human_size4(123_456_789), "123.5MB");
        assert_eq!(human_size4(999_999), "1000kB");
        assert_eq!(human_size(999_600), "1e+03kB");
        assert_eq!(human_size4(1_000_000), "1MB");
        assert_eq!(human_size4(1536), "1.536kB");
    }

    #[test]
    fn ids_are_truncated_to_13() {
        assert_eq!(truncate_id("sha256:0123456789abcdef0123"), "0123456789abc");
        assert_eq!(trunc13("0123456789abcdef0123"), "0123456789abc");
        assert_eq!(trunc13("short"), "short");
        let digest = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(truncate_image(&digest), "abababababab".to_string() + "a");
        assert_eq!(
            truncate_image("docker.io/library/busybox:latest"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(truncate_image("sha256:abc"), "sha256:abc");
    }

    #[test]
    fn tables_pad_to_20_or_width_plus_3() {
        let rows = vec![
            vec!["POD ID".to_string(), "CREATED".into(), "NAME".into()],
            vec![
                "0123456789abc".to_string(),
                "About a minute ago".into(),
                "web".into(),
            ],
        ];
        assert_eq!(
            table(&rows),
            "POD ID              CREATED              NAME\n\
             0123456789abc       About a minute ago   web\n"
        );
    }

    #[test]
    fn ordered_json_follows_field_order_and_sorts_maps() {
        let c = cri::runtime::v1::Container {
            id: "c1".into(),
            pod_sandbox_id: "p1".into(),
            labels: [("b", "2"), ("a", "1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created_at: 5,
            ..Default::default()
        };
        let s = proto_json_pretty("runtime.v1.Container", &c);
        let id = s.find("\"id\"").unwrap();
        let pod = s.find("\"podSandboxId\"").unwrap();
        let state = s.find("\"state\"").unwrap();
        let created = s.find("\"createdAt\"").unwrap();
        assert!(id < pod && pod < state && state < created, "{s}");
        // Unset messages are left out, as protojson's EmitDefaultValues does.
        assert!(!s.contains("\"metadata\""), "{s}");
        assert!(s.find("\"a\": \"1\"").unwrap() < s.find("\"b\": \"2\"").unwrap());
        assert!(s.contains("\"createdAt\": \"5\""), "{s}");
        let back: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(back, proto_json("runtime.v1.Container", &c));
    }

    #[test]
    fn config_json_accepts_go_and_protobuf_names() {
        let v = serde_json::json!({
            "metadata": {"name": "web", "Namespace": "default", "attempt": 1},
            "log_directory": "/tmp/a",
            "linux": {"cgroupParent": "/x", "security_context": {"namespace_options": {"network": 2}}},
            "port_mappings": [{"protocol": "UDP", "container_port": 53, "host_port": "5353"}],
            "labels": {"app": "web"},
            "unknown_field": true,
            "hostname": null
        });
        let cfg: cri::runtime::v1::PodSandboxConfig =
            message_from_json("runtime.v1.PodSandboxConfig", v).unwrap();
        let md = cfg.metadata.unwrap();
        assert_eq!(
            (md.name.as_str(), md.namespace.as_str(), md.attempt),
            ("web", "default", 1)
        );
        assert_eq!(cfg.log_directory, "/tmp/a");
        let linux = cfg.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/x");
        assert_eq!(
            linux
                .security_context
                .unwrap()
                .namespace_options
                .unwrap()
                .network,
            2
        );
        assert_eq!(cfg.port_mappings[0].protocol, 1);
        assert_eq!(cfg.port_mappings[0].host_port, 5353);
        assert_eq!(cfg.labels["app"], "web");
        let bad = message_from_json::<cri::runtime::v1::PodSandboxConfig>(
            "runtime.v1.PodSandboxConfig",
            serde_json::json!({"metadata": {"attempt": "x"}}),
        );
        assert!(bad.is_err());
    }

    #[test]
    fn info_values_follow_crictl() {
        let info = std::collections::HashMap::from([
            ("info".to_string(), "{\"pid\": 42}".to_string()),
            ("quoted".to_string(), "\"x\"".to_string()),
            ("list".to_string(), "[1]".to_string()),
        ]);
        let v = status_with_info(Value::Null, &info);
        assert_eq!(v["info"]["pid"], 42);
        assert_eq!(v["quoted"], "x");
        assert_eq!(v["list"], "[1]");
        assert_eq!(
            go_map(&info),
            "map[info:{\"pid\": 42} list:[1] quoted:\"x\"]"
        );
    }

    #[test]
    fn proto_json_uses_camel_case_and_string_int64() {
        let img = cri::runtime::v1::Image {
            id: "sha256:ab".into(),
            size: 42,
            repo_tags: vec!["docker.io/library/busybox:latest".into()],
            ..Default::default()
        };
        let v = proto_json("runtime.v1.Image", &img);
        assert_eq!(v["size"], Value::String("42".into()));
        assert_eq!(v["repoTags"][0], "docker.io/library/busybox:latest");
        assert_eq!(v["pinned"], Value::Bool(false));
    }
}
