//! Watch: a stream of `{"type", "object"}` lines from a resourceVersion, with selector
//! transitions, bookmarks, initial events and 410 Gone after compaction.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use nodus_k8s::status;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::list::Filter;
use super::output;
use super::{ApiError, ApiResult, Req};
use crate::storage::{Event, EventKind, StoreError};

/// One watch event on the wire; serialized from the object where it is, not a copy.
#[derive(serde::Serialize)]
struct WatchEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    object: &'a Value,
}

fn line(kind: &str, object: &Value) -> bytes::Bytes {
    let mut v = serde_json::to_vec(&WatchEvent { kind, object }).unwrap_or_default();
    v.push(b'\n');
    bytes::Bytes::from(v)
}

/// The event a watcher with `filter` sees for a store event, if any: MODIFIED becomes
/// ADDED when the object enters the selection and DELETED when it leaves it.
pub fn translate(
    filter: &Filter,
    name: Option<&str>,
    ev: &Event,
) -> Option<(&'static str, Arc<Value>)> {
    let in_scope =
        |o: &Value| name.is_none_or(|n| super::meta_str(o, "name") == Some(n)) && filter.matches(o);
    match ev.kind {
        EventKind::Added => in_scope(&ev.object).then(|| ("ADDED", ev.object.clone())),
        EventKind::Deleted => {
            let was = ev.prev.as_deref().unwrap_or(&ev.object);
            in_scope(was).then(|| ("DELETED", ev.object.clone()))
        }
        EventKind::Modified => {
            let now = in_scope(&ev.object);
            let before = ev.prev.as_deref().is_some_and(in_scope);
            match (before, now) {
                (true, true) => Some(("MODIFIED", ev.object.clone())),
                (false, true) => Some(("ADDED", ev.object.clone())),
                (true, false) => Some(("DELETED", ev.object.clone())),
                (false, false) => None,
            }
        }
    }
}

fn stream_response(rx: mpsc::Receiver<bytes::Bytes>) -> Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub async fn watch(req: Req) -> ApiResult<Response> {
    let filter = Filter::from_req(&req)?;
    let shape = output::shape(&req);
    let bookmarks = req.q_bool("allowWatchBookmarks");
    let send_initial = req.q_bool("sendInitialEvents");
    let rv = req.q("resourceVersion").map(str::to_string);
    let timeout = match req.q("timeoutSeconds") {
        Some(s) => Duration::from_secs(s.parse().map_err(|_| {
            ApiError(status::bad_request(&format!(
                "invalid timeoutSeconds {s:?}"
            )))
        })?),
        None => Duration::from_secs(1800 + rand::random_range(0..1800)),
    };
    let name = req.target.name.clone();
    let prefix = match &name {
        Some(n) => req.target.key_for(n),
        None => req.target.prefix(),
    };
    let store = req.st.store.clone();
    // With no resourceVersion (or "0") the watch starts with the current state as ADDED
    // events, as upstream's "get state and start at most recent".
    let wants_state = send_initial || rv.as_deref().is_none_or(|r| r == "0");
    let (initial, from) = if wants_state {
        let (items, rev) = store
            .list(&prefix)
            .map_err(|e| super::store_error(&req.target, "", e))?;
        (items, rev)
    } else {
        let r = rv.as_deref().unwrap_or("0");
        let from: u64 = r.parse().map_err(|_| {
            ApiError(status::bad_request(&format!(
                "invalid resourceVersion {r:?}"
            )))
        })?;
        (Vec::new(), from)
    };
    let (tx, out_rx) = mpsc::channel::<bytes::Bytes>(256);
    // Progress markers let a bookmark carry the store's revision past the watched
    // resource's last event, as upstream's cacher does (a quiet resource's watcher can
    // then resume after a compaction instead of listing again).
    let events = match store.watch_progress(&prefix, from) {
        Ok(rx) => rx,
        Err(StoreError::Compacted { requested, oldest }) => {
            let msg = format!("too old resource version: {requested} ({oldest})");
            let _ = tx.try_send(line("ERROR", &status::gone(&msg)));
            drop(tx);
            return Ok(stream_response(out_rx));
        }
        Err(e) => return Err(super::store_error(&req.target, "", e)),
    };
    let info = req.target.info;
    let api_version = req.target.gvk().api_version();
    let interval = req.st.config.bookmark_interval;
    tokio::spawn(async move {
        let mut events = events;
        let bookmark = |rv: u64, initial_end: bool| {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if initial_end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            line(
                "BOOKMARK",
                &json!({"kind": info.kind, "apiVersion": api_version, "metadata": meta}),
            )
        };
        for s in &initial {
            if name
                .as_deref()
                .is_none_or(|n| s.key.ends_with(&format!("/{n}")))
                && filter.matches(&s.object)
                && tx
                    .send(line("ADDED", &output::object_as(shape, &req, &s.object)))
                    .await
                    .is_err()
            {
                return;
            }
        }
        if send_initial && bookmarks && tx.send(bookmark(from, true)).await.is_err() {
            return;
        }
        let mut last = from;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = tx.closed() => return,
                _ = tick.tick(), if bookmarks => {
                    if tx.send(bookmark(last, false)).await.is_err() {
                        return;
                    }
                }
                ev = events.recv() => {
                    let Some(ev) = ev else { return };
                    last = last.max(ev.revision);
                    if ev.is_progress() {
                        continue;
                    }
                    if let Some((kind, obj)) = translate(&filter, name.as_deref(), &ev) {
                        req.st.metrics.watch_event(&req.target);
                        if tx.send(line(kind, &output::object_as(shape, &req, &obj))).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    Ok(stream_response(out_rx))
}
