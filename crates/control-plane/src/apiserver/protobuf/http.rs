//! The two places protobuf meets HTTP: a request body arriving as protobuf is turned into
//! the JSON body the REST handlers read, and a JSON response goes out as protobuf when the
//! client accepts nothing else.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;

use super::{PROTOBUF, ProtobufError, decode, encode, is_protobuf, requires_protobuf};

/// Largest JSON response re-encoded for a protobuf-only client; the REST layer's responses
/// are whole objects and lists already held in memory, so this only bounds a pathological
/// list.
const MAX_RESPONSE: usize = 256 << 20;

/// If the request's Content-Type is protobuf, decodes the body and rewrites the
/// Content-Type to JSON, so that every handler (create, update, scale, eviction, binding,
/// delete options) reads it as the JSON body upstream's JSON clients would have sent.
/// Other bodies pass through untouched.
pub fn request_to_json(headers: &mut HeaderMap, body: Bytes) -> Result<Bytes, ProtobufError> {
    let protobuf = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_protobuf);
    if !protobuf {
        return Ok(body);
    }
    let json = decode(&body)?;
    let bytes = serde_json::to_vec(&json).map_err(|e| ProtobufError::field("", e.to_string()))?;
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(Bytes::from(bytes))
}

/// Re-encodes a JSON response as protobuf when the request's Accept header allows protobuf
/// and not JSON. client-go always also accepts JSON (and decodes by the response's
/// Content-Type), so kubectl and the typed clients keep getting JSON. A body that has no
/// protobuf form (a Table, a kind outside the schemas) stays JSON.
pub async fn negotiate_response(accept: Option<&str>, resp: Response) -> Response {
    if !accept.is_some_and(requires_protobuf) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|m| m.trim() == "application/json")
        });
    // A watch is an endless JSON stream (its protobuf form is length-framed events, not
    // built): only whole bodies, whose size is known, are re-encoded.
    if !is_json
        || axum::body::HttpBody::size_hint(resp.body())
            .exact()
            .is_none()
    {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_RESPONSE).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let encoded = serde_json::from_slice(&bytes)
        .ok()
        .and_then(|v| encode(&v).ok());
    match encoded {
        Some(pb) => {
            parts
                .headers
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(pb))
        }
        None => Response::from_parts(parts, Body::from(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn protobuf_request_bodies_become_json() {
        let obj = json!({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "x"}, "data": {"a": "b"}});
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
        let body = Bytes::from(encode(&obj).expect("encodes"));
        let out = request_to_json(&mut headers, body).expect("decodes");
        assert_eq!(headers[header::CONTENT_TYPE], "application/json");
        let back: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(back, obj);

        let mut json_headers = HeaderMap::new();
        json_headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let raw = Bytes::from_static(b"{\"kind\":\"ConfigMap\"}");
        let same = request_to_json(&mut json_headers, raw.clone()).expect("passes");
        assert_eq!(same, raw);
    }

    #[tokio::test]
    async fn responses_are_protobuf_only_for_protobuf_only_clients() {
        let obj = json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "n"}, "spec": {}, "status": {"phase": "Active"}});
        let json_resp = || {
            let mut r = Response::new(Body::from(serde_json::to_vec(&obj).expect("json")));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        };
        let kept = negotiate_response(
            Some("application/vnd.kubernetes.protobuf,application/json"),
            json_resp(),
        )
        .await;
        assert_eq!(kept.headers()[header::CONTENT_TYPE], "application/json");

        let pb = negotiate_response(Some(PROTOBUF), json_resp()).await;
        assert_eq!(pb.headers()[header::CONTENT_TYPE], PROTOBUF);
        let bytes = axum::body::to_bytes(pb.into_body(), usize::MAX)
            .await
            .expect("body");
        assert_eq!(decode(&bytes).expect("decodes"), obj);

        let stream = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"{}"))]);
        let mut watch = Response::new(Body::from_stream(stream));
        watch.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let kept = negotiate_response(Some(PROTOBUF), watch).await;
        assert_eq!(kept.headers()[header::CONTENT_TYPE], "application/json");
    }
}
