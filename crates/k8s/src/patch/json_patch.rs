//! RFC 6902 JSON patch, with the error texts of the json-patch library the API server uses.

use serde_json::Value;

use super::PatchError;

fn err(msg: String) -> PatchError {
    PatchError::JsonPatch(msg)
}

/// Splits a JSON pointer into unescaped tokens (`~1` → `/`, `~0` → `~`).
fn tokens(path: &str) -> Result<Vec<String>, PatchError> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(err(format!("JSONPointer should start with '/': {path}")));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// The container holding the last token, and that token.
fn parent<'a>(doc: &'a mut Value, toks: &[String]) -> Option<(&'a mut Value, String)> {
    let (last, init) = toks.split_last()?;
    let mut cur = doc;
    for t in init {
        cur = match cur {
            Value::Object(m) => m.get_mut(t)?,
            Value::Array(a) => {
                let i = array_index(t, a.len(), false).ok()?;
                a.get_mut(i)?
            }
            _ => return None,
        };
    }
    match cur {
        Value::Object(_) | Value::Array(_) => Some((cur, last.clone())),
        _ => None,
    }
}

fn array_index(tok: &str, len: usize, for_add: bool) -> Result<usize, PatchError> {
    if for_add && tok == "-" {
        return Ok(len);
    }
    let valid_digits = !tok.is_empty()
        && tok.bytes().all(|b| b.is_ascii_digit())
        && (tok == "0" || !tok.starts_with('0'));
    let idx: usize = if valid_digits {
        tok.parse().map_err(|_| {
            err(format!(
                "Unable to access invalid index: {tok}: invalid index referenced"
            ))
        })?
    } else {
        return Err(err(format!(
            "Unable to access invalid index: {tok}: invalid index referenced"
        )));
    };
    let limit = if for_add { len } else { len.saturating_sub(1) };
    if idx > limit || (!for_add && len == 0) {
        return Err(err(format!(
            "Unable to access invalid index: {idx}: invalid index referenced"
        )));
    }
    Ok(idx)
}

fn get_at<'a>(doc: &'a Value, toks: &[String]) -> Option<&'a Value> {
    let mut cur = doc;
    for t in toks {
        cur = match cur {
            Value::Object(m) => m.get(t)?,
            Value::Array(a) => a.get(array_index(t, a.len(), false).ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let toks = tokens(path)?;
    if toks.is_empty() {
        *doc = value;
        return Ok(());
    }
    let Some((container, key)) = parent(doc, &toks) else {
        return Err(err(format!(
            "add operation does not apply: doc is missing path: \"{path}\": missing value"
        )));
    };
    match container {
        Value::Object(m) => {
            m.insert(key, value);
        }
        Value::Array(a) => {
            let i = array_index(&key, a.len(), true)
                .map_err(|e| err(format!("error in add for path: '{path}': {e}")))?;
            a.insert(i, value);
        }
        _ => {}
    }
    Ok(())
}

fn remove(doc: &mut Value, path: &str, op: &str) -> Result<Value, PatchError> {
    let toks = tokens(path)?;
    let Some((container, key)) = parent(doc, &toks) else {
        return Err(err(format!(
            "{op} operation does not apply: doc is missing path: \"{path}\": missing value"
        )));
    };
    match container {
        Value::Object(m) => m.remove(&key).ok_or_else(|| {
            err(format!(
                "error in remove for path: '{path}': Unable to remove nonexistent key: {key}: missing value"
            ))
        }),
        Value::Array(a) => {
            let i = array_index(&key, a.len(), false)
                .map_err(|e| err(format!("error in remove for path: '{path}': {e}")))?;
            Ok(a.remove(i))
        }
        _ => Err(err(format!("{op} operation does not apply: doc is missing path: \"{path}\": missing value"))),
    }
}

fn replace(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let toks = tokens(path)?;
    if toks.is_empty() {
        *doc = value;
        return Ok(());
    }
    let Some((container, key)) = parent(doc, &toks) else {
        return Err(err(format!(
            "replace operation does not apply: doc is missing path: {path}: missing value"
        )));
    };
    let slot = match container {
        Value::Object(m) => m.get_mut(&key),
        Value::Array(a) => match array_index(&key, a.len(), false) {
            Ok(i) => a.get_mut(i),
            Err(_) => None,
        },
        _ => None,
    };
    match slot {
        Some(s) => {
            *s = value;
            Ok(())
        }
        None => Err(err(format!(
            "replace operation does not apply: doc is missing key: {path}: missing value"
        ))),
    }
}

fn str_field<'a>(op: &'a Value, name: &str) -> Result<&'a str, PatchError> {
    op.get(name).and_then(Value::as_str).ok_or_else(|| {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        err(format!("{kind} operation failed to decode {name}"))
    })
}

fn value_field(op: &Value) -> Result<Value, PatchError> {
    op.get("value").cloned().ok_or_else(|| {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        err(format!("{kind} operation missing value"))
    })
}

/// Applies an RFC 6902 patch (an array of operations) in order; on error the target may be
/// partly patched, so callers apply it to a copy.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Array(ops) = patch else {
        return Err(PatchError::Invalid(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch".to_string(),
        ));
    };
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        match kind {
            "add" => add(target, str_field(op, "path")?, value_field(op)?)?,
            "remove" => {
                remove(target, str_field(op, "path")?, "remove")?;
            }
            "replace" => replace(target, str_field(op, "path")?, value_field(op)?)?,
            "move" => {
                let from = str_field(op, "from")?;
                let path = str_field(op, "path")?;
                if path != from && path.starts_with(&format!("{from}/")) {
                    return Err(err(format!(
                        "move operation does not apply: path {path} is a child of from {from}"
                    )));
                }
                let v = remove(target, from, "move").map_err(|_| {
                    err(format!("move operation does not apply: doc is missing from path: {from}: missing value"))
                })?;
                add(target, path, v).map_err(|_| {
                    err(format!(
                        "move operation does not apply: doc is missing destination path: {path}: missing value"
                    ))
                })?;
            }
            "copy" => {
                let from = str_field(op, "from")?;
                let path = str_field(op, "path")?;
                let v = get_at(target, &tokens(from)?).cloned().ok_or_else(|| {
                    err(format!("copy operation does not apply: doc is missing from path: \"{from}\": missing value"))
                })?;
                add(target, path, v)?;
            }
            "test" => {
                let path = str_field(op, "path")?;
                let want = op.get("value").cloned().unwrap_or(Value::Null);
                let have = get_at(target, &tokens(path)?)
                    .cloned()
                    .unwrap_or(Value::Null);
                if !json_equal(&have, &want) {
                    return Err(err(format!("testing value {path} failed: test failed")));
                }
            }
            other => {
                return Err(err(format!(
                    "Unexpected kind: {other}: unknown object type"
                )));
            }
        }
    }
    Ok(())
}

/// JSON equality where 1 and 1.0 are the same number (Go decodes both to float64).
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apply(doc: Value, patch: Value) -> Result<Value, String> {
        let mut d = doc;
        json_patch(&mut d, &patch)
            .map(|_| d)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn rfc6902_operations() {
        let doc = json!({"foo": "bar", "list": [1, 2, 3], "a/b": 1, "m~n": 2});
        assert_eq!(
            apply(
                doc.clone(),
                json!([{"op": "add", "path": "/baz", "value": "qux"}])
            )
            .map(|d| d["baz"].clone()),
            Ok(json!("qux"))
        );
        assert_eq!(
            apply(
                doc.clone(),
                json!([{"op": "add", "path": "/list/1", "value": 9}])
            )
            .map(|d| d["list"].clone()),
            Ok(json!([1, 9, 2, 3]))
        );
        assert_eq!(
            apply(
                doc.clone(),
                json!([{"op": "add", "path": "/list/-", "value": 4}])
            )
            .map(|d| d["list"].clone()),
            Ok(json!([1, 2, 3, 4]))
        );
        assert_eq!(
            apply(doc.clone(), json!([{"op": "remove", "path": "/list/0"}]))
                .map(|d| d["list"].clone()),
            Ok(json!([2, 3]))
        );
        assert_eq!(
            apply(
                doc.clone(),
                json!([{"op": "replace", "path": "/a~1b", "value": 5}])
            )
            .map(|d| d["a/b"].clone()),
            Ok(json!(5))
        );
        assert_eq!(
            apply(doc.clone(), json!([{"op": "remove", "path": "/m~0n"}]))
                .map(|d| d.get("m~n").is_none()),
            Ok(true)
        );
        assert_eq!(
            apply(
                doc.clone(),
                json!([{"op": "move", "from": "/foo", "path": "/moved"}])
            )
            .map(|d| (d.get("foo").is_none(), d["moved"].clone())),
            Ok((true, json!("bar")))
        );
        assert_eq!(
            apply(
                doc.clone(),
                json!([{"op": "copy", "from": "/list", "path": "/copy"}])
            )
            .map(|d| d["copy"].clone()),
            Ok(json!([1, 2, 3]))
        );
        assert!(
            apply(
                doc.clone(),
                json!([{"op": "test", "path": "/list/0", "value": 1.0}])
            )
            .is_ok()
        );
    }

    #[test]
    fn upstream_error_texts() {
        let doc = json!({"spec": {"replicas": 1}, "l": []});
        assert_eq!(
            apply(
                doc.clone(),
                json!([{"op": "test", "path": "/spec/replicas", "value": 2}])
            ),
            Err("testing value /spec/replicas failed: test failed".into())
        );
        assert_eq!(
            apply(
                doc.clone(),
                json!([{"op": "add", "path": "/missing/x", "value": 2}])
            ),
            Err(
                "add operation does not apply: doc is missing path: \"/missing/x\": missing value"
                    .into()
            )
        );
        assert_eq!(
            apply(doc.clone(), json!([{"op": "remove", "path": "/spec/nope"}])),
            Err("error in remove for path: '/spec/nope': Unable to remove nonexistent key: nope: missing value".into())
        );
        assert_eq!(
            apply(
                doc.clone(),
                json!([{"op": "replace", "path": "/spec/nope", "value": 1}])
            ),
            Err(
                "replace operation does not apply: doc is missing key: /spec/nope: missing value"
                    .into()
            )
        );
        assert_eq!(
            apply(doc.clone(), json!([{"op": "add", "path": "/l/3", "value": 1}])),
            Err("error in add for path: '/l/3': Unable to access invalid index: 3: invalid index referenced".into())
        );
        assert_eq!(
            apply(doc.clone(), json!([{"op": "frob", "path": "/l"}])),
            Err("Unexpected kind: frob: unknown object type".into())
        );
        assert!(apply(doc, json!({"op": "add"})).is_err());
    }
}
