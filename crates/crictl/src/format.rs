//! crictl's presentation rules: human sizes, truncated ids, aligned tables, protobuf JSON.

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::Value;
use std::sync::OnceLock;

/// go-units' `HumanSizeWithPrecision(size, 3)`: decimal units, three significant digits.
pub fn human_size(size: u64) -> String {
    const UNITS: [&str; 9] = ["B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    let mut v = size as f64;
    let mut i = 0;
    while v >= 1000.0 && i < UNITS.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    format!("{}{}", go_g3(v), UNITS[i])
}

/// Go's `%.3g` for the values human_size produces (0 ≤ v < 1000).
fn go_g3(v: f64) -> String {
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
    let decimals = 3 - digits_before;
    let rounded = format!("{v:.decimals$}");
    // Rounding can carry into a new digit (999.5 → "1000"): Go prints that as 1e+03.
    if rounded.split('.').next().map(str::len).unwrap_or(0) > 3 {
        return "1e+03".into();
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

/// crictl's status + verbose info layout: `{"status": …, "<key>": <parsed JSON value>…}`.
pub fn status_with_info(status: Value, info: &std::collections::HashMap<String, String>) -> Value {
    let mut obj = serde_json::Map::new();
    obj.insert("status".into(), status);
    let mut keys: Vec<_> = info.keys().collect();
    keys.sort();
    for k in keys {
        let v = &info[k];
        let parsed = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.clone()));
        obj.insert(k.clone(), parsed);
    }
    Value::Object(obj)
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
    fn ids_are_truncated_to_13() {
        assert_eq!(truncate_id("sha256:0123456789abcdef0123"), "0123456789abc");
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
