//! batch/v1 Job and CronJob validation (upstream's `pkg/apis/batch/validation`): job specs,
//! their pod templates (restartPolicy OnFailure or Never), pod failure policies, what a Job
//! update may not change, and CronJob schedules and time zones.

use serde_json::{Value, json};

use super::common::{Errs, arr, enum_field, nonnegative, present, s, semantic, strmap};
use super::meta::validate_labels;
use super::pod::validate_pod_spec;
use super::{FieldError, Path};

const COMPLETION_MODES: &[&str] = &["NonIndexed", "Indexed"];
const RESTART_POLICIES: &[&str] = &["OnFailure", "Never"];
const FAILURE_ACTIONS: &[&str] = &["Count", "FailIndex", "FailJob", "Ignore"];
const REPLACEMENT_POLICIES: &[&str] = &["Failed", "TerminatingOrFailed"];
/// Upstream's `maxParallelismForIndexedJob`.
const MAX_INDEXED_PARALLELISM: i64 = 100_000;
/// Upstream's `maxFailedIndexesForIndexedJob`.
const MAX_FAILED_INDEXES: i64 = 100_000;
/// Upstream's `completionsSoftLimit`: above it, per-index back-off needs tighter limits.
const COMPLETIONS_SOFT_LIMIT: i64 = 100_000;
/// Upstream's `parallelismLimitForHighCompletions` and `maxFailedIndexesLimitForHighCompletions`.
const HIGH_COMPLETIONS_CAP: i64 = 10_000;
/// Upstream's `maxSuccessPolicyRule`.
const MAX_SUCCESS_POLICY_RULES: usize = 20;
/// Upstream's `maxJobSuccessPolicySucceededIndexesLimit`.
const MAX_SUCCEEDED_INDEXES_LEN: usize = 64 * 1024;
/// A CronJob's name plus `-<minutes since epoch>` must still be a DNS-1035 label.
const MAX_CRONJOB_NAME: usize = 52;

fn positive(errs: &mut Errs, path: Path, v: &Value, key: &str) {
    if let Some(n) = v.get(key).and_then(Value::as_i64)
        && n <= 0
    {
        errs.push(FieldError::invalid(
            path,
            json!(n),
            "must be greater than 0",
        ));
    }
}

fn selector_errors(errs: &mut Errs, sp: &Path, spec: &Value) {
    let Some(sel) = spec.get("selector").filter(|v| !v.is_null()) else {
        errs.push(FieldError::required(sp.child("selector"), ""));
        return;
    };
    let parsed: Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector, _> =
        serde_json::from_value(sel.clone());
    match parsed
        .map_err(|e| e.to_string())
        .and_then(|s| crate::selector::from_metav1(&s).map_err(|e| e.to_string()))
    {
        Err(e) => errs.push(FieldError::invalid(sp.child("selector"), sel.clone(), e)),
        Ok(selector) => {
            let labels = spec
                .pointer("/template/metadata/labels")
                .cloned()
                .unwrap_or_else(|| json!({}));
            if !selector.matches(&strmap(&json!({"l": labels}), "l")) {
                errs.push(FieldError::invalid(
                    sp.child("template").child("metadata").child("labels"),
                    labels,
                    "`selector` does not match template `labels`",
                ));
            }
        }
    }
}

fn pod_failure_policy(errs: &mut Errs, sp: &Path, spec: &Value) {
    let Some(pfp) = spec.get("podFailurePolicy").filter(|v| !v.is_null()) else {
        return;
    };
    let pp = sp.child("podFailurePolicy");
    if spec
        .pointer("/template/spec/restartPolicy")
        .and_then(Value::as_str)
        != Some("Never")
    {
        errs.push(FieldError::invalid(
            sp.child("template").child("spec").child("restartPolicy"),
            json!(s(
                spec.pointer("/template/spec").unwrap_or(&json!({})),
                "restartPolicy"
            )),
            "only \"Never\" is supported when podFailurePolicy is specified",
        ));
    }
    for (i, rule) in arr(pfp, "rules").iter().enumerate() {
        let rp = pp.child("rules").index(i);
        let action = s(rule, "action");
        enum_field(errs, rp.child("action"), action, FAILURE_ACTIONS);
        if action == "FailIndex" && !present(spec, "backoffLimitPerIndex") {
            errs.push(FieldError::invalid(
                rp.child("action"),
                json!(action),
                "requires the backoffLimitPerIndex to be set",
            ));
        }
        let codes = present(rule, "onExitCodes");
        let conds = !arr(rule, "onPodConditions").is_empty();
        if codes == conds {
            errs.push(FieldError::invalid_omitted(
                rp,
                if codes {
                    "specifying both OnExitCodes and OnPodConditions is not supported"
                } else {
                    "specifying one of OnExitCodes and OnPodConditions is required"
                },
            ));
            continue;
        }
        if let Some(oc) = rule.get("onExitCodes").filter(|v| !v.is_null()) {
            let op = rp.child("onExitCodes");
            enum_field(
                errs,
                op.child("operator"),
                s(oc, "operator"),
                &["In", "NotIn"],
            );
            let values = arr(oc, "values");
            if values.is_empty() {
                errs.push(FieldError::required(
                    op.child("values"),
                    "at least one value is required",
                ));
            }
            for (j, v) in values.iter().enumerate() {
                if s(oc, "operator") == "In" && v.as_i64() == Some(0) {
                    errs.push(FieldError::invalid(
                        op.child("values").index(j),
                        json!(0),
                        "must not be 0 for the In operator",
                    ));
                }
            }
        }
        for (j, pat) in arr(rule, "onPodConditions").iter().enumerate() {
            let cp = rp.child("onPodConditions").index(j);
            if s(pat, "type").is_empty() {
                errs.push(FieldError::required(cp.child("type"), ""));
            }
            enum_field(
                errs,
                cp.child("status"),
                s(pat, "status"),
                &["True", "False", "Unknown"],
            );
        }
    }
}

/// `backoffLimitPerIndex` and `maxFailedIndexes`: Indexed Jobs only, with upstream's caps
/// that keep `status.failedIndexes` short.
fn backoff_limit_per_index(errs: &mut Errs, sp: &Path, spec: &Value) {
    nonnegative(
        errs,
        sp.child("backoffLimitPerIndex"),
        spec,
        "backoffLimitPerIndex",
    );
    let per_index = spec.get("backoffLimitPerIndex").and_then(Value::as_i64);
    let max_failed = spec.get("maxFailedIndexes").and_then(Value::as_i64);
    if max_failed.is_some() {
        nonnegative(errs, sp.child("maxFailedIndexes"), spec, "maxFailedIndexes");
        if per_index.is_none() {
            errs.push(FieldError::required(
                sp.child("backoffLimitPerIndex"),
                "when maxFailedIndexes is specified",
            ));
        }
    }
    if s(spec, "completionMode") != "Indexed" {
        for (key, v) in [
            ("backoffLimitPerIndex", per_index),
            ("maxFailedIndexes", max_failed),
        ] {
            if let Some(n) = v {
                errs.push(FieldError::invalid(
                    sp.child(key),
                    json!(n),
                    "requires indexed completion mode",
                ));
            }
        }
        return;
    }
    let completions = spec.get("completions").and_then(Value::as_i64);
    if let (Some(c), Some(m)) = (completions, max_failed)
        && m > c
    {
        errs.push(FieldError::invalid(
            sp.child("maxFailedIndexes"),
            json!(m),
            "must be less than or equal to completions",
        ));
    }
    if let Some(m) = max_failed.filter(|m| *m > MAX_FAILED_INDEXES) {
        errs.push(FieldError::invalid(
            sp.child("maxFailedIndexes"),
            json!(m),
            format!("must be less than or equal to {MAX_FAILED_INDEXES}"),
        ));
    }
    if completions.is_some_and(|c| c > COMPLETIONS_SOFT_LIMIT) && per_index.is_some() {
        let high = format!(
            "when completions are above {COMPLETIONS_SOFT_LIMIT} and used with backoff limit per index"
        );
        if max_failed.is_none() {
            errs.push(FieldError::required(
                sp.child("maxFailedIndexes"),
                format!("must be specified when completions is above {COMPLETIONS_SOFT_LIMIT}"),
            ));
        }
        if let Some(p) = spec
            .get("parallelism")
            .and_then(Value::as_i64)
            .filter(|p| *p > HIGH_COMPLETIONS_CAP)
        {
            errs.push(FieldError::invalid(
                sp.child("parallelism"),
                json!(p),
                format!("must be less than or equal to {HIGH_COMPLETIONS_CAP} {high}"),
            ));
        }
        if let Some(m) = max_failed.filter(|m| *m > HIGH_COMPLETIONS_CAP) {
            errs.push(FieldError::invalid(
                sp.child("maxFailedIndexes"),
                json!(m),
                format!("must be less than or equal to {HIGH_COMPLETIONS_CAP} {high}"),
            ));
        }
    }
}

/// `spec.successPolicy` (upstream's `validateSuccessPolicy`): Indexed Jobs only, 1–20 rules,
/// each naming indexes below `completions` and/or a count no larger than what it could reach.
fn success_policy(errs: &mut Errs, sp: &Path, spec: &Value) {
    let Some(policy) = spec.get("successPolicy").filter(|v| !v.is_null()) else {
        return;
    };
    let pp = sp.child("successPolicy");
    if s(spec, "completionMode") != "Indexed" {
        errs.push(FieldError::invalid(
            pp,
            go_success_policy(policy),
            "requires indexed completion mode",
        ));
        return;
    }
    let rules = arr(policy, "rules");
    let rsp = pp.child("rules");
    if rules.is_empty() {
        errs.push(FieldError::required(
            rsp.clone(),
            "at least one rules must be specified when the successPolicy is specified",
        ));
    }
    if rules.len() > MAX_SUCCESS_POLICY_RULES {
        errs.push(FieldError::too_many(
            rsp.clone(),
            rules.len(),
            MAX_SUCCESS_POLICY_RULES,
        ));
    }
    let completions = spec.get("completions").and_then(Value::as_i64).unwrap_or(0);
    for (i, rule) in rules.iter().enumerate() {
        let rp = rsp.index(i);
        let indexes = rule.get("succeededIndexes").and_then(Value::as_str);
        let count = rule.get("succeededCount").and_then(Value::as_i64);
        if indexes.is_none() && count.is_none() {
            errs.push(FieldError::required(
                rp.clone(),
                "at least one of succeededCount or succeededIndexes must be specified",
            ));
        }
        let mut total = 0;
        if let Some(ix) = indexes {
            let ip = rp.child("succeededIndexes");
            if ix.len() > MAX_SUCCEEDED_INDEXES_LEN {
                errs.push(FieldError::too_long(ip.clone(), MAX_SUCCEEDED_INDEXES_LEN));
            }
            match indexes_total(ix, completions) {
                Ok(n) => total = n,
                Err(e) => errs.push(FieldError::invalid(
                    ip,
                    json!(ix),
                    format!("error parsing succeededIndexes: {e}"),
                )),
            }
        }
        if let Some(n) = count {
            let cp = rp.child("succeededCount");
            nonnegative(errs, cp.clone(), rule, "succeededCount");
            if n > completions {
                errs.push(FieldError::invalid(
                    cp.clone(),
                    json!(n),
                    format!(
                        "must be less than or equal to {completions} (the number of specified completions)"
                    ),
                ));
            }
            if indexes.is_some() && n > total {
                errs.push(FieldError::invalid(
                    cp,
                    json!(n),
                    format!(
                        "must be less than or equal to {total} (the number of indexes in the specified succeededIndexes field)"
                    ),
                ));
            }
        }
    }
}

/// Upstream prints the internal `batch.SuccessPolicy` with `%#v`; its pointer fields show as
/// addresses there, here as the values they point to (an address means nothing to a reader).
fn go_success_policy(policy: &Value) -> Value {
    let rules: Vec<String> = arr(policy, "rules")
        .iter()
        .map(|r| {
            let indexes = match r.get("succeededIndexes").and_then(Value::as_str) {
                Some(ix) => format!("(*string)({})", crate::status::go_quote(ix)),
                None => "(*string)(nil)".to_string(),
            };
            let count = match r.get("succeededCount").and_then(Value::as_i64) {
                Some(n) => format!("(*int32)({n})"),
                None => "(*int32)(nil)".to_string(),
            };
            format!("batch.SuccessPolicyRule{{SucceededIndexes:{indexes}, SucceededCount:{count}}}")
        })
        .collect();
    let rules = if rules.is_empty() {
        "[]batch.SuccessPolicyRule(nil)".to_string()
    } else {
        format!("[]batch.SuccessPolicyRule{{{}}}", rules.join(", "))
    };
    json!({"$stringer": format!("batch.SuccessPolicy{{Rules:{rules}}}")})
}

/// Upstream's `validateIndexesFormat`: the number of indexes in `1,3-5,7`, which must be
/// increasing and below `completions`; the error names the offending fragment.
pub(crate) fn indexes_total(text: &str, completions: i64) -> Result<i64, String> {
    if text.is_empty() {
        return Ok(0);
    }
    let mut last: Option<i64> = None;
    let mut total = 0;
    for part in text.split(',') {
        let (x, y) = index_interval(part, completions)?;
        if let Some(prev) = last
            && prev >= x
        {
            return Err(format!(
                "non-increasing order, previous: {prev}, current: {x}"
            ));
        }
        total += y - x + 1;
        last = Some(y);
    }
    Ok(total)
}

fn index_interval(part: &str, completions: i64) -> Result<(i64, i64), String> {
    let limits: Vec<&str> = part.split('-').collect();
    if limits.len() > 2 {
        return Err(format!(
            "the fragment {} violates the requirement that an index interval can have at most two parts separated by '-'",
            crate::status::go_quote(part)
        ));
    }
    let number = |t: &str| -> Result<i64, String> {
        let n: i64 = t.parse().map_err(|_| {
            format!(
                "cannot convert string to integer for index: {}",
                crate::status::go_quote(t)
            )
        })?;
        if n >= completions {
            return Err(format!("too large index: {}", crate::status::go_quote(t)));
        }
        Ok(n)
    };
    let x = number(limits[0])?;
    let Some(second) = limits.get(1) else {
        return Ok((x, x));
    };
    let y = number(second)?;
    if x >= y {
        return Err(format!("non-increasing order, previous: {x}, current: {y}"));
    }
    Ok((x, y))
}

/// `validateJobSpec`; a CronJob's job template has no selector yet.
fn job_spec(errs: &mut Errs, spec: &Value, sp: &Path, template: bool) {
    nonnegative(errs, sp.child("parallelism"), spec, "parallelism");
    nonnegative(errs, sp.child("completions"), spec, "completions");
    if present(spec, "activeDeadlineSeconds") {
        positive(
            errs,
            sp.child("activeDeadlineSeconds"),
            spec,
            "activeDeadlineSeconds",
        );
    }
    nonnegative(errs, sp.child("backoffLimit"), spec, "backoffLimit");
    nonnegative(
        errs,
        sp.child("ttlSecondsAfterFinished"),
        spec,
        "ttlSecondsAfterFinished",
    );
    backoff_limit_per_index(errs, sp, spec);
    let mode = s(spec, "completionMode");
    if !mode.is_empty() && !COMPLETION_MODES.contains(&mode) {
        errs.push(FieldError::not_supported(
            sp.child("completionMode"),
            json!(mode),
            COMPLETION_MODES,
        ));
    }
    if mode == "Indexed" {
        if !present(spec, "completions") {
            errs.push(FieldError::required(
                sp.child("completions"),
                "when completion mode is Indexed",
            ));
        }
        if let Some(p) = spec.get("parallelism").and_then(Value::as_i64)
            && p > MAX_INDEXED_PARALLELISM
        {
            errs.push(FieldError::invalid(
                sp.child("parallelism"),
                json!(p),
                "must be less than or equal to 100000 when completion mode is Indexed",
            ));
        }
    }
    success_policy(errs, sp, spec);
    let rpp = s(spec, "podReplacementPolicy");
    if !rpp.is_empty() && !REPLACEMENT_POLICIES.contains(&rpp) {
        errs.push(FieldError::not_supported(
            sp.child("podReplacementPolicy"),
            json!(rpp),
            REPLACEMENT_POLICIES,
        ));
    }
    if template {
        if spec.get("manualSelector").and_then(Value::as_bool) == Some(true) {
            errs.push(FieldError::not_supported(
                sp.child("manualSelector"),
                json!(true),
                &["nil", "false"],
            ));
        }
    } else {
        selector_errors(errs, sp, spec);
    }
    let tp = sp.child("template");
    let tmeta = spec
        .pointer("/template/metadata")
        .cloned()
        .unwrap_or_else(|| json!({}));
    validate_labels(
        errs,
        &strmap(&tmeta, "labels"),
        &tp.child("metadata").child("labels"),
    );
    let tspec = spec
        .pointer("/template/spec")
        .cloned()
        .unwrap_or_else(|| json!({}));
    validate_pod_spec(errs, &tspec, &tp.child("spec"), false);
    let rp = s(&tspec, "restartPolicy");
    if !RESTART_POLICIES.contains(&rp) {
        errs.push(FieldError::not_supported(
            tp.child("spec").child("restartPolicy"),
            json!(rp),
            RESTART_POLICIES,
        ));
    }
    if !arr(&tspec, "ephemeralContainers").is_empty() {
        errs.push(FieldError::forbidden(
            tp.child("spec").child("ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
    pod_failure_policy(errs, sp, spec);
}

fn changed(new: Option<&Value>, old: Option<&Value>) -> bool {
    let norm = |v: Option<&Value>| v.filter(|v| !v.is_null()).map(semantic);
    norm(new) != norm(old)
}

fn immutable(errs: &mut Errs, path: Path, new: Option<&Value>, old: Option<&Value>) {
    if changed(new, old) {
        errs.push(FieldError::invalid(
            path,
            new.cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

pub(super) fn validate_job(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let sp = Path::new("spec");
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    job_spec(errs, spec, &sp, false);
    let Some(old) = old else { return };
    let old_spec = old.get("spec").unwrap_or(&empty);
    immutable(
        errs,
        sp.child("selector"),
        spec.get("selector"),
        old_spec.get("selector"),
    );
    immutable(
        errs,
        sp.child("completionMode"),
        spec.get("completionMode"),
        old_spec.get("completionMode"),
    );
    for key in ["podFailurePolicy", "backoffLimitPerIndex"] {
        immutable(errs, sp.child(key), spec.get(key), old_spec.get(key));
    }
    let policy = spec.get("successPolicy").filter(|v| !v.is_null());
    if changed(policy, old_spec.get("successPolicy")) {
        errs.push(FieldError::invalid(
            sp.child("successPolicy"),
            policy.map_or(Value::Null, go_success_policy),
            "field is immutable",
        ));
    }
    // Completions may change only together with parallelism for an Indexed Job (elastic).
    let elastic = s(spec, "completionMode") == "Indexed"
        && spec.get("completions") == spec.get("parallelism");
    if !elastic {
        immutable(
            errs,
            sp.child("completions"),
            spec.get("completions"),
            old_spec.get("completions"),
        );
    }
    // A suspended Job that never started may still change its pod template's scheduling
    // directives; everything else in the template is fixed.
    let never_started = old.pointer("/status/startTime").is_none_or(Value::is_null);
    let suspended = old_spec.get("suspend").and_then(Value::as_bool) == Some(true);
    let strip = |v: Option<&Value>| {
        let mut t = v.cloned().unwrap_or(Value::Null);
        if suspended
            && never_started
            && let Some(ps) = t.get_mut("spec").and_then(Value::as_object_mut)
        {
            for k in ["nodeSelector", "tolerations", "affinity", "schedulingGates"] {
                ps.remove(k);
            }
        }
        if let Some(m) = t.get_mut("metadata").and_then(Value::as_object_mut)
            && suspended
            && never_started
        {
            m.remove("labels");
            m.remove("annotations");
        }
        t
    };
    if semantic(&strip(spec.get("template"))) != semantic(&strip(old_spec.get("template"))) {
        errs.push(FieldError::invalid(
            sp.child("template"),
            spec.get("template").cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

pub(super) fn validate_cronjob(errs: &mut Errs, obj: &Value) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if name.len() > MAX_CRONJOB_NAME {
        errs.push(FieldError::invalid(
            Path::new("metadata").child("name"),
            json!(name),
            "must be no more than 52 characters",
        ));
    }
    let sp = Path::new("spec");
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let schedule = s(spec, "schedule");
    if schedule.is_empty() {
        errs.push(FieldError::required(sp.child("schedule"), ""));
    } else {
        if let Err(e) = crate::cron::parse(schedule) {
            errs.push(FieldError::invalid(
                sp.child("schedule"),
                json!(schedule),
                e,
            ));
        }
        if crate::cron::mentions_tz(schedule) {
            errs.push(FieldError::invalid(
                sp.child("schedule"),
                json!(schedule),
                "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
            ));
        }
    }
    if let Some(tz) = spec.get("timeZone").filter(|v| !v.is_null()) {
        let tz_s = tz.as_str().unwrap_or("");
        let tp = sp.child("timeZone");
        if tz_s.is_empty() {
            errs.push(FieldError::invalid(
                tp,
                json!(tz_s),
                "timeZone must be nil or non-empty string",
            ));
        } else if tz_s.eq_ignore_ascii_case("local") {
            errs.push(FieldError::invalid(
                tp,
                json!(tz_s),
                "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones",
            ));
        } else if let Err(e) = crate::cron::time_zone(Some(tz_s)) {
            errs.push(FieldError::invalid(tp, json!(tz_s), e));
        }
    }
    enum_field(
        errs,
        sp.child("concurrencyPolicy"),
        s(spec, "concurrencyPolicy"),
        &["Allow", "Forbid", "Replace"],
    );
    nonnegative(
        errs,
        sp.child("startingDeadlineSeconds"),
        spec,
        "startingDeadlineSeconds",
    );
    nonnegative(
        errs,
        sp.child("successfulJobsHistoryLimit"),
        spec,
        "successfulJobsHistoryLimit",
    );
    nonnegative(
        errs,
        sp.child("failedJobsHistoryLimit"),
        spec,
        "failedJobsHistoryLimit",
    );
    let jp = sp.child("jobTemplate");
    let jt = spec.get("jobTemplate").unwrap_or(&empty);
    let jmeta = jt.get("metadata").cloned().unwrap_or_else(|| json!({}));
    validate_labels(
        errs,
        &strmap(&jmeta, "labels"),
        &jp.child("metadata").child("labels"),
    );
    job_spec(
        errs,
        jt.get("spec").unwrap_or(&empty),
        &jp.child("spec"),
        true,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(restart: &str) -> Value {
        defaulted(
            "Job",
            json!({"metadata": {"name": "j"}, "spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 6, "completionMode": "NonIndexed",
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"restartPolicy": restart,
                "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "Always",
                    "terminationMessagePolicy": "File"}], "dnsPolicy": "ClusterFirst"}}}}),
        )
    }

    fn defaulted(kind: &str, mut v: Value) -> Value {
        crate::defaults::default_object(&crate::gvk::Gvk::new("batch", "v1", kind), &mut v);
        v
    }

    fn msgs(errs: &Errs) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn job_rules_with_upstream_texts() {
        let mut errs = Vec::new();
        validate_job(&mut errs, &job("Never"), None);
        assert!(errs.is_empty(), "{:?}", msgs(&errs));

        let mut errs = Vec::new();
        validate_job(&mut errs, &job("Always"), None);
        assert_eq!(
            msgs(&errs),
            vec![
                "spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""
            ]
        );

        let mut j = job("Never");
        j["spec"]["parallelism"] = json!(-1);
        let mut errs = Vec::new();
        validate_job(&mut errs, &j, None);
        assert_eq!(
            msgs(&errs),
            vec!["spec.parallelism: Invalid value: -1: must be greater than or equal to 0"]
        );

        let mut j = job("Never");
        j["spec"]["completionMode"] = json!("Indexed");
        j["spec"].as_object_mut().map(|s| s.remove("completions"));
        let mut errs = Vec::new();
        validate_job(&mut errs, &j, None);
        assert_eq!(
            msgs(&errs),
            vec!["spec.completions: Required value: when completion mode is Indexed"]
        );

        let old = job("Never");
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx");
        let mut errs = Vec::new();
        validate_job(&mut errs, &new, Some(&old));
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.template");
        assert!(msgs(&errs)[0].ends_with("field is immutable"));
    }

    fn indexed(extra: Value) -> Value {
        let mut j = job("Never");
        j["spec"]["completionMode"] = json!("Indexed");
        j["spec"]["completions"] = json!(5);
        j["spec"]["parallelism"] = json!(5);
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            j["spec"][k] = v;
        }
        j
    }

    #[test]
    fn success_policy_rules_with_upstream_texts() {
        let check = |j: Value| {
            let mut errs = Vec::new();
            validate_job(&mut errs, &j, None);
            msgs(&errs)
        };
        let policy = |rules: Value| json!({"successPolicy": {"rules": rules}});
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (
                policy(json!([{"succeededIndexes": "0-2,4", "succeededCount": 2}])),
                vec![],
            ),
            (policy(json!([{"succeededCount": 5}])), vec![]),
            (policy(json!([{"succeededIndexes": "0,1"}])), vec![]),
            (
                policy(json!([])),
                vec![
                    "spec.successPolicy.rules: Required value: at least one rules must be specified when the successPolicy is specified",
                ],
            ),
            (
                policy(json!([{}])),
                vec![
                    "spec.successPolicy.rules[0]: Required value: at least one of succeededCount or succeededIndexes must be specified",
                ],
            ),
            (
                policy(json!([{"succeededIndexes": "1-0"}])),
                vec![
                    "spec.successPolicy.rules[0].succeededIndexes: Invalid value: \"1-0\": error parsing succeededIndexes: non-increasing order, previous: 1, current: 0",
                ],
            ),
            (
                policy(json!([{"succeededIndexes": "3,1"}])),
                vec![
                    "spec.successPolicy.rules[0].succeededIndexes: Invalid value: \"3,1\": error parsing succeededIndexes: non-increasing order, previous: 3, current: 1",
                ],
            ),
            (
                policy(json!([{"succeededIndexes": "5"}])),
                vec![
                    "spec.successPolicy.rules[0].succeededIndexes: Invalid value: \"5\": error parsing succeededIndexes: too large index: \"5\"",
                ],
            ),
            (
                policy(json!([{"succeededIndexes": "a"}])),
                vec![
                    "spec.successPolicy.rules[0].succeededIndexes: Invalid value: \"a\": error parsing succeededIndexes: cannot convert string to integer for index: \"a\"",
                ],
            ),
            (
                policy(json!([{"succeededIndexes": "1-2-3"}])),
                vec![
                    "spec.successPolicy.rules[0].succeededIndexes: Invalid value: \"1-2-3\": error parsing succeededIndexes: the fragment \"1-2-3\" violates the requirement that an index interval can have at most two parts separated by '-'",
                ],
            ),
            (
                policy(json!([{"succeededCount": 6}])),
                vec![
                    "spec.successPolicy.rules[0].succeededCount: Invalid value: 6: must be less than or equal to 5 (the number of specified completions)",
                ],
            ),
            (
                policy(json!([{"succeededIndexes": "0-1", "succeededCount": 3}])),
                vec![
                    "spec.successPolicy.rules[0].succeededCount: Invalid value: 3: must be less than or equal to 2 (the number of indexes in the specified succeededIndexes field)",
                ],
            ),
            (
                policy(json!([{"succeededCount": -1}])),
                vec![
                    "spec.successPolicy.rules[0].succeededCount: Invalid value: -1: must be greater than or equal to 0",
                ],
            ),
            (
                policy(json!(
                    (0..21)
                        .map(|_| json!({"succeededCount": 1}))
                        .collect::<Vec<_>>()
                )),
                vec!["spec.successPolicy.rules: Too many: 21: must have at most 20 items"],
            ),
        ];
        for (extra, want) in cases {
            assert_eq!(check(indexed(extra.clone())), want, "{extra}");
        }
        let mut plain = job("Never");
        plain["spec"]["successPolicy"] = json!({"rules": [{"succeededCount": 1}]});
        assert_eq!(
            check(plain),
            vec![
                "spec.successPolicy: Invalid value: batch.SuccessPolicy{Rules:[]batch.SuccessPolicyRule{batch.SuccessPolicyRule{SucceededIndexes:(*string)(nil), SucceededCount:(*int32)(1)}}}: requires indexed completion mode"
            ]
        );
        assert_eq!(indexes_total("0,2-4,7", 8), Ok(5));
        assert_eq!(indexes_total("", 8), Ok(0));
    }

    #[test]
    fn backoff_limit_per_index_rules_with_upstream_texts() {
        let check = |j: Value| {
            let mut errs = Vec::new();
            validate_job(&mut errs, &j, None);
            msgs(&errs)
        };
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (
                json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 5}),
                vec![],
            ),
            (
                json!({"backoffLimitPerIndex": -1}),
                vec![
                    "spec.backoffLimitPerIndex: Invalid value: -1: must be greater than or equal to 0",
                ],
            ),
            (
                json!({"maxFailedIndexes": 1}),
                vec![
                    "spec.backoffLimitPerIndex: Required value: when maxFailedIndexes is specified",
                ],
            ),
            (
                json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 6}),
                vec![
                    "spec.maxFailedIndexes: Invalid value: 6: must be less than or equal to completions",
                ],
            ),
            (
                json!({"backoffLimitPerIndex": 1, "completions": 100_001, "parallelism": 10_001}),
                vec![
                    "spec.maxFailedIndexes: Required value: must be specified when completions is above 100000",
                    "spec.parallelism: Invalid value: 10001: must be less than or equal to 10000 when completions are above 100000 and used with backoff limit per index",
                ],
            ),
            (
                json!({"backoffLimitPerIndex": 1, "completions": 100_001, "maxFailedIndexes": 100_001}),
                vec![
                    "spec.maxFailedIndexes: Invalid value: 100001: must be less than or equal to 100000",
                    "spec.maxFailedIndexes: Invalid value: 100001: must be less than or equal to 10000 when completions are above 100000 and used with backoff limit per index",
                ],
            ),
        ];
        for (extra, want) in cases {
            assert_eq!(check(indexed(extra.clone())), want, "{extra}");
        }
        let mut plain = job("Never");
        plain["spec"]["backoffLimitPerIndex"] = json!(1);
        plain["spec"]["maxFailedIndexes"] = json!(1);
        assert_eq!(
            check(plain),
            vec![
                "spec.backoffLimitPerIndex: Invalid value: 1: requires indexed completion mode",
                "spec.maxFailedIndexes: Invalid value: 1: requires indexed completion mode",
            ]
        );
        // Both are fixed once the Job exists.
        let old = indexed(
            json!({"backoffLimitPerIndex": 1, "successPolicy": {"rules": [{"succeededCount": 1}]}}),
        );
        let mut new = old.clone();
        new["spec"]["backoffLimitPerIndex"] = json!(2);
        new["spec"]["successPolicy"]["rules"][0]["succeededCount"] = json!(2);
        let mut errs = Vec::new();
        validate_job(&mut errs, &new, Some(&old));
        assert_eq!(
            msgs(&errs),
            vec![
                "spec.backoffLimitPerIndex: Invalid value: 2: field is immutable",
                "spec.successPolicy: Invalid value: batch.SuccessPolicy{Rules:[]batch.SuccessPolicyRule{batch.SuccessPolicyRule{SucceededIndexes:(*string)(nil), SucceededCount:(*int32)(2)}}}: field is immutable",
            ]
        );
    }

    #[test]
    fn cronjob_rules_with_upstream_texts() {
        let cj = |schedule: &str| {
            defaulted(
                "CronJob",
                json!({"metadata": {"name": "c"}, "spec": {"schedule": schedule, "concurrencyPolicy": "Allow",
                "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "OnFailure",
                    "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "Always",
                        "terminationMessagePolicy": "File"}], "dnsPolicy": "ClusterFirst"}}}}}}),
            )
        };
        let check = |obj: Value| {
            let mut errs = Vec::new();
            validate_cronjob(&mut errs, &obj);
            msgs(&errs)
        };
        assert!(check(cj("*/5 * * * *")).is_empty());
        assert_eq!(
            check(cj("bogus")),
            vec![
                "spec.schedule: Invalid value: \"bogus\": expected exactly 5 fields, found 1: [bogus]"
            ]
        );
        assert_eq!(
            check(cj("TZ=UTC * * * * *")),
            vec![
                "spec.schedule: Invalid value: \"TZ=UTC * * * * *\": cannot use TZ or CRON_TZ in schedule, use timeZone field instead"
            ]
        );
        let mut bad_tz = cj("* * * * *");
        bad_tz["spec"]["timeZone"] = json!("Mars/Olympus");
        assert_eq!(
            check(bad_tz),
            vec!["spec.timeZone: Invalid value: \"Mars/Olympus\": unknown time zone Mars/Olympus"]
        );
        let mut always = cj("* * * * *");
        always["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] =
            json!("Always");
        assert_eq!(
            check(always),
            vec![
                "spec.jobTemplate.spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""
            ]
        );
    }
}
