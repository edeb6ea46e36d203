//! Upstream's rolling.go: grow the new ReplicaSet within maxSurge, shrink old ones
//! within maxUnavailable (unhealthy old pods first), clean up once complete.

use serde_json::Value;

use super::sync::{active, complete, sum};
use super::util::{self, Strategy};
use super::{DeploymentController, Outcome, Rs, replicas_of, sort_by_creation};

impl DeploymentController {
    /// Upstream's rolloutRolling.
    pub(crate) async fn rollout_rolling(
        &self,
        key: &str,
        mut d: Value,
        rs_list: Vec<Rs>,
    ) -> Outcome {
        let Ok((new, mut old)) = self
            .get_all_and_sync_revision(key, &mut d, rs_list, true)
            .await
        else {
            return Outcome::Failed;
        };
        let Some(mut new) = new else {
            return Outcome::Failed;
        };
        match self.reconcile_new(&d, &mut new, &old) {
            Err(()) => return Outcome::Failed,
            Ok(true) => return self.sync_rollout_status(key, &mut d, &Some(new), &old),
            Ok(false) => {}
        }
        match self.reconcile_old(&d, &new, &mut old) {
            Err(()) => return Outcome::Failed,
            Ok(true) => return self.sync_rollout_status(key, &mut d, &Some(new), &old),
            Ok(false) => {}
        }
        let new = Some(new);
        if complete(&d, &super::sync::calculate_status(&d, new.as_ref(), &old)) {
            self.cleanup(&d, &old);
        }
        self.sync_rollout_status(key, &mut d, &new, &old)
    }

    /// Upstream's reconcileNewReplicaSet; true when it scaled.
    fn reconcile_new(&self, d: &Value, new: &mut Rs, old: &[Rs]) -> Result<bool, ()> {
        let replicas = replicas_of(d);
        if new.replicas() == replicas {
            return Ok(false);
        }
        if new.replicas() > replicas {
            return self.scale_rs(d, new, replicas);
        }
        let all: Vec<&Rs> = old.iter().chain(std::iter::once(&*new)).collect();
        let target = util::new_rs_new_replicas(
            &Strategy::of(d),
            replicas,
            sum(&all, Rs::pods),
            new.replicas(),
        );
        self.scale_rs(d, new, target)
    }

    /// Upstream's reconcileOldReplicaSets; true when it scaled something down.
    fn reconcile_old(&self, d: &Value, new: &Rs, old: &mut [Rs]) -> Result<bool, ()> {
        let old_refs: Vec<&Rs> = old.iter().collect();
        if sum(&old_refs, Rs::replicas) == 0 {
            return Ok(false);
        }
        let replicas = replicas_of(d);
        let strategy = Strategy::of(d);
        let all_pods = sum(&old_refs, Rs::replicas) + new.replicas();
        let max_unavailable = util::max_unavailable(&strategy, replicas);
        let max_down = util::max_scaled_down(
            all_pods,
            replicas,
            max_unavailable,
            new.replicas(),
            new.status("availableReplicas"),
        );
        if max_down <= 0 {
            return Ok(false);
        }
        sort_by_creation(old);
        let cleaned = self.cleanup_unhealthy(d, old, max_down)?;
        let scaled = self.scale_down_old(d, new, old, max_unavailable)?;
        Ok(cleaned + scaled > 0)
    }

    /// Upstream's cleanupUnhealthyReplicas: old sets' unavailable pods go first.
    fn cleanup_unhealthy(&self, d: &Value, old: &mut [Rs], max_cleanup: i64) -> Result<i64, ()> {
        let mut total = 0;
        for rs in old.iter_mut() {
            if total >= max_cleanup {
                break;
            }
            if rs.replicas() == 0 || rs.replicas() == rs.status("availableReplicas") {
                continue;
            }
            let down = (max_cleanup - total).min(rs.replicas() - rs.status("availableReplicas"));
            let target = rs.replicas() - down;
            self.scale_rs(d, rs, target)?;
            total += down;
        }
        Ok(total)
    }

    /// Upstream's scaleDownOldReplicaSetsForRollingUpdate: as many old pods as
    /// availability above `replicas - maxUnavailable` allows, oldest sets first.
    fn scale_down_old(
        &self,
        d: &Value,
        new: &Rs,
        old: &mut [Rs],
        max_unavailable: i64,
    ) -> Result<i64, ()> {
        let min_available = replicas_of(d) - max_unavailable;
        let available = old
            .iter()
            .map(|r| r.status("availableReplicas"))
            .sum::<i64>()
            + new.status("availableReplicas");
        if available <= min_available {
            return Ok(0);
        }
        let budget = available - min_available;
        let mut total = 0;
        for ix in active(old) {
            if total >= budget {
                break;
            }
            let rs = &mut old[ix];
            let down = rs.replicas().min(budget - total);
            let target = rs.replicas() - down;
            self.scale_rs(d, rs, target)?;
            total += down;
        }
        Ok(total)
    }
}
