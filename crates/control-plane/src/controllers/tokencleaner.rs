//! The token cleaner (upstream's `pkg/controller/bootstrap/tokencleaner`): bootstrap token
//! Secrets in kube-system are deleted once their `expiration` has passed.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::cache::Cache;
use crate::apiserver::authn::bootstraptoken::BootstrapToken;
use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::now_ts;
use crate::apiserver::state::ApiState;
use crate::controllers::objects;

const PERIOD: Duration = Duration::from_secs(1);

pub async fn run(st: Arc<ApiState>) {
    let mut secrets = Cache::new(st.store.clone(), "/core/secrets/kube-system/");
    let Some(target) = objects::target("", "secrets", Some("kube-system")) else {
        return;
    };
    loop {
        tokio::time::sleep(PERIOD).await;
        while secrets.try_next().is_some() {}
        let now = now_ts();
        let expired: Vec<Arc<Value>> = secrets
            .objects
            .values()
            .filter(|s| s.pointer("/metadata/deletionTimestamp").is_none())
            .filter(|s| BootstrapToken::from_secret(s).is_some_and(|t| t.expired(now)))
            .cloned()
            .collect();
        for s in expired {
            let name = s
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let opts = DeleteOptions {
                uid: s
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                ..Default::default()
            };
            match delete_object(&st, &target, name, &opts) {
                Ok(_) => tracing::info!(secret = name, "deleted expired bootstrap token"),
                Err(e) => tracing::debug!(secret = name, error = %e, "token cleaner"),
            }
        }
    }
}
