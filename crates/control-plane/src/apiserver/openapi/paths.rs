//! The `paths` of a group-version's OpenAPI v3 document: one operation per served verb, named
//! and parameterised as upstream does. kubectl decides whether the server validates fields
//! (`--validate=strict` → `fieldValidation=Strict`) by finding the `fieldValidation`
//! parameter on the PATCH operation tagged with the kind's `x-kubernetes-group-version-kind`.

use nodus_k8s::catalog::ResourceInfo;
use serde_json::{Map, Value, json};

use super::schemas::{DELETE_OPTIONS, PATCH, REF_PREFIX, STATUS, WATCH_EVENT};

/// Where the schema of a subresource's body comes from.
pub(crate) struct SubresourceBody {
    pub name: &'static str,
    /// Component schema name of the body the subresource takes and returns.
    pub schema: String,
    pub group: &'static str,
    pub version: &'static str,
    pub kind: String,
    pub verbs: &'static [&'static str],
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("{REF_PREFIX}{name}")})
}

fn query(name: &str, description: &str, schema: Value) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": schema})
}

fn string_query(name: &str, description: &str) -> Value {
    query(
        name,
        description,
        json!({"type": "string", "uniqueItems": true}),
    )
}

fn path_param(name: &str, description: &str) -> Value {
    json!({
        "name": name,
        "in": "path",
        "description": description,
        "required": true,
        "schema": {"type": "string", "uniqueItems": true},
    })
}

fn pretty() -> Value {
    string_query(
        "pretty",
        "If 'true', then the output is pretty printed. Defaults to 'false' unless the user-agent indicates a browser or command-line HTTP tool (curl and wget).",
    )
}

fn dry_run() -> Value {
    string_query(
        "dryRun",
        "When present, indicates that modifications should not be persisted. An invalid or unrecognized dryRun directive will result in an error response and no further processing of the request. Valid values are: - All: all dry run stages will be processed",
    )
}

fn field_manager() -> Value {
    string_query(
        "fieldManager",
        "fieldManager is a name associated with the actor or entity that is making these changes. The value must be less than or 128 characters long, and only contain printable characters, as defined by https://golang.org/pkg/unicode/#IsPrint.",
    )
}

fn field_validation() -> Value {
    string_query(
        "fieldValidation",
        "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore: This will ignore any unknown fields that are silently dropped from the object, and will ignore all but the last duplicate field that the decoder encounters. This is the default behavior prior to v1.23. - Warn: This will send a warning via the standard warning response header for each unknown field that is dropped from the object, and for each duplicate field that is encountered. The request will still succeed if there are no other errors, and will only persist the last of any duplicate fields. This is the default in v1.23+ - Strict: This will fail the request with a BadRequest error if any unknown fields would be dropped from the object, or if any duplicate fields are present. The error returned from the server will contain all unknown and duplicate fields encountered.",
    )
}

fn force() -> Value {
    query(
        "force",
        "Force is going to \"force\" Apply requests. It means user will re-acquire conflicting fields owned by other people. Force flag must be unset for non-apply patch requests.",
        json!({"type": "boolean", "uniqueItems": true}),
    )
}

fn list_params() -> Vec<Value> {
    let int = json!({"type": "integer", "uniqueItems": true});
    let boolean = json!({"type": "boolean", "uniqueItems": true});
    vec![
        query(
            "allowWatchBookmarks",
            "allowWatchBookmarks requests watch events with type \"BOOKMARK\". Servers that do not implement bookmarks may ignore this flag and bookmarks are sent at the server's discretion. Clients should not assume bookmarks are returned at any specific interval, nor may they assume the server will send any BOOKMARK event during a session. If this is not a watch, this field is ignored.",
            boolean.clone(),
        ),
        string_query(
            "continue",
            "The continue option should be set when retrieving more results from the server. Since this value is server defined, clients may only use the continue value from a previous query result with identical query parameters (except for the value of continue) and the server may reject a continue value it does not recognize.",
        ),
        string_query(
            "fieldSelector",
            "A selector to restrict the list of returned objects by their fields. Defaults to everything.",
        ),
        string_query(
            "labelSelector",
            "A selector to restrict the list of returned objects by their labels. Defaults to everything.",
        ),
        query(
            "limit",
            "limit is a maximum number of responses to return for a list call. If more items exist, the server will set the `continue` field on the list metadata to a value that can be used with the same initial query to retrieve the next set of results.",
            int.clone(),
        ),
        string_query(
            "resourceVersion",
            "resourceVersion sets a constraint on what resource versions a request may be served from. See https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions for details.\n\nDefaults to unset",
        ),
        string_query(
            "resourceVersionMatch",
            "resourceVersionMatch determines how resourceVersion is applied to list calls. It is highly recommended that resourceVersionMatch be set for list calls where resourceVersion is set See https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions for details.\n\nDefaults to unset",
        ),
        query(
            "sendInitialEvents",
            "`sendInitialEvents=true` may be set together with `watch=true`. In that case, the watch stream will begin with synthetic events to produce the current state of objects in the collection. Once all such events have been sent, a synthetic \"Bookmark\" event  will be sent.",
            boolean.clone(),
        ),
        query(
            "timeoutSeconds",
            "Timeout for the list/watch call. This limits the duration of the call, regardless of any activity or inactivity.",
            int,
        ),
        query(
            "watch",
            "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications. Specify resourceVersion.",
            boolean,
        ),
    ]
}

fn delete_params() -> Vec<Value> {
    let int = json!({"type": "integer", "uniqueItems": true});
    vec![
        dry_run(),
        query(
            "gracePeriodSeconds",
            "The duration in seconds before the object should be deleted. Value must be non-negative integer. The value zero indicates delete immediately. If this value is nil, the default grace period for the specified type will be used. Defaults to a per object value if not specified. zero means delete immediately.",
            int,
        ),
        query(
            "ignoreStoreReadErrorWithClusterBreakingPotential",
            "if set to true, it will trigger an unsafe deletion of the resource in case the normal deletion flow fails with a corrupt object error.",
            json!({"type": "boolean", "uniqueItems": true}),
        ),
        query(
            "orphanDependents",
            "Deprecated: please use the PropagationPolicy, this field will be deprecated in 1.7. Should the dependent objects be orphaned. If true/false, the \"orphan\" finalizer will be added to/removed from the object's finalizers list. Either this field or PropagationPolicy may be set, but not both.",
            json!({"type": "boolean", "uniqueItems": true}),
        ),
        string_query(
            "propagationPolicy",
            "Whether and how garbage collection will be performed. Either this field or OrphanDependents may be set, but not both. The default policy is decided by the existing finalizer set in the metadata.finalizers and the resource-specific default policy. Acceptable values are: 'Orphan' - orphan the dependents; 'Background' - allow the garbage collector to delete the dependents in the background; 'Foreground' - a cascading policy that deletes all dependents in the foreground.",
        ),
    ]
}

const MEDIA_TYPES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];

fn content(schema: &Value, media: &[&str]) -> Value {
    Value::Object(
        media
            .iter()
            .map(|m| ((*m).to_string(), json!({"schema": schema})))
            .collect(),
    )
}

fn response(description: &str, schema: &Value) -> Value {
    json!({"description": description, "content": content(schema, MEDIA_TYPES)})
}

/// Names used in operation ids and tags: `coordination.k8s.io` → `Coordination`/`coordination`.
fn group_words(group: &str) -> Vec<String> {
    if group.is_empty() {
        return vec!["core".to_string()];
    }
    let trimmed = group.strip_suffix(".k8s.io").unwrap_or(group);
    trimmed.split('.').map(str::to_string).collect()
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// Upstream's tag of a group-version, e.g. `core_v1`, `rbacAuthorization_v1`.
pub(crate) fn tag(group: &str, version: &str) -> String {
    let words = group_words(group);
    let mut out = String::new();
    for (i, w) in words.iter().enumerate() {
        if i == 0 {
            out.push_str(w);
        } else {
            out.push_str(&capitalise(w));
        }
    }
    format!("{out}_{version}")
}

fn operation_id(verb: &str, group: &str, version: &str, scope: &str, kind: &str) -> String {
    let words: String = group_words(group).iter().map(|w| capitalise(w)).collect();
    format!("{verb}{words}{}{scope}{kind}", capitalise(version))
}

/// Everything an operation needs to know about the kind it serves.
struct OpContext {
    tag: String,
}

#[allow(clippy::too_many_arguments)]
fn operation(
    ctx: &OpContext,
    action: &str,
    description: String,
    op_id: String,
    parameters: Vec<Value>,
    request: Option<Value>,
    responses: Map<String, Value>,
    gvk: (&str, &str, &str),
) -> Value {
    let mut op = Map::new();
    op.insert("tags".into(), json!([ctx.tag]));
    op.insert("description".into(), json!(description));
    op.insert("operationId".into(), json!(op_id));
    if !parameters.is_empty() {
        op.insert("parameters".into(), Value::Array(parameters));
    }
    if let Some(body) = request {
        op.insert("requestBody".into(), body);
    }
    let mut responses = responses;
    responses.insert("401".into(), json!({"description": "Unauthorized"}));
    op.insert("responses".into(), Value::Object(responses));
    op.insert("x-kubernetes-action".into(), json!(action));
    op.insert(
        "x-kubernetes-group-version-kind".into(),
        json!({"group": gvk.0, "kind": gvk.2, "version": gvk.1}),
    );
    Value::Object(op)
}

fn body(schema: &Value) -> Value {
    json!({"content": {"*/*": {"schema": schema}}, "required": true})
}

/// A PATCH request body. Custom resources take no strategic merge patch, and kubectl
/// reads its absence here to send them a JSON merge patch on `apply`.
fn patch_body(r: &ResourceInfo) -> Value {
    let patch = schema_ref(PATCH);
    let mut content = json!({
        "application/apply-patch+yaml": {"schema": patch},
        "application/json-patch+json": {"schema": patch},
        "application/merge-patch+json": {"schema": patch},
    });
    if !r.custom {
        content["application/strategic-merge-patch+json"] = json!({"schema": patch});
    }
    json!({"content": content, "required": true})
}

fn responses(entries: &[(&str, &str, &Value)]) -> Map<String, Value> {
    entries
        .iter()
        .map(|(code, desc, schema)| ((*code).to_string(), response(desc, schema)))
        .collect()
}

/// Adds the operations of one catalogue resource (and its subresources) to `paths`.
pub(crate) fn add_resource(
    paths: &mut Map<String, Value>,
    r: &ResourceInfo,
    schema: &str,
    list_schema: Option<&str>,
    subresources: &[SubresourceBody],
) {
    let prefix = if r.group.is_empty() {
        format!("/api/{}", r.version)
    } else {
        format!("/apis/{}/{}", r.group, r.version)
    };
    let ctx = OpContext {
        tag: tag(r.group, r.version),
    };
    let gvk = (r.group, r.version, r.kind);
    let scope = if r.namespaced { "Namespaced" } else { "" };
    let collection = if r.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
    } else {
        format!("{prefix}/{}", r.plural)
    };
    let item = format!("{collection}/{{name}}");
    let has = |v: &str| r.verbs.contains(&v);
    let object = schema_ref(schema);
    let status = schema_ref(STATUS);
    let kind = r.kind;
    let name_param = path_param("name", &format!("name of the {kind}"));
    let ns_param = path_param(
        "namespace",
        "object name and auth scope, such as for teams and projects",
    );
    let mut scoped_params = vec![];
    if r.namespaced {
        scoped_params.push(ns_param.clone());
    }
    scoped_params.push(pretty());

    let mut coll = Map::new();
    if let (true, Some(list)) = (has("list"), list_schema) {
        let mut params = list_params();
        params.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        coll.insert(
            "get".into(),
            operation(
                &ctx,
                "list",
                format!("list or watch objects of kind {kind}"),
                operation_id("list", r.group, r.version, scope, kind),
                params,
                None,
                responses(&[("200", "OK", &schema_ref(list))]),
                gvk,
            ),
        );
    }
    if has("create") {
        coll.insert(
            "post".into(),
            operation(
                &ctx,
                "post",
                format!("create a {kind}"),
                operation_id("create", r.group, r.version, scope, kind),
                vec![dry_run(), field_manager(), field_validation()],
                Some(body(&object)),
                responses(&[
                    ("200", "OK", &object),
                    ("201", "Created", &object),
                    ("202", "Accepted", &object),
                ]),
                gvk,
            ),
        );
    }
    if has("deletecollection") {
        let mut params = list_params();
        params.extend(delete_params());
        params.retain(|p| p["name"] != "allowWatchBookmarks" && p["name"] != "watch");
        params.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        coll.insert(
            "delete".into(),
            operation(
                &ctx,
                "deletecollection",
                format!("delete collection of {kind}"),
                operation_id("deleteCollection", r.group, r.version, scope, kind),
                params,
                Some(body(&schema_ref(DELETE_OPTIONS))),
                responses(&[("200", "OK", &status)]),
                gvk,
            ),
        );
    }
    if !coll.is_empty() {
        coll.insert("parameters".into(), Value::Array(scoped_params.clone()));
        paths.insert(collection.clone(), Value::Object(coll));
    }

    let mut one = Map::new();
    if has("get") {
        one.insert(
            "get".into(),
            operation(
                &ctx,
                "get",
                format!("read the specified {kind}"),
                operation_id("read", r.group, r.version, scope, kind),
                Vec::new(),
                None,
                responses(&[("200", "OK", &object)]),
                gvk,
            ),
        );
    }
    if has("update") {
        one.insert(
            "put".into(),
            operation(
                &ctx,
                "put",
                format!("replace the specified {kind}"),
                operation_id("replace", r.group, r.version, scope, kind),
                vec![dry_run(), field_manager(), field_validation()],
                Some(body(&object)),
                responses(&[("200", "OK", &object), ("201", "Created", &object)]),
                gvk,
            ),
        );
    }
    if has("patch") {
        one.insert(
            "patch".into(),
            operation(
                &ctx,
                "patch",
                format!("partially update the specified {kind}"),
                operation_id("patch", r.group, r.version, scope, kind),
                vec![dry_run(), field_manager(), field_validation(), force()],
                Some(patch_body(r)),
                responses(&[("200", "OK", &object), ("201", "Created", &object)]),
                gvk,
            ),
        );
    }
    if has("delete") {
        let mut params = delete_params();
        params.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        one.insert(
            "delete".into(),
            operation(
                &ctx,
                "delete",
                format!("delete a {kind}"),
                operation_id("delete", r.group, r.version, scope, kind),
                params,
                Some(body(&schema_ref(DELETE_OPTIONS))),
                responses(&[("200", "OK", &status), ("202", "Accepted", &status)]),
                gvk,
            ),
        );
    }
    let mut item_params = vec![name_param.clone()];
    item_params.extend(scoped_params.iter().cloned());
    if !one.is_empty() {
        one.insert("parameters".into(), Value::Array(item_params.clone()));
        paths.insert(item.clone(), Value::Object(one));
    }

    if r.namespaced
        && has("list")
        && let Some(list) = list_schema
    {
        let mut params = list_params();
        params.push(pretty());
        params.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        let op = operation(
            &ctx,
            "list",
            format!("list or watch objects of kind {kind}"),
            operation_id(
                "list",
                r.group,
                r.version,
                "",
                &format!("{kind}ForAllNamespaces"),
            ),
            Vec::new(),
            None,
            responses(&[("200", "OK", &schema_ref(list))]),
            gvk,
        );
        paths.insert(
            format!("{prefix}/{}", r.plural),
            json!({"get": op, "parameters": params}),
        );
    }

    for sub in subresources {
        let sub_object = schema_ref(&sub.schema);
        let sub_gvk = (sub.group, sub.version, sub.kind.as_str());
        let suffix = capitalise(sub.name);
        let mut ops = Map::new();
        let sub_has = |v: &str| sub.verbs.contains(&v);
        if sub_has("get") {
            ops.insert(
                "get".into(),
                operation(
                    &ctx,
                    "get",
                    format!("read {} of the specified {kind}", sub.name),
                    operation_id(
                        "read",
                        r.group,
                        r.version,
                        scope,
                        &format!("{kind}{suffix}"),
                    ),
                    Vec::new(),
                    None,
                    responses(&[("200", "OK", &sub_object)]),
                    sub_gvk,
                ),
            );
        }
        if sub_has("update") {
            ops.insert(
                "put".into(),
                operation(
                    &ctx,
                    "put",
                    format!("replace {} of the specified {kind}", sub.name),
                    operation_id(
                        "replace",
                        r.group,
                        r.version,
                        scope,
                        &format!("{kind}{suffix}"),
                    ),
                    vec![dry_run(), field_manager(), field_validation()],
                    Some(body(&sub_object)),
                    responses(&[("200", "OK", &sub_object), ("201", "Created", &sub_object)]),
                    sub_gvk,
                ),
            );
        }
        if sub_has("patch") {
            ops.insert(
                "patch".into(),
                operation(
                    &ctx,
                    "patch",
                    format!("partially update {} of the specified {kind}", sub.name),
                    operation_id(
                        "patch",
                        r.group,
                        r.version,
                        scope,
                        &format!("{kind}{suffix}"),
                    ),
                    vec![dry_run(), field_manager(), field_validation(), force()],
                    Some(patch_body(r)),
                    responses(&[("200", "OK", &sub_object), ("201", "Created", &sub_object)]),
                    sub_gvk,
                ),
            );
        }
        if sub_has("create") {
            ops.insert(
                "post".into(),
                operation(
                    &ctx,
                    "post",
                    format!("create {} of a {kind}", sub.name),
                    operation_id(
                        "create",
                        r.group,
                        r.version,
                        scope,
                        &format!("{kind}{suffix}"),
                    ),
                    vec![dry_run(), field_manager(), field_validation()],
                    Some(body(&sub_object)),
                    responses(&[
                        ("200", "OK", &sub_object),
                        ("201", "Created", &sub_object),
                        ("202", "Accepted", &sub_object),
                    ]),
                    sub_gvk,
                ),
            );
        }
        if !ops.is_empty() {
            ops.insert("parameters".into(), Value::Array(item_params.clone()));
            paths.insert(format!("{item}/{}", sub.name), Value::Object(ops));
        }
    }
}

/// Schemas every group-version document carries because its operations refer to them.
pub(crate) fn common_schemas() -> [&'static str; 4] {
    [STATUS, DELETE_OPTIONS, PATCH, WATCH_EVENT]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_operation_ids_follow_upstream_naming() {
        assert_eq!(tag("", "v1"), "core_v1");
        assert_eq!(tag("apps", "v1"), "apps_v1");
        assert_eq!(
            tag("rbac.authorization.k8s.io", "v1"),
            "rbacAuthorization_v1"
        );
        assert_eq!(
            operation_id("list", "", "v1", "Namespaced", "Pod"),
            "listCoreV1NamespacedPod"
        );
        assert_eq!(
            operation_id("patch", "coordination.k8s.io", "v1", "Namespaced", "Lease"),
            "patchCoordinationV1NamespacedLease"
        );
        assert_eq!(
            operation_id("read", "scheduling.k8s.io", "v1", "", "PriorityClass"),
            "readSchedulingV1PriorityClass"
        );
    }
}
