//! `metav1.Status` bodies exactly as the API server returns them.
//!
//! Every builder returns the full Status object as JSON; the HTTP status code to send is the
//! body's `code` field, which [`code`] reads back (a Status always carries it).

use serde_json::{Map, Value, json};

use crate::validation::{FieldError, aggregate_messages};

/// The HTTP status code carried by a Status body (500 if it has none).
pub fn code(status: &Value) -> u16 {
    status
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .unwrap_or(500)
}

/// `pods` for the core group, `deployments.apps` otherwise (upstream GroupResource.String()).
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

fn failure(code: u16, reason: &str, message: String, details: Option<Value>) -> Value {
    let mut m = Map::new();
    m.insert("kind".into(), json!("Status"));
    m.insert("apiVersion".into(), json!("v1"));
    m.insert("metadata".into(), json!({}));
    m.insert("status".into(), json!("Failure"));
    m.insert("message".into(), json!(message));
    if !reason.is_empty() {
        m.insert("reason".into(), json!(reason));
    }
    if let Some(d) = details {
        m.insert("details".into(), d);
    }
    m.insert("code".into(), json!(code));
    Value::Object(m)
}

/// Details with upstream's omitempty fields.
fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    if !kind.is_empty() {
        d.insert("kind".into(), json!(kind));
    }
    Value::Object(d)
}

/// 404 `pods "foo" not found`.
pub fn not_found(group: &str, plural_or_resource: &str, name: &str) -> Value {
    let message = format!(
        "{} {} not found",
        qualified(group, plural_or_resource),
        go_quote(name)
    );
    failure(
        404,
        "NotFound",
        message,
        Some(details(name, group, plural_or_resource)),
    )
}

/// 409 `pods "foo" already exists`.
pub fn already_exists(group: &str, resource: &str, name: &str) -> Value {
    let message = format!(
        "{} {} already exists",
        qualified(group, resource),
        go_quote(name)
    );
    failure(
        409,
        "AlreadyExists",
        message,
        Some(details(name, group, resource)),
    )
}

/// Upstream's optimistic-concurrency failure text.
pub const CONFLICT_MODIFIED: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// 409 `Operation cannot be fulfilled on pods "foo": the object has been modified; ...`.
pub fn conflict(group: &str, resource: &str, name: &str) -> Value {
    conflict_with(group, resource, name, CONFLICT_MODIFIED)
}

/// 409 Conflict with a custom cause (e.g. a precondition's uid mismatch).
pub fn conflict_with(group: &str, resource: &str, name: &str, cause: &str) -> Value {
    let message = format!(
        "Operation cannot be fulfilled on {} {}: {cause}",
        qualified(group, resource),
        go_quote(name)
    );
    failure(
        409,
        "Conflict",
        message,
        Some(details(name, group, resource)),
    )
}

/// 422 Invalid. `kind` is the qualified kind as upstream prints it: `Pod`, or
/// `Deployment.apps` for a named group (the group then goes to `details.group`). A bare kind
/// of a named group in the catalogue (`Deployment`) is qualified from the catalogue; core
/// kinds win when both have the name (`Event`).
pub fn invalid(kind: &str, name: &str, errs: &[FieldError]) -> Value {
    let qualified_kind = match kind.split_once('.') {
        Some(_) => kind.to_string(),
        None => match crate::catalog::served()
            .into_iter()
            .find(|r| r.kind == kind)
        {
            Some(r) if !r.group.is_empty() => format!("{kind}.{}", r.group),
            _ => kind.to_string(),
        },
    };
    let kind = qualified_kind.as_str();
    let (bare_kind, group) = kind.split_once('.').unwrap_or((kind, ""));
    let causes: Vec<Value> = errs
        .iter()
        .map(|e| {
            // StatusCause fields are all omitempty upstream.
            let mut c = Map::new();
            c.insert("reason".into(), json!(e.kind.reason()));
            let body = e.body();
            if !body.is_empty() {
                c.insert("message".into(), json!(body));
            }
            if !e.field.is_empty() {
                c.insert("field".into(), json!(e.field));
            }
            Value::Object(c)
        })
        .collect();
    let message = match aggregate_messages(errs) {
        Some(agg) => format!("{kind} {} is invalid: {agg}", go_quote(name)),
        None => format!("{kind} {} is invalid", go_quote(name)),
    };
    let mut d = details(name, group, bare_kind);
    if let Value::Object(m) = &mut d {
        m.insert("causes".into(), Value::Array(causes));
    }
    failure(422, "Invalid", message, Some(d))
}

/// 400 BadRequest with the given message.
pub fn bad_request(msg: &str) -> Value {
    failure(400, "BadRequest", msg.to_string(), None)
}

/// 403 with the authorizer's message, e.g.
/// `pods "x" is forbidden: User "alice" cannot get resource "pods" in API group "" in the namespace "default"`.
/// `resource` may carry a subresource (`pods/log`); `reason` is appended after `: ` when set.
pub fn forbidden(
    user: &str,
    verb: &str,
    resource: &str,
    group: &str,
    name: &str,
    namespace: &str,
    reason: &str,
) -> Value {
    let scope = if namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {}", go_quote(namespace))
    };
    let mut cause = format!(
        "User {} cannot {verb} resource {} in API group {} {scope}",
        go_quote(user),
        go_quote(resource),
        go_quote(group)
    );
    if !reason.is_empty() {
        cause.push_str(": ");
        cause.push_str(reason);
    }
    let base_resource = resource.split('/').next().unwrap_or(resource);
    forbidden_with(group, base_resource, name, &cause)
}

/// 403 with any cause: `<resource> "<name>" is forbidden: <cause>` (upstream NewForbidden).
pub fn forbidden_with(group: &str, resource: &str, name: &str, cause: &str) -> Value {
    let message = if resource.is_empty() {
        format!("forbidden: {cause}")
    } else if name.is_empty() {
        format!("{} is forbidden: {cause}", qualified(group, resource))
    } else {
        format!(
            "{} {} is forbidden: {cause}",
            qualified(group, resource),
            go_quote(name)
        )
    };
    failure(
        403,
        "Forbidden",
        message,
        Some(details(name, group, resource)),
    )
}

/// 401 `Unauthorized`.
pub fn unauthorized() -> Value {
    failure(401, "Unauthorized", "Unauthorized".to_string(), None)
}

/// 405: `<action> is not supported on resources of kind "<resource>"`.
pub fn method_not_allowed(group: &str, resource: &str, action: &str) -> Value {
    let message = format!(
        "{action} is not supported on resources of kind {}",
        go_quote(&qualified(group, resource))
    );
    failure(
        405,
        "MethodNotAllowed",
        message,
        Some(details("", group, resource)),
    )
}

/// 410 with reason Expired (a watch or list from a compacted resourceVersion).
pub fn gone(msg: &str) -> Value {
    failure(410, "Expired", msg.to_string(), None)
}

/// 503 ServiceUnavailable (the storage cannot be reached).
pub fn service_unavailable(msg: &str) -> Value {
    failure(503, "ServiceUnavailable", msg.to_string(), None)
}

/// 504 `Timeout: <msg>`, as upstream's NewTimeoutError.
pub fn timeout(msg: &str) -> Value {
    failure(504, "Timeout", format!("Timeout: {msg}"), None)
}

/// 415 UnsupportedMediaType.
pub fn unsupported_media_type(msg: &str) -> Value {
    failure(415, "UnsupportedMediaType", msg.to_string(), None)
}

/// 500 `Internal error occurred: <msg>`.
pub fn internal(msg: &str) -> Value {
    let d = json!({"causes": [{"message": msg}]});
    failure(
        500,
        "InternalError",
        format!("Internal error occurred: {msg}"),
        Some(d),
    )
}

/// 429 TooManyRequests with `details.retryAfterSeconds`.
pub fn too_many_requests(msg: &str, retry_after_seconds: u32) -> Value {
    let d = json!({"retryAfterSeconds": retry_after_seconds});
    failure(429, "TooManyRequests", msg.to_string(), Some(d))
}

/// 200 Success with no details.
pub fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200})
}

/// 200 Success as a DELETE returns it when the storage gives no object back.
pub fn success_deleted(name: &str, group: &str, kind: &str, uid: &str) -> Value {
    let mut d = details(name, group, kind);
    if let (Value::Object(m), false) = (&mut d, uid.is_empty()) {
        m.insert("uid".into(), json!(uid));
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
           "details": d, "code": 200})
}

/// 409 for a server-side apply that conflicts with other managers' fields (upstream's
/// NewApplyConflict: no name or kind in details, one cause per field).
pub fn apply_conflict(conflicts: &crate::managedfields::Conflicts) -> Value {
    let d = json!({"causes": conflicts.causes()});
    failure(409, "Conflict", conflicts.message(), Some(d))
}

/// Go's `%q` for the strings we meet (names, users): escapes quotes, backslashes, controls.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::FieldError;

    #[test]
    fn not_found_and_friends() {
        let s = not_found("", "pods", "foo");
        assert_eq!(
            s,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "pods \"foo\" not found", "reason": "NotFound",
                   "details": {"name": "foo", "kind": "pods"}, "code": 404})
        );
        assert_eq!(code(&s), 404);
        let s = not_found("apps", "deployments", "web");
        assert_eq!(s["message"], "deployments.apps \"web\" not found");
        assert_eq!(s["details"]["group"], "apps");
        assert_eq!(
            already_exists("", "pods", "foo")["message"],
            "pods \"foo\" already exists"
        );
        assert_eq!(
            conflict("", "pods", "foo")["message"],
            "Operation cannot be fulfilled on pods \"foo\": the object has been modified; please apply your changes to the latest version and try again"
        );
        assert_eq!(code(&conflict("", "pods", "foo")), 409);
    }

    #[test]
    fn invalid_aggregates_like_upstream() {
        let one = [FieldError::required("spec.containers[0].name", "")];
        let s = invalid("Pod", "foo", &one);
        assert_eq!(
            s["message"],
            "Pod \"foo\" is invalid: spec.containers[0].name: Required value"
        );
        assert_eq!(s["code"], 422);
        assert_eq!(
            s["details"],
            json!({"name": "foo", "kind": "Pod", "causes": [
                {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers[0].name"}]})
        );
        let two = [
            FieldError::required("spec.containers[0].name", ""),
            FieldError::not_supported(
                "spec.restartPolicy",
                json!("Sometimes"),
                &["Always", "Never", "OnFailure"],
            ),
            FieldError::required("spec.containers[0].name", ""),
        ];
        let whole = invalid("ConfigMap", "c", &[FieldError::too_long("", 1_048_576)]);
        assert_eq!(
            whole["details"]["causes"],
            json!([{"reason": "FieldValueTooLong", "message": "Too long: may not be more than 1048576 bytes"}])
        );
        assert_eq!(
            whole["message"],
            "ConfigMap \"c\" is invalid: : Too long: may not be more than 1048576 bytes"
        );
        assert_eq!(
            invalid("Pod", "foo", &two)["message"],
            "Pod \"foo\" is invalid: [spec.containers[0].name: Required value, spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"Never\", \"OnFailure\"]"
        );
        let d = invalid("Deployment", "web", &one);
        assert_eq!(
            d["message"],
            "Deployment.apps \"web\" is invalid: spec.containers[0].name: Required value"
        );
        assert_eq!(
            (
                d["details"]["kind"].as_str(),
                d["details"]["group"].as_str()
            ),
            (Some("Deployment"), Some("apps"))
        );
    }

    #[test]
    fn forbidden_messages() {
        let s = forbidden("alice", "get", "pods", "", "x", "default", "");
        assert_eq!(
            s["message"],
            "pods \"x\" is forbidden: User \"alice\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        assert_eq!(code(&s), 403);
        let s = forbidden("bob", "list", "nodes", "", "", "", "");
        assert_eq!(
            s["message"],
            "nodes is forbidden: User \"bob\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        );
        let s = forbidden(
            "bob",
            "get",
            "pods/log",
            "",
            "p",
            "ns",
            "no RBAC policy matched",
        );
        assert_eq!(
            s["message"],
            "pods \"p\" is forbidden: User \"bob\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"ns\": no RBAC policy matched"
        );
    }

    #[test]
    fn simple_statuses() {
        assert_eq!(
            unauthorized(),
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
        );
        assert_eq!(code(&bad_request("x")), 400);
        assert_eq!(gone("too old resource version: 1 (5)")["reason"], "Expired");
        assert_eq!(code(&unsupported_media_type("x")), 415);
        assert_eq!(internal("boom")["message"], "Internal error occurred: boom");
        assert_eq!(
            too_many_requests("slow down", 1)["details"]["retryAfterSeconds"],
            1
        );
        assert_eq!(
            method_not_allowed("", "bindings", "list")["message"],
            "list is not supported on resources of kind \"bindings\""
        );
        assert_eq!(success()["status"], "Success");
        assert_eq!(
            success_deleted("p", "", "pods", "u1")["details"],
            json!({"name": "p", "kind": "pods", "uid": "u1"})
        );
        assert_eq!(go_quote("a\"b"), "\"a\\\"b\"");
    }
}
