//! The API server's in-flight request limits (`--max-requests-inflight`,
//! `--max-mutating-requests-inflight`): a request beyond them gets 429 with `Retry-After: 1`
//! at once instead of queueing. Long-running requests (watches, exec, attach, port-forward,
//! logs, proxy) are not counted, nor are `system:masters`, as upstream's maxinflight filter.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::Semaphore;

use crate::apiserver::authn::User;
use crate::apiserver::rest;

/// The two pools of request slots.
pub(crate) struct InFlight {
    read_only: Option<Arc<Semaphore>>,
    mutating: Option<Arc<Semaphore>>,
}

impl InFlight {
    /// 0 means no limit, as upstream's flags.
    pub(crate) fn new(max_read_only: usize, max_mutating: usize) -> Arc<Self> {
        let pool = |n: usize| (n > 0).then(|| Arc::new(Semaphore::new(n)));
        Arc::new(InFlight {
            read_only: pool(max_read_only),
            mutating: pool(max_mutating),
        })
    }
}

/// Which pool a request draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    LongRunning,
    ReadOnly,
    Mutating,
}

pub(crate) fn kind(req: &Request) -> Kind {
    // The verb is read as the request-info filter reads it, so `watch=True` is a watch
    // here exactly when the handler treats it as one.
    let watch_query = nodus_serving::query::bool_value(
        nodus_serving::query::query_all(req.uri().query(), "watch")
            .first()
            .map(String::as_str),
    );
    if let rest::path::Parsed::Resource(t) = rest::path::parse(req.uri().path()) {
        let long_sub = t
            .sub
            .as_deref()
            .is_some_and(|s| matches!(s, "attach" | "exec" | "proxy" | "log" | "portforward"));
        if t.watch_path || watch_query || long_sub {
            return Kind::LongRunning;
        }
    }
    match *req.method() {
        Method::GET | Method::HEAD | Method::OPTIONS => Kind::ReadOnly,
        _ => Kind::Mutating,
    }
}

/// upstream's tooManyRequests: plain text, as Go's `http.Error` writes it.
fn too_many_requests() -> Response {
    let mut r = Response::new(Body::from("Too many requests, please try again later.\n"));
    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Runs after authentication, which put the [`User`] in the request.
pub(crate) async fn limit(
    State(limits): State<Arc<InFlight>>,
    req: Request,
    next: Next,
) -> Response {
    let privileged = req
        .extensions()
        .get::<User>()
        .is_some_and(|u| u.groups.iter().any(|g| g == "system:masters"));
    let pool = match kind(&req) {
        _ if privileged => None,
        Kind::LongRunning => None,
        Kind::ReadOnly => limits.read_only.as_ref(),
        Kind::Mutating => limits.mutating.as_ref(),
    };
    let _slot = match pool {
        None => None,
        Some(p) => match p.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => return too_many_requests(),
        },
    };
    // The slot is held until the handler has produced its response, as upstream's filter
    // holds it for the handler's duration.
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, uri: &str) -> Request {
        axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap()
    }

    #[test]
    fn watches_streams_and_proxies_are_long_running() {
        for uri in [
            "/api/v1/pods?watch=true",
            "/api/v1/namespaces/default/pods?watch=1&resourceVersion=3",
            "/api/v1/namespaces/default/pods?watch=True",
            "/api/v1/watch/namespaces/default/pods",
            "/api/v1/namespaces/default/pods/p/log?follow=true",
            "/api/v1/namespaces/default/pods/p/exec?command=ls",
            "/api/v1/namespaces/default/pods/p/portforward",
            "/api/v1/nodes/n/proxy/pods",
        ] {
            assert_eq!(kind(&req(Method::GET, uri)), Kind::LongRunning, "{uri}");
        }
        assert_eq!(kind(&req(Method::GET, "/api/v1/pods")), Kind::ReadOnly);
        assert_eq!(
            kind(&req(Method::GET, "/api/v1/pods?watch=False")),
            Kind::ReadOnly
        );
        assert_eq!(kind(&req(Method::GET, "/readyz")), Kind::ReadOnly);
        assert_eq!(
            kind(&req(Method::POST, "/api/v1/namespaces/default/configmaps")),
            Kind::Mutating
        );
        assert_eq!(
            kind(&req(Method::DELETE, "/api/v1/namespaces/default/pods/p")),
            Kind::Mutating
        );
    }
}
