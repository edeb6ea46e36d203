//! The Kubernetes protobuf wire format (`application/vnd.kubernetes.protobuf`) for the
//! built-in types, transcoded to and from the JSON form the rest of the API server works on.
//!
//! client-go's typed clients (kubectl `create configmap|deployment|namespace|secret|…`,
//! `drain`'s evictions, controllers, leader election) send bodies of built-in kinds in this
//! encoding whatever discovery says, and offer `Accept: application/vnd.kubernetes.protobuf,
//! application/json`. A body is the 4-byte magic `k8s\0` followed by a `runtime.Unknown`
//! message whose `typeMeta` names the kind and whose `raw` is the object's own message.
//!
//! The transcoder is driven by the upstream message schemas (proto/k8s, compiled into a
//! descriptor set at build time) and reproduces what Go's JSON encoding of the same object
//! would give: upstream field names, `omitempty` semantics, and the hand-written JSON forms
//! of Quantity, IntOrString, Time, MicroTime, Duration, RawExtension and FieldsV1.

mod from_json;
mod hints;
mod http;
mod pointers;
mod schema;
mod special;
mod to_json;

#[cfg(test)]
mod tests;

pub use http::{negotiate_response, request_to_json};
use prost::Message;
use prost_reflect::{DynamicMessage, Value as PbValue};
use serde_json::Value;

/// The media type of Kubernetes protobuf bodies.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// What precedes every protobuf-encoded object: lets a reader tell it from JSON or YAML.
const MAGIC: &[u8; 4] = b"k8s\0";

const UNKNOWN: &str = "k8s.io.apimachinery.pkg.runtime.Unknown";

/// Why a protobuf body could not be transcoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    #[error(
        "the body is not a Kubernetes protobuf object: it must start with the 4-byte prefix \"k8s\\0\""
    )]
    BadMagic,
    #[error("malformed protobuf envelope (runtime.Unknown): {0}")]
    Envelope(String),
    #[error("the protobuf envelope names no {0}")]
    MissingTypeMeta(&'static str),
    #[error("unsupported contentEncoding {0:?} in the protobuf envelope")]
    ContentEncoding(String),
    #[error("no kind {kind:?} is registered for version {api_version:?} in the protobuf schemas")]
    UnknownKind { api_version: String, kind: String },
    #[error("malformed {kind} protobuf body: {detail}")]
    Malformed { kind: String, detail: String },
    #[error("{path}: {detail}")]
    Field { path: String, detail: String },
}

impl ProtobufError {
    fn field(path: &str, detail: impl Into<String>) -> Self {
        ProtobufError::Field {
            path: path.to_string(),
            detail: detail.into(),
        }
    }
}

/// Whether a Content-Type header value is the Kubernetes protobuf media type (parameters
/// such as `charset` are ignored, the type is case-insensitive).
pub fn is_protobuf(content_type: &str) -> bool {
    media_type(content_type).eq_ignore_ascii_case(PROTOBUF)
}

/// Whether a response must be protobuf: the client accepts it and accepts no JSON.
/// client-go always offers `application/json` beside protobuf, so kubectl and the typed
/// clients get JSON (which they decode by the response's Content-Type); only a client that
/// asks for protobuf alone gets it.
pub fn requires_protobuf(accept: &str) -> bool {
    let mut protobuf = false;
    for range in accept.split(',') {
        let (mt, q_zero) = media_range(range);
        if q_zero {
            continue;
        }
        if mt.eq_ignore_ascii_case(PROTOBUF) {
            protobuf = true;
        } else if mt.eq_ignore_ascii_case("application/json")
            || mt == "*/*"
            || mt.eq_ignore_ascii_case("application/*")
        {
            return false;
        }
    }
    protobuf
}

fn media_type(value: &str) -> &str {
    value.split(';').next().unwrap_or("").trim()
}

/// A media range and whether its `q` parameter rules it out.
fn media_range(range: &str) -> (&str, bool) {
    let mut parts = range.split(';');
    let mt = parts.next().unwrap_or("").trim();
    let q_zero = parts.any(|p| {
        let p = p.trim();
        p.strip_prefix("q=")
            .and_then(|q| q.trim().parse::<f32>().ok())
            .is_some_and(|q| q <= 0.0)
    });
    (mt, q_zero)
}

/// Decodes a protobuf request body into the object's JSON form, with `apiVersion` and
/// `kind` taken from the envelope.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let rest = body.strip_prefix(MAGIC).ok_or(ProtobufError::BadMagic)?;
    let envelope = schema::message(UNKNOWN)?;
    let unknown = DynamicMessage::decode(envelope, rest)
        .map_err(|e| ProtobufError::Envelope(e.to_string()))?;
    let type_meta = match unknown.get_field_by_name("typeMeta").as_deref() {
        Some(PbValue::Message(m)) => m.clone(),
        _ => return Err(ProtobufError::MissingTypeMeta("apiVersion/kind")),
    };
    let api_version = string_field(&type_meta, "apiVersion");
    let kind = string_field(&type_meta, "kind");
    if api_version.is_empty() {
        return Err(ProtobufError::MissingTypeMeta("apiVersion"));
    }
    if kind.is_empty() {
        return Err(ProtobufError::MissingTypeMeta("kind"));
    }
    let encoding = string_field(&unknown, "contentEncoding");
    if !encoding.is_empty() {
        return Err(ProtobufError::ContentEncoding(encoding));
    }
    let raw = match unknown.get_field_by_name("raw").as_deref() {
        Some(PbValue::Bytes(b)) => b.clone(),
        _ => Default::default(),
    };
    let desc = schema::kind(&api_version, &kind)?;
    let object = DynamicMessage::decode(desc, raw).map_err(|e| ProtobufError::Malformed {
        kind: kind.clone(),
        detail: e.to_string(),
    })?;
    let mut json = serde_json::Map::new();
    json.insert("kind".into(), Value::String(kind));
    json.insert("apiVersion".into(), Value::String(api_version));
    to_json::message_into(&object, "", &mut json)?;
    Ok(Value::Object(json))
}

/// Encodes an object (JSON form, `apiVersion` and `kind` set) as a protobuf body.
pub fn encode(obj: &Value) -> Result<Vec<u8>, ProtobufError> {
    let map = obj
        .as_object()
        .ok_or_else(|| ProtobufError::field("", "the object is not a JSON object"))?;
    let text = |key: &'static str| {
        map.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ProtobufError::field(key, "required to encode an object as protobuf"))
    };
    let api_version = text("apiVersion")?;
    let kind = text("kind")?;
    let desc = schema::kind(api_version, kind)?;
    let mut fields = map.clone();
    fields.remove("apiVersion");
    fields.remove("kind");
    let object = from_json::message(&desc, &Value::Object(fields), "")?;

    let envelope = schema::message(UNKNOWN)?;
    let mut unknown = DynamicMessage::new(envelope.clone());
    let type_meta_field = envelope
        .get_field_by_name("typeMeta")
        .ok_or_else(|| ProtobufError::field("", "runtime.Unknown has no typeMeta"))?;
    let mut type_meta =
        DynamicMessage::new(schema::message("k8s.io.apimachinery.pkg.runtime.TypeMeta")?);
    set(
        &mut type_meta,
        "apiVersion",
        PbValue::String(api_version.into()),
    )?;
    set(&mut type_meta, "kind", PbValue::String(kind.into()))?;
    unknown.set_field(&type_meta_field, PbValue::Message(type_meta));
    set(
        &mut unknown,
        "raw",
        PbValue::Bytes(object.encode_to_vec().into()),
    )?;
    // Go writes both strings even when empty; readers do not care, but matching upstream's
    // bytes keeps captured fixtures and our output comparable.
    set(
        &mut unknown,
        "contentEncoding",
        PbValue::String(String::new()),
    )?;
    set(&mut unknown, "contentType", PbValue::String(String::new()))?;

    let mut out = MAGIC.to_vec();
    out.extend(unknown.encode_to_vec());
    Ok(out)
}

fn string_field(msg: &DynamicMessage, name: &str) -> String {
    match msg.get_field_by_name(name).as_deref() {
        Some(PbValue::String(s)) => s.clone(),
        _ => String::new(),
    }
}

fn set(msg: &mut DynamicMessage, name: &str, value: PbValue) -> Result<(), ProtobufError> {
    msg.try_set_field_by_name(name, value)
        .map_err(|e| ProtobufError::field(name, e.to_string()))
}
