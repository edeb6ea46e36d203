//! The node's Lease in `kube-node-lease` (upstream's component-helpers lease controller):
//! the cheap heartbeat. Renewed every `renewInterval` = 0.25 × `nodeLeaseDurationSeconds`
//! (10s for the default 40s); `holderIdentity` is the node, and the Node owns the Lease so
//! it goes when the Node is deleted.
//!
//! Failures back off as upstream's: ensuring the Lease retries from 200ms doubling to 7s;
//! a failed renewal is retried up to five times against a freshly read Lease before the
//! controller falls back to ensuring it again.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use std::time::Duration;

pub const NAMESPACE: &str = "kube-node-lease";
/// upstream's maxUpdateRetries.
const MAX_UPDATE_RETRIES: usize = 5;
const MAX_BACKOFF: Duration = Duration::from_secs(7);

pub struct LeaseController {
    pub client: kube::Client,
    pub node: String,
    pub duration_seconds: i32,
    /// The Node's uid once known; until then the Lease has no owner (upstream sets it on a
    /// later renewal).
    pub node_uid: tokio::sync::watch::Receiver<Option<String>>,
}

impl LeaseController {
    pub fn renew_interval(&self) -> Duration {
        Duration::from_millis(self.duration_seconds.max(1) as u64 * 250)
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn owner(&self) -> Option<Vec<OwnerReference>> {
        let uid = self.node_uid.borrow().clone()?;
        Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.node.clone(),
            uid,
            ..Default::default()
        }])
    }

    /// The lease as this holder renews it now.
    fn renewed(&self, base: Option<Lease>) -> Lease {
        let mut lease = base.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.node.clone()),
                namespace: Some(NAMESPACE.into()),
                ..Default::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.node.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(MicroTime(crate::config::now_timestamp()));
        if lease
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(|o| o.is_empty())
        {
            lease.metadata.owner_references = self.owner();
        }
        lease
    }

    /// Gets the Lease, creating it when missing; retries with back-off until it works.
    async fn ensure(&self) -> Lease {
        let mut backoff = Duration::from_millis(200);
        loop {
            let r = match self.api().get_opt(&self.node).await {
                Ok(Some(l)) => Ok(l),
                Ok(None) => {
                    self.api()
                        .create(&PostParams::default(), &self.renewed(None))
                        .await
                }
                Err(e) => Err(e),
            };
            match r {
                Ok(l) => return l,
                Err(e) => {
                    tracing::warn!(node = %self.node, error = %e, retry_in = ?backoff, "failed to ensure node lease exists, will retry");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Renews `lease`; on failure re-reads it and tries again, at most five times.
    async fn renew(&self, mut lease: Lease) -> Option<Lease> {
        for attempt in 0..MAX_UPDATE_RETRIES {
            let next = self.renewed(Some(lease.clone()));
            match self
                .api()
                .replace(&self.node, &PostParams::default(), &next)
                .await
            {
                Ok(l) => return Some(l),
                Err(e) => {
                    tracing::warn!(node = %self.node, attempt, error = %e, "failed to update lease");
                    match self.api().get_opt(&self.node).await {
                        Ok(Some(l)) => lease = l,
                        _ => return None,
                    }
                }
            }
        }
        tracing::warn!(node = %self.node, "failed to update lease {MAX_UPDATE_RETRIES} times; ensuring it again");
        None
    }

    /// Keeps the Lease renewed forever.
    pub async fn run(self) {
        let interval = self.renew_interval();
        let mut current: Option<Lease> = None;
        loop {
            let lease = match current.take() {
                Some(l) => l,
                None => self.ensure().await,
            };
            current = self.renew(lease).await;
            if current.is_some() {
                tracing::trace!(node = %self.node, "renewed node lease");
            }
            tokio::time::sleep(interval).await;
        }
    }
}
