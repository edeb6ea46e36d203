//! Upstream-style field validation: `field.Error` values, their exact texts, the name
//! validators of apimachinery, and per-kind object validation.
//!
//! [`validate_object`] also rejects values of the wrong type (which upstream refuses while
//! decoding) so a caller that validates raw JSON never stores an undecodable object.

use std::fmt;

use serde_json::Value;

mod apiextensions;
mod apiregistration;
mod batch;
pub mod certificates;
mod cluster;
mod common;
mod config;
mod flowcontrol;
mod meta;
mod names;
mod network;
mod networking;
mod object;
mod pod;
mod rbac;
mod storage;
mod userns;
mod workloads;

pub use names::*;
pub use object::{
    validate_object, validate_pod_ephemeral_containers_update, validate_pod_spec_for_kubelet,
};

/// Upstream's `field.ErrorType`.
#[derive(Clone, Debug, PartialEq)]
pub enum ErrorType {
    Required,
    Invalid,
    NotSupported,
    Duplicate,
    Forbidden,
    TooLong,
    TooMany,
    NotFound,
    InternalError,
}

impl ErrorType {
    /// The `CauseType` string used in Status causes.
    pub fn reason(&self) -> &'static str {
        match self {
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
            ErrorType::NotFound => "FieldValueNotFound",
            ErrorType::InternalError => "InternalError",
        }
    }

    /// The human text upstream prints (`ErrorType.String()`).
    pub fn text(&self) -> &'static str {
        match self {
            ErrorType::Required => "Required value",
            ErrorType::Invalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::TooMany => "Too many",
            ErrorType::NotFound => "Not found",
            ErrorType::InternalError => "Internal error",
        }
    }
}

/// One validation failure. `value: None` means upstream's omitted value (only the type is
/// printed); `Some(Value::Null)` prints `null`.
#[derive(Clone, Debug)]
pub struct FieldError {
    pub kind: ErrorType,
    pub field: String,
    pub value: Option<Value>,
    pub detail: String,
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
        FieldError {
            kind: ErrorType::Required,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    pub fn invalid(
        field: impl Into<String>,
        value: Value,
        detail: impl Into<String>,
    ) -> FieldError {
        FieldError {
            kind: ErrorType::Invalid,
            field: field.into(),
            value: Some(value),
            detail: detail.into(),
        }
    }

    /// `Invalid value: <detail>`: upstream's `field.OmitValueType{}`, no value printed.
    pub fn invalid_omitted(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
        FieldError {
            kind: ErrorType::Invalid,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    /// `Unsupported value: "x": supported values: "a", "b"` (values printed in the order given).
    pub fn not_supported(field: impl Into<String>, value: Value, supported: &[&str]) -> FieldError {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported
                .iter()
                .map(|s| crate::status::go_quote(s))
                .collect();
            format!("supported values: {}", quoted.join(", "))
        };
        FieldError {
            kind: ErrorType::NotSupported,
            field: field.into(),
            value: Some(value),
            detail,
        }
    }

    pub fn duplicate(field: impl Into<String>, value: Value) -> FieldError {
        FieldError {
            kind: ErrorType::Duplicate,
            field: field.into(),
            value: Some(value),
            detail: String::new(),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
        FieldError {
            kind: ErrorType::Forbidden,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    pub fn not_found(field: impl Into<String>, value: Value) -> FieldError {
        FieldError {
            kind: ErrorType::NotFound,
            field: field.into(),
            value: Some(value),
            detail: String::new(),
        }
    }

    /// `Too long: may not be more than N bytes`.
    pub fn too_long(field: impl Into<String>, max: usize) -> FieldError {
        FieldError {
            kind: ErrorType::TooLong,
            field: field.into(),
            value: None,
            detail: format!("may not be more than {max} bytes"),
        }
    }

    /// `Too many: N: must have at most M items`.
    pub fn too_many(field: impl Into<String>, actual: usize, max: usize) -> FieldError {
        FieldError {
            kind: ErrorType::TooMany,
            field: field.into(),
            value: Some(Value::from(actual)),
            detail: format!("must have at most {max} items"),
        }
    }

    pub fn internal(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
        FieldError {
            kind: ErrorType::InternalError,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    /// Upstream's `ErrorBody()`: the message without the field path.
    pub fn body(&self) -> String {
        let omit = matches!(
            self.kind,
            ErrorType::Required
                | ErrorType::Forbidden
                | ErrorType::TooLong
                | ErrorType::InternalError
        );
        let mut s = match (&self.value, omit) {
            (None, _) | (_, true) => self.kind.text().to_string(),
            (Some(v), false) => format!("{}: {}", self.kind.text(), go_value(v)),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

impl std::error::Error for FieldError {}

/// How upstream prints a bad value: strings quoted, numbers and bools bare, null as `null`,
/// string lists and maps in Go's `%#v` syntax (`[]string{"a", "b"}`,
/// `map[string]string{"k":"v"}`). A value of the form `{"$stringer": "x"}` prints as the bare
/// text `x`, for upstream values whose type has a `String()` method (e.g. resource names).
fn go_value(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::String(s) => crate::status::go_quote(s),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(a) if a.is_empty() => "[]string(nil)".to_string(),
        Value::Array(a) if a.iter().all(Value::is_string) => {
            let items: Vec<String> = a.iter().map(go_value).collect();
            format!("[]string{{{}}}", items.join(", "))
        }
        Value::Object(m) if m.len() == 1 && m.get("$stringer").is_some_and(Value::is_string) => m
            .get("$stringer")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        Value::Object(m) if m.values().all(Value::is_string) => {
            let mut items: Vec<(&String, &Value)> = m.iter().collect();
            items.sort_by(|a, b| a.0.cmp(b.0));
            let parts: Vec<String> = items
                .iter()
                .map(|(k, v)| format!("{}:{}", crate::status::go_quote(k), go_value(v)))
                .collect();
            format!("map[string]string{{{}}}", parts.join(", "))
        }
        other => other.to_string(),
    }
}

/// Upstream's `ErrorList.ToAggregate().Error()`: duplicates dropped, one message bare,
/// several as `[a, b]`. `None` for an empty list.
pub fn aggregate_messages(errs: &[FieldError]) -> Option<String> {
    let mut seen: Vec<String> = Vec::new();
    for e in errs {
        let msg = e.to_string();
        if !seen.contains(&msg) {
            seen.push(msg);
        }
    }
    match seen.len() {
        0 => None,
        1 => seen.pop(),
        _ => Some(format!("[{}]", seen.join(", "))),
    }
}

/// A field path builder in upstream's notation (`spec.containers[0].name`, `metadata.labels[a]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    pub fn new(root: &str) -> Path {
        Path(root.to_string())
    }

    pub fn child(&self, name: &str) -> Path {
        if self.0.is_empty() {
            Path(name.to_string())
        } else {
            Path(format!("{}.{name}", self.0))
        }
    }

    pub fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }

    pub fn key(&self, k: &str) -> Path {
        Path(format!("{}[{k}]", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&Path> for String {
    fn from(p: &Path) -> String {
        p.0.clone()
    }
}

impl From<Path> for String {
    fn from(p: Path) -> String {
        p.0
    }
}
