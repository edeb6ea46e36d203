//! JSON → protobuf: builds a message from an object's JSON form by its descriptor, the
//! reverse of `to_json` (used to answer clients that accept protobuf only).

use base64::Engine;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, Value as PbValue,
};
use serde_json::{Map, Value};

use super::to_json::join;
use super::{ProtobufError, schema, special};

pub(super) fn message(
    desc: &MessageDescriptor,
    json: &Value,
    path: &str,
) -> Result<DynamicMessage, ProtobufError> {
    if let Some(result) = special::from_json(desc, json, path) {
        return result;
    }
    let Value::Object(obj) = json else {
        return Err(ProtobufError::field(path, "expected an object"));
    };
    let mut msg = DynamicMessage::new(desc.clone());
    let inline: Vec<FieldDescriptor> = desc.fields().filter(schema::is_inline).collect();
    let mut embedded: Vec<Map<String, Value>> = vec![Map::new(); inline.len()];
    for (key, value) in obj {
        let field_path = join(path, key);
        if value.is_null() {
            // Go reads a JSON null as the zero value. Protobuf leaves zero values out, except
            // a zero Time, which Go writes as an empty message (and reads back as null).
            if let Some(field) = desc.get_field_by_name(key)
                && let Kind::Message(m) = field.kind()
                && special::is_time(&m)
                && !field.is_list()
            {
                msg.try_set_field(&field, PbValue::Message(DynamicMessage::new(m)))
                    .map_err(|e| ProtobufError::field(&field_path, e.to_string()))?;
            }
            continue;
        }
        if let Some(field) = desc
            .get_field_by_name(key)
            .filter(|f| !schema::is_inline(f))
        {
            let v = field_value(&field, value, &field_path)?;
            msg.try_set_field(&field, v)
                .map_err(|e| ProtobufError::field(&field_path, e.to_string()))?;
            continue;
        }
        let owner = inline.iter().position(|f| match f.kind() {
            Kind::Message(m) => m.get_field_by_name(key).is_some(),
            _ => false,
        });
        match owner {
            Some(i) => {
                embedded[i].insert(key.clone(), value.clone());
            }
            // List items and embedded objects may carry their type in JSON; protobuf has
            // it once, in the envelope.
            None if key == "apiVersion" || key == "kind" => {}
            None => return Err(ProtobufError::field(&field_path, "unknown field")),
        }
    }
    for (field, fields) in inline.iter().zip(embedded) {
        if fields.is_empty() {
            continue;
        }
        if let Kind::Message(m) = field.kind() {
            let inner = message(&m, &Value::Object(fields), path)?;
            msg.try_set_field(field, PbValue::Message(inner))
                .map_err(|e| ProtobufError::field(path, e.to_string()))?;
        }
    }
    Ok(msg)
}

fn field_value(
    field: &FieldDescriptor,
    json: &Value,
    path: &str,
) -> Result<PbValue, ProtobufError> {
    if field.is_map() {
        let Value::Object(obj) = json else {
            return Err(ProtobufError::field(path, "expected an object"));
        };
        let value_kind = match field.kind() {
            Kind::Message(entry) => entry.map_entry_value_field().kind(),
            other => other,
        };
        let mut map = std::collections::HashMap::new();
        for (k, v) in obj {
            let v = element(&value_kind, v, &format!("{path}[{k:?}]"))?;
            map.insert(MapKey::String(k.clone()), v);
        }
        return Ok(PbValue::Map(map));
    }
    if field.is_list() {
        let Value::Array(items) = json else {
            return Err(ProtobufError::field(path, "expected an array"));
        };
        let kind = field.kind();
        return items
            .iter()
            .enumerate()
            .map(|(i, v)| element(&kind, v, &format!("{path}[{i}]")))
            .collect::<Result<Vec<_>, _>>()
            .map(PbValue::List);
    }
    element(&field.kind(), json, path)
}

fn element(kind: &Kind, json: &Value, path: &str) -> Result<PbValue, ProtobufError> {
    let wrong = |what: &str| ProtobufError::field(path, format!("expected {what}, found {json}"));
    Ok(match kind {
        Kind::String => {
            PbValue::String(json.as_str().ok_or_else(|| wrong("a string"))?.to_string())
        }
        Kind::Bool => PbValue::Bool(json.as_bool().ok_or_else(|| wrong("a boolean"))?),
        Kind::Int32 => PbValue::I32(
            json.as_i64()
                .and_then(|i| i32::try_from(i).ok())
                .ok_or_else(|| wrong("a 32-bit integer"))?,
        ),
        Kind::Int64 => PbValue::I64(json.as_i64().ok_or_else(|| wrong("an integer"))?),
        Kind::Double => PbValue::F64(json.as_f64().ok_or_else(|| wrong("a number"))?),
        Kind::Bytes => {
            let s = json.as_str().ok_or_else(|| wrong("a base64 string"))?;
            let b = base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|e| ProtobufError::field(path, format!("invalid base64: {e}")))?;
            PbValue::Bytes(b.into())
        }
        Kind::Message(m) => PbValue::Message(message(m, json, path)?),
        other => {
            return Err(ProtobufError::field(
                path,
                format!("unsupported field type {other:?}"),
            ));
        }
    })
}
