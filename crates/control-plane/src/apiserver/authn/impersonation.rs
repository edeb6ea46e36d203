//! Impersonation (`kubectl --as`, `--as-group`, `--as-uid`): the `Impersonate-User`,
//! `Impersonate-Group`, `Impersonate-Uid` and `Impersonate-Extra-<key>` headers replace the
//! authenticated user when the authorizer allows its `impersonate` verb on each of them, as
//! upstream's impersonation filter does.

use axum::http::HeaderMap;
use serde_json::Value;

use super::User;
use crate::apiserver::authz::{self, Attributes, Request, ResourceAttrs};
use crate::apiserver::state::ApiState;

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA: &str = "impersonate-extra-";

/// The user the request acts as: `Ok(user)` unchanged without impersonation headers,
/// `Err(status)` (400 or 403) when the headers are malformed or not allowed.
pub fn impersonate(st: &ApiState, user: User, headers: &HeaderMap) -> Result<User, Value> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect()
    };
    let name = values(USER).into_iter().next();
    let groups = values(GROUP);
    let uid = values(UID).into_iter().next();
    let extras: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(k, v)| {
            let key = k.as_str().strip_prefix(EXTRA)?;
            Some((unescape(key), v.to_str().ok()?.to_string()))
        })
        .collect();
    let Some(name) = name else {
        if groups.is_empty() && uid.is_none() && extras.is_empty() {
            return Ok(user);
        }
        return Err(nodus_k8s::status::bad_request(
            "requested impersonation without impersonating a user",
        ));
    };
    // Each impersonated attribute is its own authorization check, in upstream's order.
    let sa = name
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'));
    let check = |attrs: ResourceAttrs<'_>| -> Result<(), Value> {
        let a = Attributes {
            verb: "impersonate",
            request: Request::Named(attrs),
            body: None,
            field_selector: None,
        };
        st.authz
            .authorize(&user, &a, st.store.as_ref())
            .map_err(|reason| authz::forbidden(&user, &a, &reason))
    };
    match sa {
        Some((ns, sa_name)) => check(ResourceAttrs {
            resource: "serviceaccounts",
            namespace: ns,
            name: sa_name,
            ..Default::default()
        })?,
        None => check(ResourceAttrs {
            resource: "users",
            name: &name,
            ..Default::default()
        })?,
    }
    for g in &groups {
        check(ResourceAttrs {
            resource: "groups",
            name: g,
            ..Default::default()
        })?;
    }
    if let Some(uid) = &uid {
        check(ResourceAttrs {
            group: "authentication.k8s.io",
            resource: "uids",
            name: uid,
            ..Default::default()
        })?;
    }
    for (key, value) in &extras {
        check(ResourceAttrs {
            group: "authentication.k8s.io",
            resource: "userextras",
            subresource: key,
            name: value,
            ..Default::default()
        })?;
    }
    let mut out_groups = groups.clone();
    if let Some((ns, _)) = sa
        && groups.is_empty()
    {
        out_groups = vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{ns}"),
        ];
    }
    let implied = if name == "system:anonymous" {
        "system:unauthenticated"
    } else {
        "system:authenticated"
    };
    if !out_groups.iter().any(|g| g == implied) {
        out_groups.push(implied.to_string());
    }
    Ok(User {
        name,
        groups: out_groups,
        ..Default::default()
    })
}

/// Extra keys are percent-encoded in header names (upstream's `Impersonate-Extra-` rule).
fn unescape(key: &str) -> String {
    let b = key.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&key[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
