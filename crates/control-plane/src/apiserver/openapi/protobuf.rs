//! The Swagger 2.0 document in gnostic's `openapi.v2.Document` protobuf encoding, the only
//! form client-go's `OpenAPISchema()` asks for. kubectl falls back to it for client-side
//! schema validation (`kubectl apply -f` of a `kind: List` file with `--validate=strict`)
//! and for `explain --output=plaintext-openapiv2`.
//!
//! Field numbers follow gnostic's `openapiv2/OpenAPIv2.proto`; vendor extensions, defaults,
//! examples and enums travel as `Any{yaml}` (JSON is valid YAML), as gnostic writes them.

use serde_json::{Map, Value};

/// A protobuf message under construction (proto3: default values are omitted).
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint((u64::from(field) << 3) | u64::from(wire));
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn string(&mut self, field: u32, s: &str) {
        if !s.is_empty() {
            self.bytes(field, s.as_bytes());
        }
    }

    /// A repeated string field: every element is written, empty ones included.
    fn strings<'a>(&mut self, field: u32, items: impl IntoIterator<Item = &'a str>) {
        for s in items {
            self.bytes(field, s.as_bytes());
        }
    }

    fn message(&mut self, field: u32, m: Msg) {
        self.bytes(field, &m.0);
    }

    fn boolean(&mut self, field: u32, b: bool) {
        if b {
            self.key(field, 0);
            self.varint(1);
        }
    }

    fn int64(&mut self, field: u32, v: i64) {
        if v != 0 {
            self.key(field, 0);
            // Negative int64 values are ten-byte two's-complement varints in protobuf.
            self.varint(v as u64);
        }
    }

    fn double(&mut self, field: u32, v: f64) {
        if v != 0.0 {
            self.key(field, 1);
            self.0.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn str_of<'a>(m: &'a Map<String, Value>, k: &str) -> &'a str {
    m.get(k).and_then(Value::as_str).unwrap_or("")
}

fn bool_of(m: &Map<String, Value>, k: &str) -> bool {
    m.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn int_of(m: &Map<String, Value>, k: &str) -> i64 {
    m.get(k).and_then(Value::as_i64).unwrap_or(0)
}

fn num_of(m: &Map<String, Value>, k: &str) -> f64 {
    m.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

/// `Any { yaml = 2 }`.
fn any(v: &Value) -> Msg {
    let mut m = Msg::default();
    m.string(2, &v.to_string());
    m
}

/// `NamedAny { name = 1, value = 2 }` for every `x-` key of `m`.
fn vendor_extensions(out: &mut Msg, field: u32, m: &Map<String, Value>) {
    for (k, v) in m.iter().filter(|(k, _)| k.starts_with("x-")) {
        let mut named = Msg::default();
        named.string(1, k);
        named.message(2, any(v));
        out.message(field, named);
    }
}

/// `openapi.v2.Schema`.
fn schema(v: &Value) -> Msg {
    let mut out = Msg::default();
    let Value::Object(m) = v else {
        return out;
    };
    out.string(1, str_of(m, "$ref"));
    out.string(2, str_of(m, "format"));
    out.string(3, str_of(m, "title"));
    out.string(4, str_of(m, "description"));
    if let Some(d) = m.get("default") {
        out.message(5, any(d));
    }
    out.double(6, num_of(m, "multipleOf"));
    out.double(7, num_of(m, "maximum"));
    out.boolean(8, bool_of(m, "exclusiveMaximum"));
    out.double(9, num_of(m, "minimum"));
    out.boolean(10, bool_of(m, "exclusiveMinimum"));
    out.int64(11, int_of(m, "maxLength"));
    out.int64(12, int_of(m, "minLength"));
    out.string(13, str_of(m, "pattern"));
    out.int64(14, int_of(m, "maxItems"));
    out.int64(15, int_of(m, "minItems"));
    out.boolean(16, bool_of(m, "uniqueItems"));
    out.int64(17, int_of(m, "maxProperties"));
    out.int64(18, int_of(m, "minProperties"));
    if let Some(Value::Array(req)) = m.get("required") {
        out.strings(19, req.iter().filter_map(Value::as_str));
    }
    if let Some(Value::Array(e)) = m.get("enum") {
        for item in e {
            out.message(20, any(item));
        }
    }
    match m.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut item = Msg::default();
            // A oneof member is written even when false: its presence is the information.
            item.key(2, 0);
            item.varint(u64::from(*b));
            out.message(21, item);
        }
        Some(s @ Value::Object(_)) => {
            let mut item = Msg::default();
            item.message(1, schema(s));
            out.message(21, item);
        }
        _ => {}
    }
    match m.get("type") {
        Some(Value::String(t)) => {
            let mut item = Msg::default();
            item.strings(1, [t.as_str()]);
            out.message(22, item);
        }
        Some(Value::Array(ts)) => {
            let mut item = Msg::default();
            item.strings(1, ts.iter().filter_map(Value::as_str));
            out.message(22, item);
        }
        _ => {}
    }
    match m.get("items") {
        Some(s @ Value::Object(_)) => {
            let mut item = Msg::default();
            item.message(1, schema(s));
            out.message(23, item);
        }
        Some(Value::Array(list)) => {
            let mut item = Msg::default();
            for s in list {
                item.message(1, schema(s));
            }
            out.message(23, item);
        }
        _ => {}
    }
    if let Some(Value::Array(all)) = m.get("allOf") {
        for s in all {
            out.message(24, schema(s));
        }
    }
    if let Some(Value::Object(props)) = m.get("properties") {
        let mut p = Msg::default();
        for (name, s) in props {
            let mut named = Msg::default();
            named.string(1, name);
            named.message(2, schema(s));
            p.message(1, named);
        }
        out.message(25, p);
    }
    out.string(26, str_of(m, "discriminator"));
    out.boolean(27, bool_of(m, "readOnly"));
    if let Some(e) = m.get("example") {
        out.message(30, any(e));
    }
    vendor_extensions(&mut out, 31, m);
    out
}

/// `openapi.v2.ParametersItem` holding a body or non-body (query/path/header) parameter.
fn parameter(v: &Value) -> Msg {
    let mut param = Msg::default();
    let Value::Object(m) = v else {
        return param;
    };
    let location = str_of(m, "in");
    if location == "body" {
        let mut body = Msg::default();
        body.string(1, str_of(m, "description"));
        body.string(2, str_of(m, "name"));
        body.string(3, location);
        body.boolean(4, bool_of(m, "required"));
        if let Some(s) = m.get("schema") {
            body.message(5, schema(s));
        }
        vendor_extensions(&mut body, 6, m);
        param.message(1, body);
    } else {
        // Query and form-data sub-schemas carry allowEmptyValue at 5 and shift the rest by one.
        let (oneof_field, shift) = match location {
            "query" => (3, 1),
            "formData" => (2, 1),
            "header" => (1, 0),
            _ => (4, 0),
        };
        let mut sub = Msg::default();
        sub.boolean(1, bool_of(m, "required"));
        sub.string(2, location);
        sub.string(3, str_of(m, "description"));
        sub.string(4, str_of(m, "name"));
        if shift == 1 {
            sub.boolean(5, bool_of(m, "allowEmptyValue"));
        }
        sub.string(5 + shift, str_of(m, "type"));
        sub.string(6 + shift, str_of(m, "format"));
        sub.boolean(19 + shift, bool_of(m, "uniqueItems"));
        vendor_extensions(&mut sub, 22 + shift, m);
        let mut non_body = Msg::default();
        non_body.message(oneof_field, sub);
        param.message(2, non_body);
    }
    let mut item = Msg::default();
    item.message(1, param);
    item
}

/// `openapi.v2.Operation`.
fn operation(v: &Value) -> Msg {
    let mut out = Msg::default();
    let Value::Object(m) = v else {
        return out;
    };
    let strings = |k: &str| -> Vec<&str> {
        m.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    };
    out.strings(1, strings("tags"));
    out.string(2, str_of(m, "summary"));
    out.string(3, str_of(m, "description"));
    out.string(5, str_of(m, "operationId"));
    out.strings(6, strings("produces"));
    out.strings(7, strings("consumes"));
    for p in m
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.message(8, parameter(p));
    }
    if let Some(Value::Object(responses)) = m.get("responses") {
        let mut rs = Msg::default();
        for (code, r) in responses {
            let mut response = Msg::default();
            response.string(
                1,
                r.get("description").and_then(Value::as_str).unwrap_or(""),
            );
            if let Some(s) = r.get("schema") {
                let mut item = Msg::default();
                item.message(1, schema(s));
                response.message(2, item);
            }
            let mut value = Msg::default();
            value.message(1, response);
            let mut named = Msg::default();
            named.string(1, code);
            named.message(2, value);
            rs.message(1, named);
        }
        out.message(9, rs);
    }
    out.strings(10, strings("schemes"));
    vendor_extensions(&mut out, 13, m);
    out
}

/// `openapi.v2.PathItem`.
fn path_item(v: &Value) -> Msg {
    let mut out = Msg::default();
    let Value::Object(m) = v else {
        return out;
    };
    for (field, verb) in [
        (2, "get"),
        (3, "put"),
        (4, "post"),
        (5, "delete"),
        (6, "options"),
        (7, "head"),
        (8, "patch"),
    ] {
        if let Some(op) = m.get(verb) {
            out.message(field, operation(op));
        }
    }
    for p in m
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.message(9, parameter(p));
    }
    vendor_extensions(&mut out, 10, m);
    out
}

/// Encodes a Swagger 2.0 JSON document as `openapi.v2.Document`.
pub(crate) fn encode_document(doc: &Value) -> Vec<u8> {
    let mut out = Msg::default();
    let Value::Object(m) = doc else {
        return out.0;
    };
    out.string(1, str_of(m, "swagger"));
    if let Some(Value::Object(info)) = m.get("info") {
        let mut i = Msg::default();
        i.string(1, str_of(info, "title"));
        i.string(2, str_of(info, "version"));
        i.string(3, str_of(info, "description"));
        out.message(2, i);
    }
    if let Some(Value::Object(paths)) = m.get("paths") {
        let mut p = Msg::default();
        for (path, item) in paths {
            let mut named = Msg::default();
            named.string(1, path);
            named.message(2, path_item(item));
            p.message(2, named);
        }
        out.message(8, p);
    }
    if let Some(Value::Object(defs)) = m.get("definitions") {
        let mut d = Msg::default();
        for (name, s) in defs {
            let mut named = Msg::default();
            named.string(1, name);
            named.message(2, schema(s));
            d.message(1, named);
        }
        out.message(9, d);
    }
    for requirement in m
        .get("security")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut r = Msg::default();
        for (name, scopes) in requirement.as_object().into_iter().flatten() {
            let mut array = Msg::default();
            array.strings(
                1,
                scopes
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str),
            );
            let mut named = Msg::default();
            named.string(1, name);
            named.message(2, array);
            r.message(1, named);
        }
        out.message(12, r);
    }
    if let Some(Value::Object(defs)) = m.get("securityDefinitions") {
        let mut d = Msg::default();
        for (name, def) in defs {
            let Value::Object(def) = def else { continue };
            let mut key = Msg::default();
            key.string(1, str_of(def, "type"));
            key.string(2, str_of(def, "name"));
            key.string(3, str_of(def, "in"));
            key.string(4, str_of(def, "description"));
            let mut item = Msg::default();
            item.message(2, key);
            let mut named = Msg::default();
            named.string(1, name);
            named.message(2, item);
            d.message(1, named);
        }
        out.message(13, d);
    }
    out.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn varints_and_strings_use_the_wire_format() {
        let mut m = Msg::default();
        m.varint(300);
        assert_eq!(m.0, [0xac, 0x02]);
        let mut m = Msg::default();
        m.string(1, "2.0");
        assert_eq!(m.0, [0x0a, 3, b'2', b'.', b'0']);
        let mut m = Msg::default();
        m.int64(11, -1);
        assert_eq!(m.0.len(), 1 + 10);
    }

    #[test]
    fn schema_fields_land_on_gnostic_numbers() {
        let s = schema(&json!({
            "type": "object",
            "required": ["containers"],
            "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}],
        }));
        // required = 19 (length-delimited): key 19<<3|2 = 154 → varint [0x9a, 0x01].
        let bytes = s.0;
        assert!(bytes.windows(2).any(|w| w == [0x9a, 0x01]));
        // type = 22 → key 178 → [0xb2, 0x01]; vendor_extension = 31 → key 250 → [0xfa, 0x01].
        assert!(bytes.windows(2).any(|w| w == [0xb2, 0x01]));
        assert!(bytes.windows(2).any(|w| w == [0xfa, 0x01]));
    }
}
