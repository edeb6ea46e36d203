//! The static pod directory source against a real directory: inotify delivers writes,
//! modifications, deletions and renames; bad manifests and duplicate names are skipped.

use k8s_openapi::api::core::v1::Pod;
use nodus_kubelet::config::{
    CONFIG_SOURCE_ANNOTATION, FILE_SOURCE, PodConfig, PodOperation, PodUpdate, spawn_file_source,
};
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// Long enough that only inotify, not the periodic re-read, can explain an update.
const NO_RESYNC: Duration = Duration::from_secs(3600);
const WAIT: Duration = Duration::from_secs(30);

fn manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: kube-system\nspec:\n  containers:\n  - name: main\n    image: {image}\n"
    )
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

fn image(p: &Pod) -> String {
    p.spec.as_ref().unwrap().containers[0]
        .image
        .clone()
        .unwrap_or_default()
}

/// Waits for the next update with this operation (others are skipped).
async fn next_op(rx: &mut UnboundedReceiver<PodUpdate>, op: PodOperation) -> PodUpdate {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(u)) if u.op == op => return u,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("pod config stream ended while waiting for {op:?}"),
            Err(_) => panic!("no {op:?} update within {WAIT:?}"),
        }
    }
}

fn write(dir: &Path, file: &str, content: &str) {
    std::fs::write(dir.join(file), content).unwrap();
}

#[tokio::test]
async fn writes_modifications_and_deletions_arrive_as_updates() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "web.yaml", &manifest("web", "nginx:1.27"));
    let (config, mut rx) = PodConfig::new();
    let tx = config.channel(FILE_SOURCE);
    let _source = spawn_file_source(dir.path().to_path_buf(), "node-a".into(), NO_RESYNC, tx);

    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["web-node-a"]);
    assert_eq!(add.source, "file");
    let first = &add.pods[0];
    assert_eq!(
        first
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(CONFIG_SOURCE_ANNOTATION)
            .map(String::as_str),
        Some("file")
    );
    assert!(config.seen_all_sources(&[FILE_SOURCE]));
    let old_uid = first.metadata.uid.clone().unwrap();

    // A new file.
    write(
        dir.path(),
        "db.json",
        &serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "db"},
            "spec": {"containers": [{"name": "main", "image": "postgres:17"}]}
        })
        .to_string(),
    );
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["db-node-a"]);
    assert_eq!(add.pods[0].metadata.namespace.as_deref(), Some("default"));

    // A modification: the content hash is the UID, so the old pod goes and a new one comes.
    write(dir.path(), "web.yaml", &manifest("web", "nginx:1.28"));
    let remove = next_op(&mut rx, PodOperation::Remove).await;
    assert_eq!(
        remove.pods[0].metadata.uid.as_deref(),
        Some(old_uid.as_str())
    );
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["web-node-a"]);
    assert_eq!(image(&add.pods[0]), "nginx:1.28");
    assert_ne!(add.pods[0].metadata.uid.as_deref(), Some(old_uid.as_str()));

    // A deletion.
    std::fs::remove_file(dir.path().join("db.json")).unwrap();
    let remove = next_op(&mut rx, PodOperation::Remove).await;
    assert_eq!(names(&remove.pods), vec!["db-node-a"]);

    // An editor's save: write a temp file, rename it over the manifest.
    write(dir.path(), ".web.yaml.swp", &manifest("web", "nginx:1.29"));
    std::fs::rename(
        dir.path().join(".web.yaml.swp"),
        dir.path().join("web.yaml"),
    )
    .unwrap();
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(image(&add.pods[0]), "nginx:1.29");
    let names_now = names(&config.pods());
    assert_eq!(names_now, vec!["web-node-a"]);
}

#[tokio::test]
async fn bad_manifests_dotfiles_and_duplicates_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a-good.yaml", &manifest("good", "busybox"));
    write(
        dir.path(),
        "b-broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [\n",
    );
    write(
        dir.path(),
        "c-noname.yaml",
        &manifest("", "busybox").replace("  name: \n", ""),
    );
    write(dir.path(), ".hidden.yaml", &manifest("hidden", "busybox"));
    write(dir.path(), "d-dup.yaml", &manifest("good", "other"));
    std::fs::create_dir(dir.path().join("subdir")).unwrap();
    write(
        &dir.path().join("subdir"),
        "nested.yaml",
        &manifest("nested", "busybox"),
    );

    let (config, mut rx) = PodConfig::new();
    let _source = spawn_file_source(
        dir.path().to_path_buf(),
        "node-a".into(),
        NO_RESYNC,
        config.channel(FILE_SOURCE),
    );
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["good-node-a"]);
    assert_eq!(
        image(&add.pods[0]),
        "busybox",
        "the first file keeps the name"
    );

    // Fixing the broken file brings its pod; the duplicate is still refused.
    write(dir.path(), "b-broken.yaml", &manifest("fixed", "busybox"));
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["fixed-node-a"]);

    // A file that defines a name already taken does not displace the owner, even when it
    // sorts first.
    write(dir.path(), "0-dup.yaml", &manifest("fixed", "intruder"));
    write(dir.path(), "e-marker.yaml", &manifest("marker", "busybox"));
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["marker-node-a"]);
    let pods = config.pods();
    let fixed = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("fixed-node-a"))
        .expect("fixed pod still there");
    assert_eq!(image(fixed), "busybox");

    // When the owner goes, the duplicate takes over.
    std::fs::remove_file(dir.path().join("a-good.yaml")).unwrap();
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["good-node-a"]);
    assert_eq!(image(&add.pods[0]), "other");
}

#[tokio::test]
async fn a_missing_directory_is_waited_for() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("manifests");
    let (config, mut rx) = PodConfig::new();
    let _source = spawn_file_source(
        dir.clone(),
        "node-a".into(),
        NO_RESYNC,
        config.channel(FILE_SOURCE),
    );
    // The source reports an empty set so the kubelet does not wait for it forever.
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert!(add.pods.is_empty());
    assert!(config.seen_all_sources(&[FILE_SOURCE]));

    std::fs::create_dir(&dir).unwrap();
    write(&dir, "late.yaml", &manifest("late", "busybox"));
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["late-node-a"]);

    // The directory removed and created again: the source follows it.
    std::fs::remove_dir_all(&dir).unwrap();
    let remove = next_op(&mut rx, PodOperation::Remove).await;
    assert_eq!(names(&remove.pods), vec!["late-node-a"]);
    std::fs::create_dir(&dir).unwrap();
    write(&dir, "again.yaml", &manifest("again", "busybox"));
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["again-node-a"]);
}

#[tokio::test]
async fn a_single_manifest_file_is_a_valid_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("only.yaml");
    std::fs::write(&file, manifest("only", "busybox:1")).unwrap();
    let (config, mut rx) = PodConfig::new();
    let _source = spawn_file_source(
        file.clone(),
        "node-a".into(),
        NO_RESYNC,
        config.channel(FILE_SOURCE),
    );
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["only-node-a"]);

    // Replaced the way editors and `kubectl`-style tools do: a new file renamed over it.
    let tmp = dir.path().join("only.yaml.new");
    std::fs::write(&tmp, manifest("only", "busybox:2")).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(image(&add.pods[0]), "busybox:2");
}

#[tokio::test]
async fn a_manifest_edited_into_something_invalid_keeps_its_pod_until_it_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "api.yaml", &manifest("api", "img:1"));
    let (config, mut rx) = PodConfig::new();
    let tx = config.channel(FILE_SOURCE);
    let _source = spawn_file_source(dir.path().to_path_buf(), "node-a".into(), NO_RESYNC, tx);
    let add = next_op(&mut rx, PodOperation::Add).await;
    let uid = add.pods[0].metadata.uid.clone().unwrap();

    // A typo: the file no longer parses, and the running pod stays.
    write(
        dir.path(),
        "api.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [\n",
    );
    // A second file proves the source has read the directory since the typo.
    write(dir.path(), "other.yaml", &manifest("other", "img:1"));
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add.pods), vec!["other-node-a"]);
    let pods = config.pods();
    assert!(
        pods.iter()
            .any(|p| p.metadata.uid.as_deref() == Some(uid.as_str())),
        "{:?}",
        names(&pods)
    );

    // Fixed: the new definition replaces the old pod.
    write(dir.path(), "api.yaml", &manifest("api", "img:2"));
    let remove = next_op(&mut rx, PodOperation::Remove).await;
    assert_eq!(remove.pods[0].metadata.uid.as_deref(), Some(uid.as_str()));
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(image(&add.pods[0]), "img:2");
}
