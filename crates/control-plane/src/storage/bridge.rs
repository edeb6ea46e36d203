//! The bridge from the synchronous [`Store`](crate::storage::Store) calls to an async
//! client (etcd's gRPC, the API server's REST), which runs on a runtime of its own so a
//! caller on any thread, inside a runtime or not, can wait for it.

use std::future::Future;
use std::time::Duration;

use crate::storage::StoreError;

/// A runtime of its own for an async client, and synchronous calls into it.
pub(crate) struct Bridge {
    rt: Option<tokio::runtime::Runtime>,
    timeout: Duration,
}

impl Bridge {
    pub(crate) fn new(name: &str, timeout: Duration) -> Result<Bridge, StoreError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()
            .map_err(|e| StoreError::Backend(format!("{name} runtime: {e}")))?;
        Ok(Bridge {
            rt: Some(rt),
            timeout,
        })
    }

    pub(crate) fn handle(&self) -> tokio::runtime::Handle {
        match &self.rt {
            Some(rt) => rt.handle().clone(),
            None => unreachable!("the runtime lives until drop"),
        }
    }

    /// Runs `f` on the client runtime within the request bound and waits for it. On a
    /// multi-threaded runtime the wait hands this worker's other tasks to another thread.
    pub(crate) fn run<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let timeout = self.timeout;
        self.handle().spawn(async move {
            let out = match tokio::time::timeout(timeout, f).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::Timeout),
            };
            let _ = tx.send(out);
        });
        let wait = move || {
            rx.recv()
                .unwrap_or_else(|_| Err(StoreError::Backend("the store client stopped".into())))
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which a runtime thread may not do.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
