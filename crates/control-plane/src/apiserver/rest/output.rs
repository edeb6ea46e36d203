//! Response shapes a client can ask for in `Accept`: the object itself, a `meta.k8s.io/v1`
//! Table (kubectl get) or PartialObjectMetadata (garbage collectors, kubectl delete).

use axum::http::{HeaderMap, header};
use serde_json::{Value, json};
use std::borrow::Cow;

use super::Req;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Object,
    Table(IncludeObject),
    Metadata,
}

/// Picks the first representation in `Accept` that we serve.
pub fn negotiate(headers: &HeaderMap, include: Option<&str>) -> Shape {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    for part in accept.split(',') {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        let media = params.first().copied().unwrap_or("");
        if !(media == "application/json" || media == "*/*" || media == "application/*") {
            continue;
        }
        let get = |k: &str| {
            params
                .iter()
                .find_map(|p| p.strip_prefix(k)?.strip_prefix('='))
        };
        match (get("as"), get("g")) {
            (None, _) => return Shape::Object,
            (Some("Table"), Some("meta.k8s.io")) => {
                let inc = match include {
                    Some("None") => IncludeObject::None,
                    Some("Object") => IncludeObject::Object,
                    _ => IncludeObject::Metadata,
                };
                return Shape::Table(inc);
            }
            (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io")) => {
                return Shape::Metadata;
            }
            _ => continue,
        }
    }
    Shape::Object
}

pub fn shape(req: &Req) -> Shape {
    negotiate(&req.headers, req.q("includeObject"))
}

fn partial(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
           "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))})
}

fn table(req: &Req, objs: &[Value], inc: IncludeObject) -> Value {
    let now = super::now_ts();
    let mut t = crate::apiserver::crd::table(&req.target, objs)
        .unwrap_or_else(|| nodus_k8s::printers::table(&req.target.gvk(), objs, now));
    if let Some(rows) = t.get_mut("rows").and_then(Value::as_array_mut) {
        for (row, obj) in rows.iter_mut().zip(objs) {
            if let Some(r) = row.as_object_mut() {
                match inc {
                    IncludeObject::None => {
                        r.remove("object");
                    }
                    IncludeObject::Metadata => {
                        r.insert("object".into(), partial(obj));
                    }
                    IncludeObject::Object => {
                        r.insert("object".into(), obj.clone());
                    }
                }
            }
        }
    }
    t
}

/// One object in the requested shape (the stored object itself when it is shown as
/// stored).
pub fn object<'a>(req: &Req, obj: &'a Value) -> Cow<'a, Value> {
    object_as(shape(req), req, obj)
}

/// [`object`] in a shape negotiated once, for a watch that renders many.
pub fn object_as<'a>(shape: Shape, req: &Req, obj: &'a Value) -> Cow<'a, Value> {
    let obj = super::convert::present(&req.target, obj);
    let shaped = match shape {
        Shape::Object => return obj,
        Shape::Metadata => partial(&obj),
        Shape::Table(inc) => {
            let mut t = table(req, std::slice::from_ref(obj.as_ref()), inc);
            if let Some(rv) = obj.pointer("/metadata/resourceVersion") {
                t["metadata"] = json!({"resourceVersion": rv});
            }
            t
        }
    };
    Cow::Owned(shaped)
}

/// A list in the requested shape; `meta` is the ListMeta (resourceVersion, continue, ...).
pub fn list(req: &Req, items: Vec<Value>, meta: Value) -> Value {
    let items: Vec<Value> = if super::convert::converts(&req.target) {
        items
            .iter()
            .map(|o| super::convert::present(&req.target, o).into_owned())
            .collect()
    } else {
        items
    };
    let info = req.target.info;
    match shape(req) {
        Shape::Object => {
            let api_version = if info.group.is_empty() {
                info.version.to_string()
            } else {
                format!("{}/{}", info.group, info.version)
            };
            json!({"kind": format!("{}List", info.kind), "apiVersion": api_version,
                   "metadata": meta, "items": items})
        }
        Shape::Metadata => {
            let items: Vec<Value> = items.iter().map(partial).collect();
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                   "metadata": meta, "items": items})
        }
        Shape::Table(inc) => {
            let mut t = table(req, &items, inc);
            t["metadata"] = meta;
            t
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_get_accept_header_asks_for_a_table() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
                .parse()
                .unwrap(),
        );
        assert_eq!(negotiate(&h, None), Shape::Table(IncludeObject::Metadata));
        h.insert(header::ACCEPT, "application/json".parse().unwrap());
        assert_eq!(negotiate(&h, None), Shape::Object);
        h.insert(header::ACCEPT, "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json".parse().unwrap());
        assert_eq!(negotiate(&h, None), Shape::Metadata);
    }
}
