//! Upstream's recreate.go: every old pod goes, and only once none is left running does
//! the new ReplicaSet scale up.

use std::collections::HashSet;

use serde_json::Value;

use super::sync::{active, complete};
use super::{DeploymentController, Outcome, Rs, replicas_of};
use crate::controllers::cache::Cache;
use crate::controllers::replicaset::{controller_ref, s};

impl DeploymentController {
    /// Upstream's rolloutRecreate.
    pub(crate) async fn rollout_recreate(
        &self,
        key: &str,
        mut d: Value,
        rs_list: Vec<Rs>,
        pods: &Cache,
    ) -> Outcome {
        let Ok((mut new, mut old)) = self
            .get_all_and_sync_revision(key, &mut d, rs_list.clone(), false)
            .await
        else {
            return Outcome::Failed;
        };
        let mut scaled = false;
        for ix in active(&old) {
            match self.scale_rs(&d, &mut old[ix], 0) {
                Ok(c) => scaled |= c,
                Err(()) => return Outcome::Failed,
            }
        }
        if scaled {
            return self.sync_rollout_status(key, &mut d, &new, &old);
        }
        if old_pods_running(new.as_ref(), &old, pods) {
            return self.sync_rollout_status(key, &mut d, &new, &old);
        }
        if new.is_none() {
            match self
                .get_all_and_sync_revision(key, &mut d, rs_list, true)
                .await
            {
                Ok((n, o)) => {
                    new = n;
                    old = o;
                }
                Err(()) => return Outcome::Failed,
            }
        }
        if let Some(n) = new.as_mut() {
            match self.scale_rs(&d, n, replicas_of(&d)) {
                Ok(true) => return self.sync_rollout_status(key, &mut d, &new, &old),
                Ok(false) => {}
                Err(()) => return Outcome::Failed,
            }
        }
        if complete(&d, &super::sync::calculate_status(&d, new.as_ref(), &old)) {
            self.cleanup(&d, &old);
        }
        self.sync_rollout_status(key, &mut d, &new, &old)
    }
}

/// Upstream's oldPodsRunning: an old set still reports pods, or a pod of one (even one
/// being deleted) has not finished.
fn old_pods_running(new: Option<&Rs>, old: &[Rs], pods: &Cache) -> bool {
    if old.iter().map(|r| r.status("replicas")).sum::<i64>() > 0 {
        return true;
    }
    let old_uids: HashSet<&str> = old.iter().map(Rs::uid).collect();
    let new_uid = new.map(Rs::uid).unwrap_or("");
    pods.objects.values().any(|p| {
        controller_ref(p)
            .and_then(|r| r["uid"].as_str())
            .is_some_and(|u| u != new_uid && old_uids.contains(u))
            && !matches!(s(p, "/status/phase"), "Failed" | "Succeeded")
    })
}
