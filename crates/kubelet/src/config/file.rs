//! The static pod directory source (`--pod-manifest-path`, upstream's `config/file.go` and
//! `file_linux.go`): every regular, non-hidden file of the directory is a manifest; the
//! directory is watched with inotify and fully re-read every period as a safety net.

use super::common::{ManifestOrigin, decode_manifest};
use super::{SourceSender, pod_full_name};
use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchMask};
use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Upstream's default `fileCheckFrequency`: the period of the full re-read.
pub const FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);

/// How often a missing or unreadable manifest path is retried (upstream's `retryPeriod`).
const RETRY_PERIOD: Duration = Duration::from_secs(1);

/// Events that come in a burst (an editor's write + rename, many files copied at once) are
/// merged into one update; this is how long the source waits for the burst to end.
const EVENT_QUIET: Duration = Duration::from_millis(5);
const EVENT_BATCH_MAX: Duration = Duration::from_millis(100);

/// Starts the file source: reads `dir` (a directory of manifests, or one manifest file) and
/// sends its full pod set on `tx` after every change and every `period`. Ends when `tx`'s
/// receiver is gone.
pub fn spawn_file_source(
    dir: PathBuf,
    node_name: String,
    period: Duration,
    tx: SourceSender,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut source = FileSource {
            path: dir,
            node_name,
            tx,
            files: BTreeMap::new(),
            owners: HashMap::new(),
            rejected: BTreeSet::new(),
            last_sent: None,
        };
        source.run(period).await;
    })
}

struct FileSource {
    path: PathBuf,
    node_name: String,
    tx: SourceSender,
    /// Each manifest file's content and the pods parsed from it, by path.
    files: BTreeMap<PathBuf, Parsed>,
    /// Which file owns each pod full name; a later file defining the same name is rejected.
    owners: HashMap<String, PathBuf>,
    /// (file, pod name) pairs already reported as duplicates, so each is logged once.
    rejected: BTreeSet<(PathBuf, String)>,
    last_sent: Option<Vec<Pod>>,
}

struct Parsed {
    /// The bytes the pods were parsed from: an unchanged file is not parsed (nor its
    /// problems logged) again at every re-read.
    data: Vec<u8>,
    pods: Vec<Pod>,
}

enum WatchEnd {
    /// The path vanished or was replaced: start over.
    Restart,
    /// Nobody listens any more.
    Closed,
}

impl FileSource {
    async fn run(&mut self, period: Duration) {
        let mut missing_logged = false;
        loop {
            if self.tx.is_closed() {
                return;
            }
            match std::fs::metadata(&self.path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if !missing_logged {
                        tracing::warn!(path = %self.path.display(), "Unable to read config path: path does not exist, ignoring");
                        missing_logged = true;
                    }
                    // An empty set still marks the source as seen, as upstream does.
                    self.files.clear();
                    self.send();
                    tokio::time::sleep(RETRY_PERIOD).await;
                    continue;
                }
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "Unable to read config path");
                    tokio::time::sleep(RETRY_PERIOD).await;
                    continue;
                }
                Ok(_) => {}
            }
            missing_logged = false;
            match self.watch(period).await {
                Ok(WatchEnd::Closed) => return,
                Ok(WatchEnd::Restart) => {}
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "Unable to watch config path");
                    // Without inotify the periodic re-read still keeps the pods current.
                    self.resync();
                    self.send();
                    tokio::time::sleep(RETRY_PERIOD.max(period.min(Duration::from_secs(5)))).await;
                }
            }
        }
    }

    async fn watch(&mut self, period: Duration) -> std::io::Result<WatchEnd> {
        let inotify = Inotify::init()?;
        inotify.watches().add(
            &self.path,
            WatchMask::CREATE
                | WatchMask::MODIFY
                | WatchMask::CLOSE_WRITE
                | WatchMask::ATTRIB
                | WatchMask::DELETE
                | WatchMask::MOVED_FROM
                | WatchMask::MOVED_TO
                | WatchMask::DELETE_SELF
                | WatchMask::MOVE_SELF,
        )?;
        let mut events = inotify.into_event_stream(vec![0u8; 16 * 1024])?;
        tracing::info!(path = %self.path.display(), "Watching path");
        // Read after the watch exists so no change between the two is lost.
        self.resync();
        self.send();
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ev = events.next() => {
                    let Some(ev) = ev else { return Ok(WatchEnd::Restart) };
                    let mut batch = vec![ev?];
                    let deadline = tokio::time::Instant::now() + EVENT_BATCH_MAX;
                    while tokio::time::Instant::now() < deadline {
                        match tokio::time::timeout(EVENT_QUIET, events.next()).await {
                            Ok(Some(ev)) => batch.push(ev?),
                            Ok(None) | Err(_) => break,
                        }
                    }
                    let mut names: BTreeSet<OsString> = BTreeSet::new();
                    let mut full = false;
                    for ev in batch {
                        if ev.mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED | EventMask::UNMOUNT) {
                            return Ok(WatchEnd::Restart);
                        }
                        if ev.mask.contains(EventMask::Q_OVERFLOW) {
                            full = true;
                        }
                        match ev.name {
                            Some(n) => { names.insert(n); }
                            // An event on a watched file itself (single-manifest mode).
                            None => full = true,
                        }
                    }
                    if full || !self.path.is_dir() {
                        self.resync();
                    } else {
                        for name in names {
                            self.refresh_file(&self.path.join(&name));
                        }
                    }
                    self.send();
                }
                _ = ticker.tick() => {
                    self.resync();
                    self.send();
                }
                _ = self.tx.closed() => return Ok(WatchEnd::Closed),
            }
        }
    }

    /// Re-reads everything (upstream's periodic `resetStoreFromPath`).
    fn resync(&mut self) {
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "Unable to read config path");
                self.files.clear();
                return;
            }
        };
        if meta.is_file() {
            self.files.clear();
            let path = self.path.clone();
            self.refresh_file(&path);
            return;
        }
        if !meta.is_dir() {
            tracing::error!(path = %self.path.display(), "Unable to read config path: path is not a directory or file");
            self.files.clear();
            return;
        }
        let entries = match std::fs::read_dir(&self.path) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "Unable to read config path");
                return;
            }
        };
        let mut seen = BTreeSet::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if is_hidden(&path) {
                continue;
            }
            seen.insert(path.clone());
            self.refresh_file(&path);
        }
        self.files.retain(|p, _| seen.contains(p));
    }

    /// Re-reads one file of the directory, or forgets it if it is gone or not a regular file.
    fn refresh_file(&mut self, path: &Path) {
        if is_hidden(path) {
            tracing::trace!(path = %path.display(), "Ignored pod manifest, because it starts with dots");
            return;
        }
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(_) => {
                self.files.remove(path);
                return;
            }
        };
        if meta.is_dir() {
            if path != self.path {
                tracing::debug!(path = %path.display(), "Not recursing into manifest path");
            }
            self.files.remove(path);
            return;
        }
        if !meta.is_file() {
            tracing::warn!(path = %path.display(), "Manifest path is not a directory or file");
            self.files.remove(path);
            return;
        }
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "Can't process manifest file");
                self.files.remove(path);
                return;
            }
        };
        if data.iter().all(u8::is_ascii_whitespace) {
            // Typically a file caught between its creation and its first write.
            tracing::debug!(path = %path.display(), "Manifest file is empty");
            self.files.remove(path);
            return;
        }
        if self.files.get(path).is_some_and(|p| p.data == data) {
            return;
        }
        let path_str = path.to_string_lossy();
        let (pods, errors) =
            decode_manifest(&data, ManifestOrigin::File(&path_str), &self.node_name);
        for e in &errors {
            tracing::warn!(path = %path.display(), error = %e, "Can't process manifest file");
        }
        // A manifest edited into something invalid leaves the pod it defined running (a
        // control-plane component is not stopped by a typo), until the file is valid again
        // or removed.
        let pods = match self.files.get(path) {
            Some(prev) if pods.is_empty() && !errors.is_empty() && !prev.pods.is_empty() => {
                tracing::warn!(path = %path.display(), "the pods this manifest defined before keep running until it is valid again");
                prev.pods.clone()
            }
            _ => pods,
        };
        self.files.insert(path.to_path_buf(), Parsed { data, pods });
    }

    /// The pod set after resolving duplicate names: a name keeps the file that already had
    /// it; otherwise the first file in name order wins and the others are rejected.
    fn current_pods(&mut self) -> Vec<Pod> {
        let mut owners: HashMap<String, PathBuf> = HashMap::new();
        for (path, parsed) in &self.files {
            for p in &parsed.pods {
                let name = pod_full_name(p);
                if self.owners.get(&name) == Some(path) {
                    owners.insert(name, path.clone());
                }
            }
        }
        let mut out = Vec::new();
        let mut rejected = BTreeSet::new();
        for (path, parsed) in &self.files {
            let mut names_in_file = BTreeSet::new();
            for p in &parsed.pods {
                let name = pod_full_name(p);
                if !names_in_file.insert(name.clone()) {
                    if self.rejected.insert((path.clone(), name.clone())) {
                        tracing::warn!(path = %path.display(), pod = %name, "static pod rejected: the same manifest file defines a pod with this name more than once");
                    }
                    rejected.insert((path.clone(), name));
                    continue;
                }
                match owners.get(&name) {
                    Some(owner) if owner != path => {
                        if self.rejected.insert((path.clone(), name.clone())) {
                            tracing::warn!(
                                path = %path.display(),
                                pod = %name,
                                other = %owner.display(),
                                "static pod rejected: manifest {} defines pod {name}, which manifest {} already defines",
                                path.display(),
                                owner.display()
                            );
                        }
                        rejected.insert((path.clone(), name));
                        continue;
                    }
                    Some(_) => {}
                    None => {
                        owners.insert(name, path.clone());
                    }
                }
                out.push(p.clone());
            }
        }
        self.owners = owners;
        self.rejected.retain(|r| rejected.contains(r));
        out
    }

    fn send(&mut self) {
        let pods = self.current_pods();
        if self.last_sent.as_ref() == Some(&pods) {
            return;
        }
        if self.tx.send(pods.clone().into()).is_ok() {
            self.last_sent = Some(pods);
        }
    }
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .map(|n| n.to_string_lossy().starts_with('.'))
        .unwrap_or(false)
}
