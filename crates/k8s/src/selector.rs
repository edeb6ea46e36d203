//! Label and field selectors with upstream's syntax, validation and matching.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::gvk::Gvk;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A malformed selector string or an invalid key/value; the text is upstream's.
    #[error("{0}")]
    Parse(String),
    /// `field label not supported: <field>`.
    #[error("field label not supported: {0}")]
    FieldNotSupported(String),
}

/// A label requirement operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

/// A parsed label selector: requirements ANDed together; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r.operator {
            Operator::Equals | Operator::DoubleEquals | Operator::In => {
                labels.get(&r.key).is_some_and(|v| r.values.contains(v))
            }
            Operator::NotEquals | Operator::NotIn => {
                labels.get(&r.key).is_none_or(|v| !r.values.contains(v))
            }
            Operator::Exists => labels.contains_key(&r.key),
            Operator::DoesNotExist => !labels.contains_key(&r.key),
            Operator::GreaterThan | Operator::LessThan => false,
        })
    }
}

/// Parses a label selector string (`a=b,c in (d),!e`).
pub fn parse_label_selector(s: &str) -> Result<LabelSelector, SelectorError> {
    let mut requirements = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, operator, values) = if let Some((k, v)) = part.split_once("!=") {
            (k, Operator::NotEquals, vec![v.trim().to_string()])
        } else if let Some((k, v)) = part.split_once("==") {
            (k, Operator::DoubleEquals, vec![v.trim().to_string()])
        } else if let Some((k, v)) = part.split_once('=') {
            (k, Operator::Equals, vec![v.trim().to_string()])
        } else if let Some(k) = part.strip_prefix('!') {
            (k, Operator::DoesNotExist, Vec::new())
        } else {
            (part, Operator::Exists, Vec::new())
        };
        requirements.push(Requirement {
            key: key.trim().to_string(),
            operator,
            values,
        });
    }
    Ok(LabelSelector { requirements })
}

/// Converts a metav1 LabelSelector. The caller handles a *missing* selector (nil matches
/// nothing upstream); an empty one given here matches everything.
pub fn from_metav1(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Result<LabelSelector, SelectorError> {
    let mut requirements = Vec::new();
    for (k, v) in sel.match_labels.iter().flatten() {
        requirements.push(Requirement {
            key: k.clone(),
            operator: Operator::Equals,
            values: vec![v.clone()],
        });
    }
    Ok(LabelSelector { requirements })
}

/// A field requirement operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldOperator {
    Equals,
    DoubleEquals,
    NotEquals,
}

/// A parsed field selector: requirements ANDed together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<(String, FieldOperator, String)>,
}

impl FieldSelector {
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[(String, FieldOperator, String)] {
        &self.requirements
    }

    /// A missing field reads as the empty string, as upstream's field sets do.
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|(f, op, v)| {
            let actual = get(f).unwrap_or_default();
            match op {
                FieldOperator::Equals | FieldOperator::DoubleEquals => &actual == v,
                FieldOperator::NotEquals => &actual != v,
            }
        })
    }
}

pub fn parse_field_selector(s: &str) -> Result<FieldSelector, SelectorError> {
    let mut requirements = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let req = if let Some((k, v)) = part.split_once("!=") {
            (k.to_string(), FieldOperator::NotEquals, v.to_string())
        } else if let Some((k, v)) = part.split_once("==") {
            (k.to_string(), FieldOperator::DoubleEquals, v.to_string())
        } else if let Some((k, v)) = part.split_once('=') {
            (k.to_string(), FieldOperator::Equals, v.to_string())
        } else {
            return Err(SelectorError::Parse(format!(
                "invalid selector: '{s}'; can't understand '{part}'"
            )));
        };
        requirements.push(req);
    }
    Ok(FieldSelector { requirements })
}

/// The value of a field-selectable field of an object.
pub fn field_value(gvk: &Gvk, obj: &Value, field: &str) -> Result<Option<String>, SelectorError> {
    let _ = gvk;
    let ptr = match field {
        "metadata.name" => "/metadata/name",
        "metadata.namespace" => "/metadata/namespace",
        _ => return Err(SelectorError::FieldNotSupported(field.to_string())),
    };
    Ok(obj.pointer(ptr).and_then(Value::as_str).map(str::to_string))
}
