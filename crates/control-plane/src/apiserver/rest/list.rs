//! GET of one object and of collections: selectors, pagination, resourceVersion.

use std::collections::BTreeMap;

use axum::response::Response;
use base64::Engine;
use nodus_k8s::selector::{self, FieldSelector, LabelSelector, SelectorError};
use nodus_k8s::{Gvk, status};
use serde_json::{Value, json};

use super::{ApiError, ApiResult, Req, json_response, output, store_error};

/// Label and field selectors of a request.
pub struct Filter {
    gvk: Gvk,
    /// Stored core Events seen through events.k8s.io: selectors apply to that form.
    events_v1: bool,
    label: Option<LabelSelector>,
    field: Option<FieldSelector>,
}

pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn selector_error(e: SelectorError) -> ApiError {
    ApiError(status::bad_request(&e.to_string()))
}

impl Filter {
    pub fn from_req(req: &Req) -> ApiResult<Filter> {
        let gvk = req.target.gvk();
        let label = match req.q("labelSelector") {
            Some(s) => Some(selector::parse_label_selector(s).map_err(selector_error)?),
            None => None,
        };
        let field = match req.q("fieldSelector") {
            Some(s) => {
                let f = selector::parse_field_selector(s).map_err(selector_error)?;
                for (name, _, _) in f.requirements() {
                    selector::field_value(&gvk, &json!({}), name).map_err(selector_error)?;
                }
                Some(f)
            }
            None => None,
        };
        let events_v1 = super::convert::is_events_v1(&req.target);
        Ok(Filter {
            gvk,
            events_v1,
            label,
            field,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.label.as_ref().is_none_or(LabelSelector::is_empty)
            && self.field.as_ref().is_none_or(FieldSelector::is_empty)
    }

    pub fn matches(&self, obj: &Value) -> bool {
        if self.events_v1 && self.field.is_some() {
            return self.matches_view(&super::convert::core_to_events(obj));
        }
        self.matches_view(obj)
    }

    fn matches_view(&self, obj: &Value) -> bool {
        if let Some(l) = &self.label
            && !l.matches(&labels_of(obj))
        {
            return false;
        }
        if let Some(f) = &self.field
            && !f.matches(|field| selector::field_value(&self.gvk, obj, field).ok().flatten())
        {
            return false;
        }
        true
    }
}

pub fn get(req: &Req) -> ApiResult<Response> {
    let name = req.target.name.clone().unwrap_or_default();
    let stored = req
        .st
        .store
        .get(&req.target.key_for(&name))
        .map_err(|e| store_error(&req.target, &name, e))?
        .ok_or_else(|| {
            ApiError(status::not_found(
                req.target.info.group,
                req.target.info.plural,
                &name,
            ))
        })?;
    Ok(json_response(
        200,
        &output::object(req, &stored.object),
        &[],
    ))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Continue {
    rv: u64,
    start: String,
}

pub fn list(req: &Req) -> ApiResult<Response> {
    let filter = Filter::from_req(req)?;
    let (items, rev) = req
        .st
        .store
        .list(&req.target.prefix())
        .map_err(|e| store_error(&req.target, "", e))?;
    let limit: usize = match req.q("limit") {
        Some(l) => l
            .parse::<i64>()
            .map_err(|_| ApiError(status::bad_request(&format!("invalid limit {l:?}"))))?
            .max(0) as usize,
        None => 0,
    };
    let (start, list_rev) = match req.q("continue") {
        Some(token) => {
            let c: Continue = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(token)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .ok_or_else(|| {
                    ApiError(status::bad_request(
                        "continue key is not valid: illegal base64 data",
                    ))
                })?;
            (Some(c.start), c.rv)
        }
        None => (None, rev),
    };
    let mut out = Vec::new();
    let mut last_key = None;
    let mut remaining = 0usize;
    for s in items
        .iter()
        .filter(|s| start.as_ref().is_none_or(|st| s.key.as_str() > st.as_str()))
    {
        if !filter.matches(&s.object) {
            continue;
        }
        if limit > 0 && out.len() >= limit {
            remaining += 1;
            continue;
        }
        out.push(s.object.clone());
        last_key = Some(s.key.clone());
    }
    let mut meta = json!({"resourceVersion": list_rev.to_string()});
    if remaining > 0
        && let Some(k) = last_key
    {
        let token = serde_json::to_vec(&Continue {
            rv: list_rev,
            start: k,
        })
        .unwrap_or_default();
        meta["continue"] = json!(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token));
        if filter.is_empty() {
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    if output::shape(req) == output::Shape::Object && !super::convert::converts(&req.target) {
        return Ok(plain_list(req, &out, &meta));
    }
    let out: Vec<Value> = out.iter().map(|o| (**o).clone()).collect();
    Ok(json_response(200, &output::list(req, out, meta), &[]))
}

/// A plain `<Kind>List` serialised straight from the stored objects (no copies: lists of
/// thousands of objects are the API server's largest responses).
fn plain_list(req: &Req, items: &[std::sync::Arc<Value>], meta: &Value) -> Response {
    let info = req.target.info;
    let mut buf = Vec::with_capacity(64 + items.len() * 1024);
    let head = json!({"kind": format!("{}List", info.kind), "apiVersion": req.target.gvk().api_version(), "metadata": meta});
    let head = serde_json::to_vec(&head).unwrap_or_default();
    // `{"apiVersion":..,"kind":..,"metadata":..}` minus its closing brace, then the items.
    buf.extend_from_slice(&head[..head.len().saturating_sub(1)]);
    buf.extend_from_slice(b",\"items\":[");
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        let _ = serde_json::to_writer(&mut buf, &**o);
    }
    buf.extend_from_slice(b"]}");
    let mut resp = Response::new(axum::body::Body::from(buf));
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    resp
}
