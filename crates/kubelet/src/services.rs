//! The kubelet's Service lister (upstream's serviceLister): one watch over every Service,
//! from which containers get their service environment variables
//! ([`crate::kuberuntime::envvars`]). Until the first list has arrived a container cannot
//! be given its environment, and its sync fails with upstream's message.

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, Store};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct ServiceLister {
    store: Store<Service>,
    synced: Arc<AtomicBool>,
    task: tokio::task::AbortHandle,
}

impl ServiceLister {
    /// Starts watching Services; re-lists after errors with the watcher's back-off.
    pub fn start(client: kube::Client) -> ServiceLister {
        use futures::StreamExt as _;
        use kube::runtime::WatchStreamExt as _;
        use kube::runtime::watcher::{self, Event};
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&synced);
        let api: kube::Api<Service> = kube::Api::all(client);
        let stream = reflector::reflector(
            writer,
            watcher::watcher(api, watcher::Config::default()).default_backoff(),
        );
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(Event::InitDone) => flag.store(true, Ordering::Release),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "watching services failed; retrying"),
                }
            }
        })
        .abort_handle();
        ServiceLister {
            store,
            synced,
            task,
        }
    }

    /// The variables for a pod in `namespace` (upstream's getServiceEnvVarMap). An API pod
    /// waits until services have been listed once; a static pod does not (it may be the
    /// API server itself, which no list can precede) and gets what is known so far.
    pub fn env_for(
        &self,
        namespace: &str,
        enable_service_links: bool,
        static_pod: bool,
    ) -> Result<BTreeMap<String, String>, String> {
        if !static_pod && !self.synced.load(Ordering::Acquire) {
            return Err(
                "services have not yet been read at least once, cannot construct envvars".into(),
            );
        }
        let services = self.store.state();
        Ok(crate::kuberuntime::envvars::service_env_map(
            services.iter().map(|s| s.as_ref()),
            namespace,
            enable_service_links,
        ))
    }
}

impl Drop for ServiceLister {
    fn drop(&mut self) {
        self.task.abort();
    }
}
