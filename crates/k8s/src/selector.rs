//! Label and field selectors with upstream's syntax, validation, error texts and matching,
//! and the fields each kind lets a field selector use.
//!
//! Nil versus empty: a *missing* metav1 selector matches nothing upstream (e.g. a PDB without
//! a selector), while an empty one matches everything. [`from_metav1`] takes a selector that
//! is present, so the caller decides what a missing one means.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use serde_json::Value;

use crate::gvk::Gvk;
use crate::validation::{FieldError, aggregate_messages, is_qualified_name, is_valid_label_value};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A malformed selector string or an invalid key/value; the text is upstream's.
    #[error("{0}")]
    Parse(String),
    /// A kind with its own field list rejects the field: `field label not supported: <field>`.
    #[error("field label not supported: {0}")]
    FieldNotSupported(String),
    /// A kind with only metadata fields rejects the field (upstream's default conversion text).
    #[error(
        "\"{0}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
    )]
    UnknownField(String),
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

impl Operator {
    /// Upstream's `selection.Operator` strings.
    pub fn as_str(&self) -> &'static str {
        match self {
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => "in",
            Operator::NotIn => "notin",
            Operator::Exists => "exists",
            Operator::DoesNotExist => "!",
            Operator::GreaterThan => "gt",
            Operator::LessThan => "lt",
        }
    }
}

/// One label requirement; `values` are sorted and unique, as upstream stores them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement with upstream's `NewRequirement` checks.
    pub fn new(
        key: &str,
        operator: Operator,
        values: Vec<String>,
    ) -> Result<Requirement, SelectorError> {
        let mut values = values;
        values.sort();
        values.dedup();
        let mut errs = Vec::new();
        if let Some(e) = validate_label_key(key, "key") {
            errs.push(e);
        }
        let vals_json = || Value::from(values.clone());
        match operator {
            Operator::In | Operator::NotIn => {
                if values.is_empty() {
                    errs.push(FieldError::invalid(
                        "values",
                        vals_json(),
                        "for 'in', 'notin' operators, values set can't be empty",
                    ));
                }
            }
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
                if values.len() != 1 {
                    errs.push(FieldError::invalid(
                        "values",
                        vals_json(),
                        "exact-match compatibility requires one single value",
                    ));
                }
            }
            Operator::Exists | Operator::DoesNotExist => {
                if !values.is_empty() {
                    errs.push(FieldError::invalid(
                        "values",
                        vals_json(),
                        "values set must be empty for exists and does not exist",
                    ));
                }
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    errs.push(FieldError::invalid(
                        "values",
                        vals_json(),
                        "for 'Gt', 'Lt' operators, exactly one value is required",
                    ));
                }
                for (i, v) in values.iter().enumerate() {
                    if v.parse::<i64>().is_err() {
                        errs.push(FieldError::invalid(
                            format!("values[{i}]"),
                            Value::from(v.as_str()),
                            "for 'Gt', 'Lt' operators, the value must be an integer",
                        ));
                    }
                }
            }
        }
        for (i, v) in values.iter().enumerate() {
            let msgs = is_valid_label_value(v);
            if !msgs.is_empty() {
                errs.push(FieldError::invalid(
                    format!("values[{i}][{key}]"),
                    Value::from(v.as_str()),
                    msgs.join("; "),
                ));
            }
        }
        match aggregate_messages(&errs) {
            Some(msg) => Err(SelectorError::Parse(msg)),
            None => Ok(Requirement {
                key: key.to_string(),
                operator,
                values,
            }),
        }
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let actual = labels.get(&self.key);
        match self.operator {
            Operator::Equals | Operator::DoubleEquals | Operator::In => {
                actual.is_some_and(|v| self.values.contains(v))
            }
            Operator::NotEquals | Operator::NotIn => {
                actual.is_none_or(|v| !self.values.contains(v))
            }
            Operator::Exists => actual.is_some(),
            Operator::DoesNotExist => actual.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(Ok(have)) = actual.map(|v| v.parse::<i64>()) else {
                    return false;
                };
                let [want] = self.values.as_slice() else {
                    return false;
                };
                let Ok(want) = want.parse::<i64>() else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }

    /// Upstream's `Requirement.String()`.
    fn render(&self) -> String {
        match self.operator {
            Operator::Exists => self.key.clone(),
            Operator::DoesNotExist => format!("!{}", self.key),
            Operator::In | Operator::NotIn => {
                format!(
                    "{} {} ({})",
                    self.key,
                    self.operator.as_str(),
                    self.values.join(",")
                )
            }
            Operator::GreaterThan => format!("{}>{}", self.key, self.values.join(",")),
            Operator::LessThan => format!("{}<{}", self.key, self.values.join(",")),
            _ => format!(
                "{}{}{}",
                self.key,
                self.operator.as_str(),
                self.values.join(",")
            ),
        }
    }
}

/// `<nil>` is what upstream prints as the field of a key error raised while parsing a string.
fn validate_label_key(key: &str, field: &str) -> Option<FieldError> {
    let msgs = is_qualified_name(key);
    if msgs.is_empty() {
        None
    } else {
        Some(FieldError::invalid(
            field,
            Value::from(key),
            msgs.join("; "),
        ))
    }
}

/// A parsed label selector: requirements ANDed together, sorted by key; empty matches all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// The selector that matches everything.
    pub fn everything() -> LabelSelector {
        LabelSelector::default()
    }

    pub fn from_requirements(mut requirements: Vec<Requirement>) -> LabelSelector {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector { requirements }
    }

    /// `a=b,c=d` selector from a map (e.g. a Service's `spec.selector`).
    pub fn from_map(map: &BTreeMap<String, String>) -> LabelSelector {
        LabelSelector::from_requirements(
            map.iter()
                .map(|(k, v)| Requirement {
                    key: k.clone(),
                    operator: Operator::Equals,
                    values: vec![v.clone()],
                })
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl std::fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.requirements.iter().map(Requirement::render).collect();
        f.write_str(&parts.join(","))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Identifier(String),
    In,
    NotIn,
    OpenPar,
    ClosedPar,
    Comma,
    Equals,
    DoubleEquals,
    NotEquals,
    DoesNotExist,
    GreaterThan,
    LessThan,
    End,
    Error(String),
}

impl Token {
    fn literal(&self) -> String {
        match self {
            Token::Identifier(s) | Token::Error(s) => s.clone(),
            Token::In => "in".into(),
            Token::NotIn => "notin".into(),
            Token::OpenPar => "(".into(),
            Token::ClosedPar => ")".into(),
            Token::Comma => ",".into(),
            Token::Equals => "=".into(),
            Token::DoubleEquals => "==".into(),
            Token::NotEquals => "!=".into(),
            Token::DoesNotExist => "!".into(),
            Token::GreaterThan => ">".into(),
            Token::LessThan => "<".into(),
            Token::End => String::new(),
        }
    }

    /// In a values context upstream reads the keywords `in`/`notin` as plain identifiers.
    fn in_values(self) -> Token {
        match self {
            Token::In => Token::Identifier("in".into()),
            Token::NotIn => Token::Identifier("notin".into()),
            t => t,
        }
    }
}

fn is_special(c: u8) -> bool {
    matches!(c, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn symbol_token(s: &[u8]) -> Option<Token> {
    Some(match s {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

/// Upstream's lexer: longest run of special symbols that still forms a token.
fn lex(s: &str) -> Vec<Token> {
    let b = s.as_bytes();
    let mut pos = 0;
    let mut out = Vec::new();
    loop {
        while pos < b.len() && matches!(b[pos], b' ' | b'\t' | b'\r' | b'\n') {
            pos += 1;
        }
        if pos >= b.len() {
            out.push(Token::End);
            return out;
        }
        if is_special(b[pos]) {
            let start = pos;
            let mut last: Option<(Token, usize)> = None;
            while pos < b.len() && is_special(b[pos]) {
                pos += 1;
                match symbol_token(&b[start..pos]) {
                    Some(t) => last = Some((t, pos)),
                    None if last.is_some() => {
                        pos -= 1;
                        break;
                    }
                    None => {}
                }
            }
            match last {
                Some((t, end)) => {
                    pos = end;
                    out.push(t);
                }
                None => {
                    let buf = String::from_utf8_lossy(&b[start..pos]);
                    out.push(Token::Error(format!(
                        "error expected: keyword found '{buf}'"
                    )));
                }
            }
        } else {
            let start = pos;
            while pos < b.len()
                && !is_special(b[pos])
                && !matches!(b[pos], b' ' | b'\t' | b'\r' | b'\n')
            {
                pos += 1;
            }
            let word = &s[start..pos];
            out.push(match word {
                "in" => Token::In,
                "notin" => Token::NotIn,
                w => Token::Identifier(w.to_string()),
            });
        }
    }
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

fn perr(msg: String) -> SelectorError {
    SelectorError::Parse(msg)
}

impl Parser {
    fn peek_values(&self) -> Token {
        self.tokens
            .get(self.pos)
            .cloned()
            .unwrap_or(Token::End)
            .in_values()
    }

    fn next_raw(&mut self) -> Token {
        let t = self.tokens.get(self.pos).cloned().unwrap_or(Token::End);
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn next_values(&mut self) -> Token {
        self.next_raw().in_values()
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut reqs = Vec::new();
        loop {
            match self.peek_values() {
                Token::Identifier(_) | Token::DoesNotExist => {
                    let r = self
                        .requirement()
                        .map_err(|e| perr(format!("unable to parse requirement: {e}")))?;
                    reqs.push(r);
                    match self.next_values() {
                        Token::End => return Ok(reqs),
                        Token::Comma => match self.peek_values() {
                            Token::Identifier(_) | Token::DoesNotExist => {}
                            t => {
                                return Err(perr(format!(
                                    "found '{}', expected: identifier after ','",
                                    t.literal()
                                )));
                            }
                        },
                        t => {
                            return Err(perr(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                t.literal()
                            )));
                        }
                    }
                }
                Token::End => return Ok(reqs),
                t => {
                    return Err(perr(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.literal()
                    )));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let mut tok = self.next_values();
        let mut op = None;
        if tok == Token::DoesNotExist {
            op = Some(Operator::DoesNotExist);
            tok = self.next_values();
        }
        let Token::Identifier(key) = tok else {
            return Err(perr(format!(
                "found '{}', expected: identifier",
                tok.literal()
            )));
        };
        if let Some(e) = validate_label_key(&key, "<nil>") {
            return Err(perr(e.to_string()));
        }
        if matches!(self.peek_values(), Token::End | Token::Comma) && op.is_none() {
            op = Some(Operator::Exists);
        }
        if let Some(op) = op {
            return Requirement::new(&key, op, Vec::new());
        }
        let op = match self.next_raw() {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            t => {
                return Err(perr(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    t.literal()
                )));
            }
        };
        let values = match op {
            Operator::In | Operator::NotIn => self.set_values()?,
            _ => self.exact_value()?,
        };
        Requirement::new(&key, op, values)
    }

    fn set_values(&mut self) -> Result<Vec<String>, SelectorError> {
        let t = self.next_values();
        if t != Token::OpenPar {
            return Err(perr(format!("found '{}' expected: '('", t.literal())));
        }
        let look = self.peek_values();
        match look {
            Token::Identifier(_) | Token::Comma => {
                let s = self.identifiers()?;
                if self.next_values() != Token::ClosedPar {
                    return Err(perr(format!("found '{}', expected: ')'", look.literal())));
                }
                Ok(s)
            }
            Token::ClosedPar => {
                self.next_values();
                Ok(vec![String::new()])
            }
            t => Err(perr(format!(
                "found '{}', expected: ',', ')' or identifier",
                t.literal()
            ))),
        }
    }

    fn identifiers(&mut self) -> Result<Vec<String>, SelectorError> {
        let mut s: Vec<String> = Vec::new();
        loop {
            match self.next_values() {
                Token::Identifier(v) => {
                    s.push(v);
                    match self.peek_values() {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(s),
                        t => {
                            return Err(perr(format!(
                                "found '{}', expected: ',' or ')'",
                                t.literal()
                            )));
                        }
                    }
                }
                Token::Comma => {
                    if s.is_empty() {
                        s.push(String::new());
                    }
                    match self.peek_values() {
                        Token::ClosedPar => {
                            s.push(String::new());
                            return Ok(s);
                        }
                        Token::Comma => {
                            self.next_values();
                            s.push(String::new());
                        }
                        _ => {}
                    }
                }
                t => {
                    return Err(perr(format!(
                        "found '{}', expected: ',', or identifier",
                        t.literal()
                    )));
                }
            }
        }
    }

    fn exact_value(&mut self) -> Result<Vec<String>, SelectorError> {
        if matches!(self.peek_values(), Token::End | Token::Comma) {
            return Ok(vec![String::new()]);
        }
        match self.next_values() {
            Token::Identifier(v) => Ok(vec![v]),
            t => Err(perr(format!(
                "found '{}', expected: identifier",
                t.literal()
            ))),
        }
    }
}

/// Parses a label selector string with upstream's grammar (`labels.Parse`).
pub fn parse_label_selector(s: &str) -> Result<LabelSelector, SelectorError> {
    let tokens = lex(s);
    // The lexer reports a bad symbol run as a token; upstream fails on it wherever it lands.
    let mut parser = Parser { tokens, pos: 0 };
    let reqs = parser.parse()?;
    Ok(LabelSelector::from_requirements(reqs))
}

/// Converts a metav1 LabelSelector (matchLabels + matchExpressions) like upstream's
/// `LabelSelectorAsSelector`. An empty selector matches everything.
pub fn from_metav1(sel: &metav1::LabelSelector) -> Result<LabelSelector, SelectorError> {
    let mut reqs = Vec::new();
    for (k, v) in sel.match_labels.iter().flatten() {
        reqs.push(Requirement::new(k, Operator::Equals, vec![v.clone()])?);
    }
    for expr in sel.match_expressions.iter().flatten() {
        let op = match expr.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => {
                return Err(perr(format!(
                    "\"{other}\" is not a valid label selector operator"
                )));
            }
        };
        reqs.push(Requirement::new(
            &expr.key,
            op,
            expr.values.clone().unwrap_or_default(),
        )?);
    }
    Ok(LabelSelector::from_requirements(reqs))
}

/// A field requirement operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldOperator {
    Equals,
    DoubleEquals,
    NotEquals,
}

impl FieldOperator {
    pub fn as_str(&self) -> &'static str {
        match self {
            FieldOperator::Equals => "=",
            FieldOperator::DoubleEquals => "==",
            FieldOperator::NotEquals => "!=",
        }
    }
}

/// A parsed field selector: requirements ANDed together (values already unescaped).
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

    /// The value an `=`/`==` requirement demands of `field`, if any (e.g. `spec.nodeName`
    /// for the kubelet's watch).
    pub fn required_value(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|(f, op, _)| f == field && *op != FieldOperator::NotEquals)
            .map(|(_, _, v)| v.as_str())
    }

    /// A missing field reads as the empty string, as upstream's `fields.Set` does.
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|(f, op, v)| {
            let actual = get(f).unwrap_or_default();
            match op {
                FieldOperator::Equals | FieldOperator::DoubleEquals => &actual == v,
                FieldOperator::NotEquals => &actual != v,
            }
        })
    }

    /// Checks every field against the kind's selectable fields and matches the object.
    pub fn matches_object(&self, gvk: &Gvk, obj: &Value) -> Result<bool, SelectorError> {
        let mut values = BTreeMap::new();
        for (f, _, _) in &self.requirements {
            values.insert(f.clone(), field_value(gvk, obj, f)?);
        }
        Ok(self.matches(|f| values.get(f).cloned().flatten()))
    }
}

/// Upstream's `Selector.String()`: `f=v` (also for `==`) and `f!=v`, values re-escaped,
/// terms joined by commas in their (sorted) parse order.
impl std::fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let terms: Vec<String> = self
            .requirements
            .iter()
            .map(|(field, op, value)| {
                let op = if *op == FieldOperator::NotEquals {
                    "!="
                } else {
                    "="
                };
                format!("{field}{op}{}", escape_field_value(value))
            })
            .collect();
        f.write_str(&terms.join(","))
    }
}

/// Splits on commas not escaped by a backslash (upstream `splitTerms`).
fn split_terms(s: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in s.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

/// Upstream `UnescapeValue`.
fn unescape_value(s: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => {
                    return Err(perr(format!(
                        "invalid field selector: invalid escape sequence: \\{c}"
                    )));
                }
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => {
                return Err(perr(format!(
                    "invalid field selector: unescaped character in value: {c}"
                )));
            }
            c => out.push(c),
        }
    }
    if in_slash {
        return Err(perr(
            "invalid field selector: invalid escape sequence: \\".to_string(),
        ));
    }
    Ok(out)
}

/// Parses a field selector (`fields.ParseSelector`).
pub fn parse_field_selector(s: &str) -> Result<FieldSelector, SelectorError> {
    let mut parts = if s.is_empty() {
        Vec::new()
    } else {
        split_terms(s)
    };
    parts.sort_unstable();
    let mut requirements = Vec::new();
    for part in parts {
        if part.is_empty() {
            continue;
        }
        let split = part.char_indices().find_map(|(i, _)| {
            let rest = &part[i..];
            [
                FieldOperator::NotEquals,
                FieldOperator::DoubleEquals,
                FieldOperator::Equals,
            ]
            .into_iter()
            .find(|op| rest.starts_with(op.as_str()))
            .map(|op| (&part[..i], op, &rest[op.as_str().len()..]))
        });
        let Some((lhs, op, rhs)) = split else {
            return Err(perr(format!(
                "invalid selector: '{s}'; can't understand '{part}'"
            )));
        };
        requirements.push((lhs.to_string(), op, unescape_value(rhs)?));
    }
    Ok(FieldSelector { requirements })
}

/// Escapes a value for use in a field selector (upstream `EscapeValue`).
pub fn escape_field_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn str_at(obj: &Value, ptr: &str) -> String {
    obj.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// The value of a field-selectable field of an object, per upstream's field label conversion
/// funcs and `GetAttrs` of each kind. Unset fields read as `""` (as upstream's field sets).
/// An unknown field is upstream's error for that kind.
pub fn field_value(gvk: &Gvk, obj: &Value, field: &str) -> Result<Option<String>, SelectorError> {
    let unsupported = || Err(SelectorError::FieldNotSupported(field.to_string()));
    let meta = |f: &str| -> Option<String> {
        match f {
            "metadata.name" => Some(str_at(obj, "/metadata/name")),
            "metadata.namespace" => Some(str_at(obj, "/metadata/namespace")),
            _ => None,
        }
    };
    let v = match (gvk.group.as_str(), gvk.kind.as_str()) {
        ("", "Pod") => match field {
            "metadata.name" | "metadata.namespace" => meta(field),
            "spec.nodeName" | "spec.host" => Some(str_at(obj, "/spec/nodeName")),
            "spec.restartPolicy" => Some(str_at(obj, "/spec/restartPolicy")),
            "spec.schedulerName" => Some(str_at(obj, "/spec/schedulerName")),
            "spec.serviceAccountName" => Some(str_at(obj, "/spec/serviceAccountName")),
            "spec.hostNetwork" => {
                let b = obj
                    .pointer("/spec/hostNetwork")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                Some(b.to_string())
            }
            "status.phase" => Some(str_at(obj, "/status/phase")),
            "status.podIP" => Some(str_at(obj, "/status/podIPs/0/ip"))
                .filter(|s| !s.is_empty())
                .or_else(|| Some(str_at(obj, "/status/podIP"))),
            // Accepted by upstream's conversion but absent from the pod's field set.
            "status.podIPs" => Some(String::new()),
            "status.nominatedNodeName" => Some(str_at(obj, "/status/nominatedNodeName")),
            _ => return unsupported(),
        },
        ("", "Node") => match field {
            "metadata.name" => meta(field),
            "spec.unschedulable" => {
                let b = obj
                    .pointer("/spec/unschedulable")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                Some(b.to_string())
            }
            _ => return unsupported(),
        },
        ("", "Namespace") => match field {
            "metadata.name" => meta(field),
            "status.phase" => Some(str_at(obj, "/status/phase")),
            _ => return unsupported(),
        },
        ("", "Secret") => match field {
            "metadata.name" | "metadata.namespace" => meta(field),
            "type" => Some(str_at(obj, "/type")),
            _ => return unsupported(),
        },
        ("", "Service") => match field {
            "metadata.name" | "metadata.namespace" => meta(field),
            "spec.clusterIP" => Some(str_at(obj, "/spec/clusterIP")),
            "spec.type" => Some(str_at(obj, "/spec/type")),
            _ => return unsupported(),
        },
        ("", "Event") => match field {
            "metadata.name" | "metadata.namespace" => meta(field),
            "involvedObject.kind"
            | "involvedObject.namespace"
            | "involvedObject.name"
            | "involvedObject.uid"
            | "involvedObject.apiVersion"
            | "involvedObject.resourceVersion"
            | "involvedObject.fieldPath" => {
                let sub = field.trim_start_matches("involvedObject.");
                Some(str_at(obj, &format!("/involvedObject/{sub}")))
            }
            "reason" => Some(str_at(obj, "/reason")),
            "reportingComponent" => Some(str_at(obj, "/reportingComponent")),
            "source" => Some(str_at(obj, "/source/component")),
            "type" => Some(str_at(obj, "/type")),
            _ => return unsupported(),
        },
        ("events.k8s.io", "Event") => match field {
            "metadata.name" | "metadata.namespace" => meta(field),
            f if f.starts_with("regarding.") => {
                let sub = &f["regarding.".len()..];
                if ![
                    "kind",
                    "namespace",
                    "name",
                    "uid",
                    "apiVersion",
                    "resourceVersion",
                    "fieldPath",
                ]
                .contains(&sub)
                {
                    return unsupported();
                }
                Some(str_at(obj, &format!("/regarding/{sub}")))
            }
            "reason" => Some(str_at(obj, "/reason")),
            "reportingController" => Some(str_at(obj, "/reportingController")),
            "type" => Some(str_at(obj, "/type")),
            _ => return unsupported(),
        },
        ("apps", "ReplicaSet") => match field {
            "metadata.name" | "metadata.namespace" => meta(field),
            "status.replicas" => {
                let n = obj
                    .pointer("/status/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                Some(n.to_string())
            }
            _ => return unsupported(),
        },
        _ => match meta(field) {
            Some(v) => Some(v),
            None => return Err(SelectorError::UnknownField(field.to_string())),
        },
    };
    Ok(v)
}

/// Checks that every field of a selector is selectable for the kind (before listing).
pub fn check_fields(gvk: &Gvk, sel: &FieldSelector) -> Result<(), SelectorError> {
    let empty = Value::Object(Default::default());
    for (f, _, _) in sel.requirements() {
        field_value(gvk, &empty, f)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn matches(sel: &str, labels: &[(&str, &str)]) -> bool {
        match parse_label_selector(sel) {
            Ok(s) => s.matches(&set(labels)),
            Err(e) => panic!("{sel}: {e}"),
        }
    }

    #[test]
    fn upstream_good_strings_restring_without_spaces() {
        for s in [
            "x=a,y=b,z=c",
            "",
            "x!=a,y=b",
            "x=",
            "x= ",
            "x=,z= ",
            "x= ,z= ",
            "!x",
            "x>1",
            "x>1,z<5",
        ] {
            let parsed = parse_label_selector(s).map(|p| p.to_string());
            assert_eq!(parsed, Ok(s.replace(' ', "")), "{s}");
        }
        assert_eq!(
            parse_label_selector("b in (z,y),a notin (x)").map(|p| p.to_string()),
            Ok("a notin (x),b in (y,z)".to_string())
        );
    }

    #[test]
    fn upstream_bad_strings() {
        for s in [
            "x=a||y=b", "x==a==b", "!x=a", "x<a", "x in", "x in (a", "a,", ",a", "x=a b",
        ] {
            assert!(parse_label_selector(s).is_err(), "{s}");
        }
    }

    #[test]
    fn upstream_error_texts() {
        let err = |s: &str| parse_label_selector(s).err().map(|e| e.to_string());
        assert_eq!(
            err("x==a==b").as_deref(),
            Some("found '==', expected: ',' or 'end of string'")
        );
        assert_eq!(
            err("!x=a").as_deref(),
            Some("found '=', expected: ',' or 'end of string'")
        );
        assert_eq!(
            err("a,").as_deref(),
            Some("found '', expected: identifier after ','")
        );
        assert_eq!(
            err("=a").as_deref(),
            Some("found '=', expected: !, identifier, or 'end of string'")
        );
        assert_eq!(
            err("x<a").as_deref(),
            Some(
                "unable to parse requirement: values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, the value must be an integer"
            )
        );
        assert_eq!(
            err("a@b=c").as_deref(),
            Some(
                "unable to parse requirement: <nil>: Invalid value: \"a@b\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
            )
        );
        assert_eq!(
            err("app=f@o").as_deref(),
            Some(
                "unable to parse requirement: values[0][app]: Invalid value: \"f@o\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
            )
        );
        assert_eq!(
            err("x in a").as_deref(),
            Some("unable to parse requirement: found 'a' expected: '('")
        );
        assert_eq!(
            err("x ~ a").as_deref(),
            Some("unable to parse requirement: found '~', expected: in, notin, =, ==, !=, gt, lt")
        );
    }

    #[test]
    fn upstream_matches() {
        assert!(matches("", &[("x", "y")]));
        assert!(matches("x=y", &[("x", "y")]));
        assert!(matches("x=y,z=w", &[("x", "y"), ("z", "w")]));
        assert!(matches("x!=y,z!=w", &[("x", "z"), ("z", "a")]));
        assert!(matches("notin=in", &[("notin", "in")]));
        assert!(matches("x", &[("x", "z")]));
        assert!(matches("!x", &[("y", "z")]));
        assert!(matches("x>1", &[("x", "2")]));
        assert!(matches("x<1", &[("x", "0")]));
        assert!(matches("x in (a,b)", &[("x", "b")]));
        assert!(matches("x notin (a,b)", &[("y", "b")]));
        assert!(matches("x in (a,)", &[("x", "")]));
        assert!(!matches("x=z", &[]));
        assert!(!matches("x=y", &[("x", "z")]));
        assert!(!matches("x=y,z=w", &[("x", "w"), ("z", "w")]));
        assert!(!matches("x!=y,z!=w", &[("x", "z"), ("z", "w")]));
        assert!(!matches("x", &[("y", "z")]));
        assert!(!matches("!x", &[("x", "z")]));
        assert!(!matches("x>1", &[("x", "0")]));
        assert!(!matches("x<1", &[("x", "2")]));
        assert!(!matches("x>1", &[("x", "abc")]));
        assert!(!matches("x notin (a,b)", &[("x", "a")]));
    }

    #[test]
    fn metav1_selector_expressions() {
        let sel: metav1::LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "legacy", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap_or_default();
        let s = from_metav1(&sel);
        assert!(
            s.as_ref()
                .is_ok_and(|s| s.matches(&set(&[("app", "web"), ("tier", "b")])))
        );
        assert!(s.as_ref().is_ok_and(|s| !s.matches(&set(&[
            ("app", "web"),
            ("tier", "b"),
            ("legacy", "1")
        ]))));
        assert!(
            s.as_ref()
                .is_ok_and(|s| !s.matches(&set(&[("app", "web")])))
        );
        assert!(from_metav1(&metav1::LabelSelector::default()).is_ok_and(|s| s.is_empty()));
        let bad: metav1::LabelSelector = serde_json::from_value(json!({
            "matchExpressions": [{"key": "a", "operator": "In", "values": []}]
        }))
        .unwrap_or_default();
        assert_eq!(
            from_metav1(&bad).err().map(|e| e.to_string()).as_deref(),
            Some(
                "values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty"
            )
        );
    }

    #[test]
    fn field_selector_parse_and_escapes() {
        let s = parse_field_selector(r"spec.nodeName=node-1,metadata.name!=a\,b\=c\\d");
        let reqs = s
            .as_ref()
            .map(|s| s.requirements().to_vec())
            .unwrap_or_default();
        assert_eq!(
            reqs,
            vec![
                (
                    "metadata.name".to_string(),
                    FieldOperator::NotEquals,
                    r"a,b=c\d".to_string()
                ),
                (
                    "spec.nodeName".to_string(),
                    FieldOperator::Equals,
                    "node-1".to_string()
                ),
            ]
        );
        assert_eq!(
            s.as_ref()
                .ok()
                .and_then(|s| s.required_value("spec.nodeName")),
            Some("node-1")
        );
        let err = |s: &str| parse_field_selector(s).err().map(|e| e.to_string());
        assert_eq!(
            err("a").as_deref(),
            Some("invalid selector: 'a'; can't understand 'a'")
        );
        assert_eq!(
            err(r"a=b\c").as_deref(),
            Some(r"invalid field selector: invalid escape sequence: \c")
        );
        assert_eq!(
            err("a=b=c").as_deref(),
            Some("invalid field selector: unescaped character in value: =")
        );
        assert_eq!(
            err(r"a=b\").as_deref(),
            Some(r"invalid field selector: invalid escape sequence: \")
        );
        assert!(parse_field_selector("").is_ok_and(|s| s.is_empty()));
        assert!(parse_field_selector("a==b").is_ok_and(|s| s.matches(|_| Some("b".into()))));
        assert!(parse_field_selector("a!=").is_ok_and(|s| !s.matches(|_| None)));
        assert_eq!(escape_field_value(r"a,b=c\d"), r"a\,b\=c\\d");
    }

    #[test]
    fn upstream_field_selector_tables() {
        for good in ["x=a,y=b,z=c", "", "x!=a,y=b", r"x=a||y\=b", r"x=a\=\=b"] {
            assert_eq!(
                parse_field_selector(good).map(|s| s.to_string()),
                Ok(good.to_string()),
                "{good}"
            );
        }
        for bad in [
            "x=a||y=b",
            "x==a==b",
            "x=a,b",
            "x in (a)",
            "x in (a,b,c)",
            "x",
        ] {
            assert!(parse_field_selector(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_field_selector("x=a,a=x").map(|s| s.to_string()),
            parse_field_selector("a=x,x=a").map(|s| s.to_string())
        );
        for (raw, escaped) in [
            ("", ""),
            ("a", "a"),
            ("=", r"\="),
            (",", r"\,"),
            ("\\", r"\\"),
            (r"\=\,\", r"\\\=\\\,\\"),
        ] {
            assert_eq!(escape_field_value(raw), escaped);
            assert_eq!(unescape_value(escaped).as_deref(), Ok(raw));
        }
        for invalid in ["\\", r"\\\", r"\a"] {
            assert!(unescape_value(invalid).is_err(), "{invalid}");
        }
        let fields: BTreeMap<String, String> =
            [("foo", "bar"), ("baz", "blah"), ("complex", r"=value\,\")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let m =
            |sel: &str| parse_field_selector(sel).map(|s| s.matches(|f| fields.get(f).cloned()));
        assert_eq!(m("foo=bar,baz=blah"), Ok(true));
        assert_eq!(m(r"foo=bar,baz=blah,complex=\=value\\\,\\"), Ok(true));
        assert_eq!(m("foo=bar,foobar=bar,baz=blah"), Ok(false));
        assert_eq!(m("x==y"), Ok(false));
    }

    #[test]
    fn field_values_per_kind() {
        let pod = Gvk::new("", "v1", "Pod");
        let obj = json!({"metadata": {"name": "p", "namespace": "ns"},
                         "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.5"}]}});
        let v = |g: &Gvk, o: &Value, f: &str| field_value(g, o, f).map_err(|e| e.to_string());
        assert_eq!(v(&pod, &obj, "spec.nodeName"), Ok(Some("n1".into())));
        assert_eq!(v(&pod, &obj, "spec.hostNetwork"), Ok(Some("false".into())));
        assert_eq!(v(&pod, &obj, "status.podIP"), Ok(Some("10.0.0.5".into())));
        assert_eq!(v(&pod, &obj, "spec.restartPolicy"), Ok(Some(String::new())));
        assert_eq!(
            v(&pod, &obj, "spec.containers"),
            Err("field label not supported: spec.containers".into())
        );
        let node = Gvk::new("", "v1", "Node");
        assert_eq!(
            v(
                &node,
                &json!({"spec": {"unschedulable": true}}),
                "spec.unschedulable"
            ),
            Ok(Some("true".into()))
        );
        assert_eq!(
            v(&node, &obj, "metadata.namespace"),
            Err("field label not supported: metadata.namespace".into())
        );
        let cm = Gvk::new("", "v1", "ConfigMap");
        assert_eq!(v(&cm, &obj, "metadata.namespace"), Ok(Some("ns".into())));
        assert_eq!(
            v(&cm, &obj, "data.x"),
            Err("\"data.x\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"".into())
        );
        let ev = Gvk::new("", "v1", "Event");
        let e = json!({"involvedObject": {"kind": "Pod", "name": "p"}, "source": {"component": "kubelet"}});
        assert_eq!(v(&ev, &e, "involvedObject.kind"), Ok(Some("Pod".into())));
        assert_eq!(v(&ev, &e, "source"), Ok(Some("kubelet".into())));
        let sel = parse_field_selector("spec.nodeName=n1,status.phase!=Failed");
        assert!(sel.is_ok_and(|s| s.matches_object(&pod, &obj) == Ok(true)));
    }
}
