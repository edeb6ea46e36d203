//! The kubelet's RuntimeClass manager (upstream's pkg/kubelet/runtimeclass): one watch over
//! every RuntimeClass, from which a pod's `spec.runtimeClassName` resolves to the CRI
//! runtime handler its sandbox is created with. The class name is never the handler
//! itself: class `plain` may name handler `runc`.
//!
//! Without an API server there is no manager and every pod gets the runtime's default
//! handler, as upstream's kubelet in standalone mode.

use k8s_openapi::api::node::v1::RuntimeClass;
use kube::runtime::reflector::{self, ObjectRef, Store};
use std::time::Duration;

/// How long a lookup waits for the first list (upstream waits for the informer to sync
/// before the kubelet syncs pods).
const SYNC_WAIT: Duration = Duration::from_secs(10);

/// Why a pod's RuntimeClass could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// The API's NotFound text, as upstream's lister returns it.
    #[error("runtimeclass.node.k8s.io {0:?} not found")]
    NotFound(String),
    #[error(
        "failed to lookup RuntimeClass {0}: timed out waiting for the RuntimeClass cache to sync"
    )]
    NotSynced(String),
}

pub struct RuntimeClassManager {
    store: Store<RuntimeClass>,
    task: tokio::task::AbortHandle,
}

impl RuntimeClassManager {
    /// Starts watching RuntimeClasses; re-lists after errors with the watcher's back-off.
    pub fn start(client: kube::Client) -> RuntimeClassManager {
        use futures::StreamExt as _;
        use kube::runtime::WatchStreamExt as _;
        use kube::runtime::watcher;
        let (store, writer) = reflector::store();
        let api: kube::Api<RuntimeClass> = kube::Api::all(client);
        let stream = reflector::reflector(
            writer,
            watcher::watcher(api, watcher::Config::default()).default_backoff(),
        );
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                if let Err(e) = ev {
                    tracing::warn!(error = %e, "watching runtimeclasses failed; retrying");
                }
            }
        })
        .abort_handle();
        RuntimeClassManager { store, task }
    }

    /// The CRI handler for `runtime_class_name` (upstream's LookupRuntimeHandler): the
    /// empty handler (the runtime's default) when the pod names no class.
    pub async fn lookup_runtime_handler(
        &self,
        runtime_class_name: Option<&str>,
    ) -> Result<String, LookupError> {
        let Some(name) = runtime_class_name.filter(|n| !n.is_empty()) else {
            return Ok(String::new());
        };
        if tokio::time::timeout(SYNC_WAIT, self.store.wait_until_ready())
            .await
            .map_or(true, |r| r.is_err())
        {
            return Err(LookupError::NotSynced(name.to_string()));
        }
        self.store
            .get(&ObjectRef::new(name))
            .map(|rc| rc.handler.clone())
            .ok_or_else(|| LookupError::NotFound(name.to_string()))
    }
}

impl Drop for RuntimeClassManager {
    /// The watch task would outlive the manager otherwise.
    fn drop(&mut self) {
        self.task.abort();
    }
}
