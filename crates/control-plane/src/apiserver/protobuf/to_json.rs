//! Protobuf → JSON: walks a decoded message by its descriptor and builds the JSON that Go's
//! encoding of the same object would produce.

use base64::Engine;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage,
    Value as PbValue,
};
use serde_json::{Map, Value};

use super::{ProtobufError, schema, special};

/// Adds the JSON fields of `msg` to `out` (an embedded struct's fields land in its parent).
pub(super) fn message_into(
    msg: &DynamicMessage,
    path: &str,
    out: &mut Map<String, Value>,
) -> Result<(), ProtobufError> {
    for field in declared_fields(&msg.descriptor()) {
        if !msg.has_field(&field) {
            continue;
        }
        let value = msg.get_field(&field);
        if schema::is_inline(&field) {
            if let PbValue::Message(inner) = value.as_ref() {
                message_into(inner, path, out)?;
            }
            continue;
        }
        let field_path = join(path, field.name());
        if let Some(json) = field_value(&field, &value, &field_path)? {
            out.insert(field.name().to_string(), json);
        }
    }
    Ok(())
}

/// The fields in the order the schema declares them, which is the Go struct's order and so
/// the order of upstream's JSON.
pub(super) fn declared_fields(desc: &MessageDescriptor) -> Vec<FieldDescriptor> {
    desc.descriptor_proto()
        .field
        .iter()
        .filter_map(|f| u32::try_from(f.number()).ok())
        .filter_map(|n| desc.get_field(n))
        .collect()
}

fn field_value(
    field: &FieldDescriptor,
    value: &PbValue,
    path: &str,
) -> Result<Option<Value>, ProtobufError> {
    match value {
        PbValue::List(items) => {
            if items.is_empty() {
                return Ok(None);
            }
            let kind = field.kind();
            let items = items
                .iter()
                .enumerate()
                .map(|(i, item)| element(&kind, item, &format!("{path}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(Value::Array(items)))
        }
        PbValue::Map(entries) => {
            if entries.is_empty() {
                return Ok(None);
            }
            let value_kind = match field.kind() {
                Kind::Message(entry) => entry.map_entry_value_field().kind(),
                other => other,
            };
            // Go's encoder sorts map keys; a BTreeMap-ordered walk gives the same order.
            let mut sorted: Vec<_> = entries.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            let mut out = Map::new();
            for (key, v) in sorted {
                let MapKey::String(key) = key else {
                    return Err(ProtobufError::field(path, "map keys must be strings"));
                };
                let json = element(&value_kind, v, &format!("{path}[{key:?}]"))?;
                out.insert(key.clone(), json);
            }
            Ok(Some(Value::Object(out)))
        }
        PbValue::Message(m) => message_value(m, path).map(Some),
        scalar => {
            if is_zero(scalar) && !schema::keeps_zero(field) {
                return Ok(None);
            }
            element(&field.kind(), scalar, path).map(Some)
        }
    }
}

fn element(kind: &Kind, value: &PbValue, path: &str) -> Result<Value, ProtobufError> {
    Ok(match value {
        PbValue::Bool(b) => Value::Bool(*b),
        PbValue::I32(i) => Value::from(*i),
        PbValue::I64(i) => Value::from(*i),
        PbValue::U32(i) => Value::from(*i),
        PbValue::U64(i) => Value::from(*i),
        PbValue::F32(f) => float(f64::from(*f), path)?,
        PbValue::F64(f) => float(*f, path)?,
        PbValue::String(s) => Value::String(s.clone()),
        PbValue::Bytes(b) => Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
        PbValue::Message(m) => message_value(m, path)?,
        PbValue::EnumNumber(_) | PbValue::List(_) | PbValue::Map(_) => {
            return Err(ProtobufError::field(
                path,
                format!("unexpected value for a {kind:?} field"),
            ));
        }
    })
}

fn float(f: f64, path: &str) -> Result<Value, ProtobufError> {
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .ok_or_else(|| ProtobufError::field(path, format!("{f} has no JSON form")))
}

fn message_value(msg: &DynamicMessage, path: &str) -> Result<Value, ProtobufError> {
    if let Some(v) = special::to_json(msg, path)? {
        return Ok(v);
    }
    let mut out = Map::new();
    message_into(msg, path, &mut out)?;
    Ok(Value::Object(out))
}

fn is_zero(value: &PbValue) -> bool {
    match value {
        PbValue::Bool(b) => !b,
        PbValue::I32(i) => *i == 0,
        PbValue::I64(i) => *i == 0,
        PbValue::U32(i) => *i == 0,
        PbValue::U64(i) => *i == 0,
        PbValue::F32(f) => *f == 0.0,
        PbValue::F64(f) => *f == 0.0,
        PbValue::String(s) => s.is_empty(),
        PbValue::Bytes(b) => b.is_empty(),
        _ => false,
    }
}

pub(super) fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}
