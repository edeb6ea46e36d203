//! The types whose JSON form is hand-written upstream rather than derived from their fields:
//! Quantity (its canonical string), IntOrString (a bare int or string), Time and MicroTime
//! (RFC 3339 strings in UTC, `null` when zero), RawExtension (the embedded object itself)
//! and FieldsV1 (the managed-fields JSON document).

use base64::Engine;
use k8s_openapi::jiff::Timestamp;
use prost_reflect::{DynamicMessage, MessageDescriptor, ReflectMessage, Value as PbValue};
use serde_json::Value;

use super::ProtobufError;

const QUANTITY: &str = "k8s.io.apimachinery.pkg.api.resource.Quantity";
const QUANTITY_VALUE: &str = "k8s.io.apimachinery.pkg.api.resource.QuantityValue";
const INT_OR_STRING: &str = "k8s.io.apimachinery.pkg.util.intstr.IntOrString";
const TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime";
const FIELDS_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1";
const RAW_EXTENSION: &str = "k8s.io.apimachinery.pkg.runtime.RawExtension";

/// IntOrString's `type`: 0 is an int, 1 a string.
const INT_OR_STRING_STRING: i64 = 1;

/// Whether a message is Time or MicroTime.
pub(super) fn is_time(desc: &MessageDescriptor) -> bool {
    matches!(desc.full_name(), TIME | MICRO_TIME)
}

/// The JSON of a special message, or None when `msg` is an ordinary one.
pub(super) fn to_json(msg: &DynamicMessage, path: &str) -> Result<Option<Value>, ProtobufError> {
    let value = match msg.descriptor().full_name() {
        QUANTITY | QUANTITY_VALUE => {
            let s = string(msg, "string");
            // An unset Quantity is zero, which upstream prints as "0".
            Value::String(if s.is_empty() { "0".into() } else { s })
        }
        INT_OR_STRING => {
            if int(msg, "type") == INT_OR_STRING_STRING {
                Value::String(string(msg, "strVal"))
            } else {
                Value::from(int(msg, "intVal"))
            }
        }
        TIME | MICRO_TIME => time_to_json(msg, path)?,
        FIELDS_V1 => json_bytes(&bytes(msg, "Raw"), path)?,
        RAW_EXTENSION => {
            let raw = bytes(msg, "raw");
            if raw.starts_with(super::MAGIC) {
                super::decode(&raw).map_err(|e| ProtobufError::field(path, e.to_string()))?
            } else {
                json_bytes(&raw, path)?
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(value))
}

/// A special message built from its JSON, or None when `desc` is an ordinary message.
pub(super) fn from_json(
    desc: &MessageDescriptor,
    json: &Value,
    path: &str,
) -> Option<Result<DynamicMessage, ProtobufError>> {
    let name = desc.full_name();
    if ![
        QUANTITY,
        QUANTITY_VALUE,
        INT_OR_STRING,
        TIME,
        MICRO_TIME,
        FIELDS_V1,
        RAW_EXTENSION,
    ]
    .contains(&name)
    {
        return None;
    }
    let mut msg = DynamicMessage::new(desc.clone());
    let result = fill(&mut msg, name, json, path).map(|()| msg);
    Some(result)
}

fn fill(
    msg: &mut DynamicMessage,
    name: &str,
    json: &Value,
    path: &str,
) -> Result<(), ProtobufError> {
    match name {
        QUANTITY | QUANTITY_VALUE => {
            // JSON allows a bare number (`cpu: 1`); upstream parses it as that quantity.
            let s = match json {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => {
                    return Err(ProtobufError::field(
                        path,
                        "a quantity must be a string or a number",
                    ));
                }
            };
            set(msg, "string", PbValue::String(s), path)
        }
        INT_OR_STRING => match json {
            Value::String(s) => {
                set(msg, "type", PbValue::I64(INT_OR_STRING_STRING), path)?;
                set(msg, "strVal", PbValue::String(s.clone()), path)
            }
            Value::Number(n) => {
                let i = n
                    .as_i64()
                    .and_then(|i| i32::try_from(i).ok())
                    .ok_or_else(|| {
                        ProtobufError::field(path, format!("{n} is not a 32-bit integer"))
                    })?;
                set(msg, "type", PbValue::I64(0), path)?;
                set(msg, "intVal", PbValue::I32(i), path)
            }
            _ => Err(ProtobufError::field(path, "must be an integer or a string")),
        },
        TIME | MICRO_TIME => {
            let s = json
                .as_str()
                .ok_or_else(|| ProtobufError::field(path, "a time must be an RFC 3339 string"))?;
            let ts: Timestamp = s
                .parse()
                .map_err(|e| ProtobufError::field(path, format!("invalid time {s:?}: {e}")))?;
            set(msg, "seconds", PbValue::I64(ts.as_second()), path)?;
            let nanos = if name == MICRO_TIME {
                ts.subsec_nanosecond() / 1000 * 1000
            } else {
                0
            };
            set(msg, "nanos", PbValue::I32(nanos), path)
        }
        FIELDS_V1 | RAW_EXTENSION => {
            let raw =
                serde_json::to_vec(json).map_err(|e| ProtobufError::field(path, e.to_string()))?;
            let field = if name == FIELDS_V1 { "Raw" } else { "raw" };
            set(msg, field, PbValue::Bytes(raw.into()), path)
        }
        _ => Ok(()),
    }
}

fn time_to_json(msg: &DynamicMessage, path: &str) -> Result<Value, ProtobufError> {
    // Go writes a zero time as an empty message, which reads back as the zero time, whose
    // JSON is null.
    if msg.fields().next().is_none() {
        return Ok(Value::Null);
    }
    let micro = msg.descriptor().full_name() == MICRO_TIME;
    // Time keeps whole seconds (upstream drops the nanos on read: JSON only carries
    // seconds); MicroTime keeps microseconds.
    let nanos = if micro {
        int(msg, "nanos") / 1000 * 1000
    } else {
        0
    };
    let nanos = i32::try_from(nanos)
        .map_err(|_| ProtobufError::field(path, format!("nanos {nanos} out of range")))?;
    let ts = Timestamp::new(int(msg, "seconds"), nanos)
        .map_err(|e| ProtobufError::field(path, format!("invalid time: {e}")))?;
    Ok(Value::String(if micro {
        format!("{ts:.6}")
    } else {
        format!("{ts:.0}")
    }))
}

fn json_bytes(raw: &[u8], path: &str) -> Result<Value, ProtobufError> {
    if raw.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(raw).map_err(|e| {
        let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
        ProtobufError::field(
            path,
            format!("embedded object is neither JSON nor protobuf ({e}); raw: {b64}"),
        )
    })
}

fn string(msg: &DynamicMessage, name: &str) -> String {
    match msg.get_field_by_name(name).as_deref() {
        Some(PbValue::String(s)) => s.clone(),
        _ => String::new(),
    }
}

fn int(msg: &DynamicMessage, name: &str) -> i64 {
    match msg.get_field_by_name(name).as_deref() {
        Some(PbValue::I64(i)) => *i,
        Some(PbValue::I32(i)) => i64::from(*i),
        _ => 0,
    }
}

fn bytes(msg: &DynamicMessage, name: &str) -> Vec<u8> {
    match msg.get_field_by_name(name).as_deref() {
        Some(PbValue::Bytes(b)) => b.to_vec(),
        _ => Vec::new(),
    }
}

fn set(
    msg: &mut DynamicMessage,
    name: &str,
    value: PbValue,
    path: &str,
) -> Result<(), ProtobufError> {
    msg.try_set_field_by_name(name, value)
        .map_err(|e| ProtobufError::field(path, e.to_string()))
}
