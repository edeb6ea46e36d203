//! The manifest URL source (`--manifest-url`, upstream's `config/http.go`): the URL is
//! fetched every period; its body is one Pod or a PodList (or List of pods).

use super::SourceSender;
use super::common::{ManifestOrigin, decode_manifest};
use std::time::Duration;

/// Upstream's default `httpCheckFrequency`.
pub const HTTP_CHECK_FREQUENCY: Duration = Duration::from_secs(20);

/// Upstream gives the manifest request 10 seconds; a timeout is retried next period.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the HTTP source: GETs `url` now and every `period`, and sends the pods it
/// describes on `tx` whenever the body changes. Ends when `tx`'s receiver is gone.
pub fn spawn_http_source(
    url: String,
    node_name: String,
    period: Duration,
    tx: SourceSender,
) -> tokio::task::JoinHandle<()> {
    spawn_http_source_with_headers(url, Vec::new(), node_name, period, tx)
}

/// [`spawn_http_source`] with request headers (upstream's `--manifest-url-header`).
pub fn spawn_http_source_with_headers(
    url: String,
    headers: Vec<(String, String)>,
    node_name: String,
    period: Duration,
    tx: SourceSender,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut header_map = reqwest::header::HeaderMap::new();
        for (name, value) in &headers {
            let parsed = (
                reqwest::header::HeaderName::from_bytes(name.as_bytes()),
                reqwest::header::HeaderValue::from_str(value),
            );
            match parsed {
                (Ok(n), Ok(v)) => {
                    header_map.append(n, v);
                }
                _ => {
                    tracing::error!(url, header = %name, "invalid manifest URL header, the source does not start");
                    return;
                }
            }
        }
        let client = match reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(url, error = %e, "cannot build the HTTP client for the manifest URL source");
                return;
            }
        };
        tracing::info!(url, "Watching URL");
        let mut source = HttpSource {
            url,
            node_name,
            tx,
            client,
            headers: header_map,
            data: None,
            failure_logs: 0,
        };
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => source.run_once().await,
                _ = source.tx.closed() => return,
            }
        }
    })
}

struct HttpSource {
    url: String,
    node_name: String,
    tx: SourceSender,
    client: reqwest::Client,
    headers: reqwest::header::HeaderMap,
    /// The last body read, to skip unchanged manifests.
    data: Option<Vec<u8>>,
    failure_logs: u32,
}

impl HttpSource {
    async fn run_once(&mut self) {
        match self.extract().await {
            Err(e) => {
                // Like upstream, only the first few failures are loud.
                if self.failure_logs < 3 {
                    tracing::warn!(url = %self.url, error = %e, "Failed to read pods from URL");
                } else if self.failure_logs == 3 {
                    tracing::warn!(url = %self.url, error = %e, "Failed to read pods from URL. Dropping verbosity of this message to debug");
                } else {
                    tracing::debug!(url = %self.url, error = %e, "Failed to read pods from URL");
                }
                self.failure_logs = self.failure_logs.saturating_add(1);
            }
            Ok(()) => {
                if self.failure_logs > 0 {
                    tracing::info!(url = %self.url, "Successfully read pods from URL");
                    self.failure_logs = 0;
                }
            }
        }
    }

    async fn extract(&mut self) -> Result<(), String> {
        let resp = self
            .client
            .get(&self.url)
            .headers(self.headers.clone())
            .send()
            .await
            .map_err(|e| format!("Get {:?}: {e}", self.url))?;
        let status = resp.status();
        let data = resp
            .bytes()
            .await
            .map_err(|e| format!("{}: reading the body: {e}", self.url))?;
        if status != reqwest::StatusCode::OK {
            return Err(format!("{}: {status}", self.url));
        }
        if data.is_empty() {
            // An empty set still marks the source as seen.
            let _ = self.tx.send(Vec::new().into());
            return Err(format!("zero-length data received from {}", self.url));
        }
        if self.data.as_deref() == Some(&data[..]) {
            return Ok(());
        }
        self.data = Some(data.to_vec());
        let (pods, errors) =
            decode_manifest(&data, ManifestOrigin::Url(&self.url), &self.node_name);
        if pods.is_empty() && !errors.is_empty() {
            let msgs: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            return Err(msgs.join("; "));
        }
        for e in &errors {
            tracing::warn!(url = %self.url, error = %e, "Skipping an invalid pod from the manifest URL");
        }
        let _ = self.tx.send(pods.into());
        Ok(())
    }
}
