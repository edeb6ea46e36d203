//! Upstream's sync.go: finding the new and old ReplicaSets (creating the new one, with
//! its revision), scaling (proportionally when the deployment was resized mid-rollout),
//! old-ReplicaSet cleanup by revisionHistoryLimit, and the status computed from the sets.

use serde_json::{Value, json};

use super::progress::{self, CondType, Reason};
use super::util::{self, Strategy};
use super::{DeploymentController, Outcome, Rs, replicas_of, sort_by_creation};
use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::controllers::objects;
use crate::controllers::replicaset::{deleting, i, owner_ref, s};

/// Upstream's FindNewReplicaSet / FindOldReplicaSets: the oldest set whose template
/// equals the deployment's (ignoring the hash label) is the new one.
pub(crate) fn find_new_and_old(d: &Value, mut sets: Vec<Rs>) -> (Option<Rs>, Vec<Rs>) {
    sort_by_creation(&mut sets);
    let tmpl = d.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let ix = sets.iter().position(|rs| {
        util::equal_ignore_hash(
            rs.obj.pointer("/spec/template").unwrap_or(&Value::Null),
            &tmpl,
        )
    });
    match ix {
        Some(ix) => {
            let new = sets.remove(ix);
            (Some(new), sets)
        }
        None => (None, sets),
    }
}

pub(crate) fn active(sets: &[Rs]) -> Vec<usize> {
    (0..sets.len())
        .filter(|&i| sets[i].replicas() > 0)
        .collect()
}

/// The new set's and the old ones' replicas, summed (spec or a status field).
pub(crate) fn sum(sets: &[&Rs], f: impl Fn(&Rs) -> i64) -> i64 {
    sets.iter().map(|r| f(r)).sum()
}

impl DeploymentController {
    /// Upstream's getAllReplicaSetsAndSyncRevision.
    pub(crate) async fn get_all_and_sync_revision(
        &self,
        key: &str,
        d: &mut Value,
        rs_list: Vec<Rs>,
        create: bool,
    ) -> Result<(Option<Rs>, Vec<Rs>), ()> {
        let (new, old) = find_new_and_old(d, rs_list);
        let new = self.get_new_rs(key, d, new, &old, create).await?;
        Ok((new, old))
    }

    /// Upstream's getNewReplicaSet.
    async fn get_new_rs(
        &self,
        key: &str,
        d: &mut Value,
        existing: Option<Rs>,
        old: &[Rs],
        create: bool,
    ) -> Result<Option<Rs>, ()> {
        let max_old = old
            .iter()
            .map(|r| util::revision(&r.obj))
            .max()
            .unwrap_or(0);
        let new_revision = max_old + 1;
        let strategy = Strategy::of(d);
        let replicas = replicas_of(d);
        if let Some(mut rs) = existing {
            let mut copy = rs.obj.clone();
            let mut changed = util::set_new_rs_annotations(d, &mut copy, new_revision, false, 0);
            let mrs = d
                .pointer("/spec/minReadySeconds")
                .cloned()
                .unwrap_or(json!(0));
            if copy
                .pointer("/spec/minReadySeconds")
                .cloned()
                .unwrap_or(json!(0))
                != mrs
            {
                copy["spec"]["minReadySeconds"] = mrs;
                changed = true;
            }
            if changed {
                rs = self.put_rs(&rs, copy, false)?;
            }
            let rev = util::annotation(&rs.obj, util::REVISION)
                .unwrap_or("")
                .to_string();
            util::set_deployment_revision(d, &rev);
            if progress::get(&d["status"], CondType::Progressing).is_none()
                && progress::has_deadline(d)
            {
                let msg = format!("Found new replica set \"{}\"", rs.name());
                progress::set(
                    &mut d["status"],
                    progress::condition(
                        CondType::Progressing,
                        "True",
                        Reason::FoundNewReplicaSet,
                        &msg,
                    ),
                );
                self.write_deployment(key, d);
            }
            return Ok(Some(rs));
        }
        if !create {
            return Ok(None);
        }
        let collision = d.pointer("/status/collisionCount").and_then(Value::as_i64);
        let mut tmpl = d.pointer("/spec/template").cloned().unwrap_or(json!({}));
        let hash = util::compute_hash(&tmpl, collision);
        if !tmpl["metadata"].is_object() {
            tmpl["metadata"] = json!({});
        }
        if !tmpl["metadata"]["labels"].is_object() {
            tmpl["metadata"]["labels"] = json!({});
        }
        tmpl["metadata"]["labels"][util::POD_TEMPLATE_HASH] = json!(hash);
        let mut selector = d.pointer("/spec/selector").cloned().unwrap_or(json!({}));
        if !selector["matchLabels"].is_object() {
            selector["matchLabels"] = json!({});
        }
        selector["matchLabels"][util::POD_TEMPLATE_HASH] = json!(hash);
        let name = format!("{}-{hash}", s(d, "/metadata/name"));
        let ns = s(d, "/metadata/namespace").to_string();
        let all: Vec<&Rs> = old.iter().collect();
        let current = sum(&all, Rs::replicas);
        let new_replicas = util::new_rs_new_replicas(&strategy, replicas, current, 0);
        let mut rs = json!({
            "metadata": {"name": name, "labels": tmpl["metadata"]["labels"].clone(),
                "ownerReferences": [owner_ref("apps/v1", "Deployment", d)]},
            "spec": {"replicas": new_replicas,
                "minReadySeconds": d.pointer("/spec/minReadySeconds").cloned().unwrap_or(json!(0)),
                "selector": selector, "template": tmpl},
        });
        util::set_new_rs_annotations(
            d,
            &mut rs,
            new_revision,
            true,
            util::max_surge(&strategy, replicas),
        );
        match objects::create_as_client(&self.st, "apps", "replicasets", &ns, rs).await {
            Ok(stored) => {
                let rs = Rs {
                    key: stored.key.clone(),
                    obj: (*stored.object).clone(),
                };
                if new_replicas > 0 {
                    self.recorder.record(
                        &self.st,
                        d,
                        "Normal",
                        "ScalingReplicaSet",
                        &format!(
                            "Scaled up replica set {} from 0 to {new_replicas}",
                            rs.name()
                        ),
                    );
                }
                util::set_deployment_revision(d, &new_revision.to_string());
                if progress::has_deadline(d) {
                    let msg = format!("Created new replica set \"{}\"", rs.name());
                    progress::set(
                        &mut d["status"],
                        progress::condition(
                            CondType::Progressing,
                            "True",
                            Reason::NewReplicaSetCreated,
                            &msg,
                        ),
                    );
                }
                self.write_deployment(key, d);
                Ok(Some(rs))
            }
            Err(e) if nodus_k8s::status::code(&e.0) == 409 => {
                // Ours already (a watch behind)? Else a hash collision: count it, and the
                // next sync hashes differently.
                let rs_key = objects::key_of("apps", "replicasets", Some(&ns), &name);
                let cur = self.st.store.get(&rs_key).ok().flatten();
                if let Some(cur) = &cur
                    && crate::controllers::replicaset::controller_ref(&cur.object)
                        .is_some_and(|r| r["uid"] == s(d, "/metadata/uid"))
                    && util::equal_ignore_hash(
                        cur.object.pointer("/spec/template").unwrap_or(&Value::Null),
                        d.pointer("/spec/template").unwrap_or(&Value::Null),
                    )
                {
                    return Ok(Some(Rs {
                        key: rs_key,
                        obj: (*cur.object).clone(),
                    }));
                }
                d["status"]["collisionCount"] = json!(collision.unwrap_or(0) + 1);
                self.write_deployment(key, d);
                Err(())
            }
            Err(e) => {
                let msg = e.0["message"].as_str().unwrap_or("").to_string();
                self.recorder.record(
                    &self.st,
                    d,
                    "Warning",
                    "FailedCreate",
                    &format!("Failed to create new replica set \"{name}\": {msg}"),
                );
                if progress::has_deadline(d) {
                    let m = format!("Failed to create new replica set \"{name}\": {msg}");
                    progress::set(
                        &mut d["status"],
                        progress::condition(
                            CondType::Progressing,
                            "False",
                            Reason::ReplicaSetCreateError,
                            &m,
                        ),
                    );
                    self.write_deployment(key, d);
                }
                Err(())
            }
        }
    }

    /// Stores a changed set (its generation bumped when the spec changed, as the API
    /// server would) and returns it as stored.
    pub(crate) fn put_rs(&self, rs: &Rs, new: Value, spec_changed: bool) -> Result<Rs, ()> {
        let res = objects::modify(&self.st, &rs.key, &mut |o| {
            if o.pointer("/metadata/uid") != rs.obj.pointer("/metadata/uid") {
                return false;
            }
            let generation = i(o, "/metadata/generation");
            o["spec"] = new["spec"].clone();
            o["metadata"]["annotations"] = new["metadata"]["annotations"].clone();
            if spec_changed {
                o["metadata"]["generation"] = json!(generation + 1);
            }
            true
        });
        match res {
            Ok(Some(stored)) => Ok(Rs {
                key: rs.key.clone(),
                obj: (*stored.object).clone(),
            }),
            Ok(None) => Ok(rs.clone()),
            Err(e) => {
                tracing::warn!(rs = %rs.key, error = %e, "deployment: replica set update failed");
                Err(())
            }
        }
    }

    /// Upstream's scaleReplicaSet: size and the desired/max annotations; an event when
    /// the size changed. Returns whether it did.
    pub(crate) fn scale_rs(&self, d: &Value, rs: &mut Rs, new_scale: i64) -> Result<bool, ()> {
        let strategy = Strategy::of(d);
        let replicas = replicas_of(d);
        let old_scale = rs.replicas();
        let mut copy = rs.obj.clone();
        let size_changed = old_scale != new_scale;
        let ann_changed = util::set_replicas_annotations(
            &mut copy,
            replicas,
            replicas + util::max_surge(&strategy, replicas),
        );
        if !size_changed && !ann_changed {
            return Ok(false);
        }
        copy["spec"]["replicas"] = json!(new_scale);
        *rs = self.put_rs(rs, copy, size_changed)?;
        if size_changed {
            let op = if new_scale > old_scale { "up" } else { "down" };
            self.recorder.record(
                &self.st,
                d,
                "Normal",
                "ScalingReplicaSet",
                &format!(
                    "Scaled {op} replica set {} from {old_scale} to {new_scale}",
                    rs.name()
                ),
            );
        }
        Ok(size_changed)
    }

    /// Upstream's scale(): the deployment was resized.
    pub(crate) fn scale(&self, d: &Value, new: &mut Option<Rs>, old: &mut [Rs]) -> Result<(), ()> {
        let replicas = replicas_of(d);
        let strategy = Strategy::of(d);
        // One active (or no active: the latest) set takes the whole size.
        let old_active = active(old);
        let new_active = new.as_ref().is_some_and(|n| n.replicas() > 0);
        let n_active = old_active.len() + usize::from(new_active);
        if n_active <= 1 {
            let target: Option<&mut Rs> = if new_active || (n_active == 0 && new.is_some()) {
                new.as_mut()
            } else if n_active == 1 {
                old.get_mut(old_active[0])
            } else {
                old.last_mut()
            };
            if let Some(rs) = target
                && rs.replicas() != replicas
            {
                self.scale_rs(d, rs, replicas)?;
            }
            return Ok(());
        }
        // The new set is saturated: the old ones go.
        if let Some(n) = new
            && util::annotation(&n.obj, util::DESIRED_REPLICAS)
                == Some(replicas.to_string().as_str())
            && n.replicas() == replicas
            && n.status("availableReplicas") == replicas
        {
            for ix in old_active {
                self.scale_rs(d, &mut old[ix], 0)?;
            }
            return Ok(());
        }
        if !matches!(strategy, Strategy::RollingUpdate { .. }) {
            return Ok(());
        }
        let mut refs: Vec<&mut Rs> = Vec::new();
        let mut old_iter: Vec<&mut Rs> = old.iter_mut().filter(|r| r.replicas() > 0).collect();
        refs.append(&mut old_iter);
        if let Some(n) = new.as_mut().filter(|n| n.replicas() > 0) {
            refs.push(n);
        }
        let sizes: Vec<util::SetSize> = refs
            .iter()
            .map(|r| util::SetSize {
                replicas: r.replicas(),
                max_replicas: util::annotation(&r.obj, util::MAX_REPLICAS)
                    .and_then(|m| m.parse().ok()),
                created: r.created(),
                name: r.name().to_string(),
            })
            .collect();
        let new_sizes = util::proportional_sizes(
            &sizes,
            replicas,
            util::max_surge(&strategy, replicas),
            i(d, "/status/replicas"),
        );
        for (rs, size) in refs.into_iter().zip(new_sizes) {
            self.scale_rs(d, rs, size)?;
        }
        Ok(())
    }

    /// Upstream's sync(): scaling and (paused) cleanup, then status.
    pub(crate) async fn sync(&self, key: &str, mut d: Value, rs_list: Vec<Rs>) -> Outcome {
        let Ok((mut new, mut old)) = self
            .get_all_and_sync_revision(key, &mut d, rs_list, false)
            .await
        else {
            return Outcome::Failed;
        };
        if self.scale(&d, &mut new, &mut old).is_err() {
            return Outcome::Failed;
        }
        if d.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
            self.cleanup(&d, &old);
        }
        self.sync_deployment_status(key, &mut d, &new, &old);
        Outcome::Done
    }

    pub(crate) fn sync_status_only(&self, key: &str, mut d: Value, rs_list: Vec<Rs>) -> Outcome {
        let (new, old) = find_new_and_old(&d, rs_list);
        self.sync_deployment_status(key, &mut d, &new, &old);
        Outcome::Done
    }

    /// Upstream's cleanupDeployment: old sets beyond revisionHistoryLimit, oldest
    /// revision first, once they are scaled to zero and observed so.
    pub(crate) fn cleanup(&self, d: &Value, old: &[Rs]) {
        let Some(limit) = d
            .pointer("/spec/revisionHistoryLimit")
            .and_then(Value::as_i64)
        else {
            return;
        };
        let mut cleanable: Vec<&Rs> = old.iter().filter(|r| !deleting(&r.obj)).collect();
        let diff = cleanable.len() as i64 - limit;
        if diff <= 0 {
            return;
        }
        cleanable.sort_by(|a, b| {
            util::revision(&a.obj)
                .cmp(&util::revision(&b.obj))
                .then(a.created().cmp(&b.created()))
        });
        let Some(mut t) = objects::target("apps", "replicasets", None) else {
            return;
        };
        t.namespace = Some(s(d, "/metadata/namespace").to_string());
        for rs in cleanable.into_iter().take(diff as usize) {
            if rs.status("replicas") != 0
                || rs.replicas() != 0
                || i(&rs.obj, "/metadata/generation") > rs.status("observedGeneration")
            {
                continue;
            }
            if let Err(e) = delete_object(&self.st, &t, rs.name(), &DeleteOptions::default()) {
                tracing::warn!(rs = %rs.key, error = %e.0["message"], "deployment: cleanup failed");
            }
        }
    }

    /// Upstream's syncDeploymentStatus.
    pub(crate) fn sync_deployment_status(
        &self,
        key: &str,
        d: &mut Value,
        new: &Option<Rs>,
        old: &[Rs],
    ) {
        let status = calculate_status(d, new.as_ref(), old);
        if d["status"] != status {
            d["status"] = status;
        }
        self.write_deployment(key, d);
    }
}

/// Upstream's calculateStatus: counts from the sets, the Available condition from
/// minimum availability; other conditions carried over.
pub(crate) fn calculate_status(d: &Value, new: Option<&Rs>, old: &[Rs]) -> Value {
    let all: Vec<&Rs> = old.iter().chain(new).collect();
    let available = sum(&all, |r| r.status("availableReplicas"));
    let total = sum(&all, Rs::replicas);
    let replicas = replicas_of(d);
    let mut st = json!({
        "observedGeneration": i(d, "/metadata/generation"),
        "replicas": sum(&all, |r| r.status("replicas")),
        "updatedReplicas": new.map(|n| n.status("replicas")).unwrap_or(0),
        "readyReplicas": sum(&all, |r| r.status("readyReplicas")),
        "availableReplicas": available,
        "unavailableReplicas": (total - available).max(0),
    });
    if let Some(c) = d.pointer("/status/collisionCount") {
        st["collisionCount"] = c.clone();
    }
    if let Some(c) = d.pointer("/status/conditions") {
        st["conditions"] = c.clone();
    }
    let min = replicas - util::max_unavailable(&Strategy::of(d), replicas);
    let cond = if available >= min {
        progress::condition(
            CondType::Available,
            "True",
            Reason::MinimumReplicasAvailable,
            "Deployment has minimum availability.",
        )
    } else {
        progress::condition(
            CondType::Available,
            "False",
            Reason::MinimumReplicasUnavailable,
            "Deployment does not have minimum availability.",
        )
    };
    progress::set(&mut st, cond);
    // Zero counts are omitted on the wire, as the API server's omitempty does.
    if let Some(m) = st.as_object_mut() {
        m.retain(|k, v| {
            k == "observedGeneration"
                || k == "conditions"
                || k == "collisionCount"
                || v.as_i64() != Some(0)
        });
    }
    st
}

/// Upstream's DeploymentComplete.
pub(crate) fn complete(d: &Value, st: &Value) -> bool {
    let g = |f: &str| st.get(f).and_then(Value::as_i64).unwrap_or(0);
    let r = replicas_of(d);
    g("updatedReplicas") == r
        && g("replicas") == r
        && g("availableReplicas") == r
        && g("observedGeneration") >= i(d, "/metadata/generation")
}
