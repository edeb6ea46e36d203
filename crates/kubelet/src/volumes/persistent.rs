//! `persistentVolumeClaim` volumes: the claim is resolved through the API to its bound
//! PersistentVolume (the Node authorizer allows a node the claims of its pods and their
//! volumes), and the volume's `hostPath` or `local` path is what the containers mount.
//! While the claim is not Bound the pod waits in ContainerCreating, the FailedMount event
//! saying why, as upstream's volume manager does.
//!
//! Volumes of k3s's local-path provisioner (`pv.kubernetes.io/provisioned-by:
//! rancher.io/local-path`) are directories this kubelet makes on first mount and records
//! under `<root-dir>/local-path/<pv name>` (the file holds the directory's path). At
//! housekeeping, a recorded volume whose PV the API server no longer has (reclaim policy
//! Delete removed it) has its directory removed, which is what local-path's teardown
//! helper pod does under k3s.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

/// The provisioner whose directories this kubelet owns.
pub const LOCAL_PATH_PROVISIONER: &str = "rancher.io/local-path";

/// What one claim resolves to on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimMount {
    pub volume: String,
    pub path: PathBuf,
    /// The hostPath `type` to check (`DirectoryOrCreate` makes the directory).
    pub host_path_type: String,
    /// Made by the local-path provisioner: recorded for removal once the PV is gone.
    pub local_path: bool,
    /// The volume source's `readOnly`.
    pub read_only: bool,
}

/// Resolves the claim `ns/name` to its volume's path, or says why the pod must wait.
pub async fn resolve(
    client: &kube::Client,
    ns: &str,
    claim: &str,
    read_only: bool,
) -> Result<ClaimMount, String> {
    let claims: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(client.clone(), ns);
    let pvc = claims
        .get(claim)
        .await
        .map_err(|e| format!("error processing PVC {ns}/{claim}: {}", api_message(&e)))?;
    let phase = pvc
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let volume = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    if phase != "Bound" || volume.is_empty() {
        return Err(format!(
            "error processing PVC {ns}/{claim}: PVC is not bound"
        ));
    }
    let pvs: kube::Api<PersistentVolume> = kube::Api::all(client.clone());
    let pv = pvs.get(&volume).await.map_err(|e| {
        format!(
            "error processing PVC {ns}/{claim}: failed to fetch PV {volume:?} from API server: {}",
            api_message(&e)
        )
    })?;
    let spec = pv.spec.unwrap_or_default();
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    if let Some(r) = &spec.claim_ref
        && r.uid.as_deref().is_some_and(|u| !u.is_empty() && u != uid)
    {
        return Err(format!(
            "error processing PVC {ns}/{claim}: PV {volume:?} is bound to another claim"
        ));
    }
    let local_path = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
        .is_some_and(|p| p == LOCAL_PATH_PROVISIONER);
    let (path, host_path_type) = if let Some(h) = spec.host_path {
        (h.path, h.type_.unwrap_or_default())
    } else if let Some(l) = spec.local {
        (l.path, "Directory".to_string())
    } else {
        return Err(format!(
            "error processing PVC {ns}/{claim}: PV {volume:?} has a volume source nodus's kubelet does not support (only hostPath and local)"
        ));
    };
    Ok(ClaimMount {
        volume,
        path: PathBuf::from(path),
        host_path_type,
        local_path,
        read_only,
    })
}

fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

fn records(root: &Path) -> PathBuf {
    root.join("local-path")
}

/// Remembers that `m.path` is a local-path directory of this node.
pub fn record(root: &Path, m: &ClaimMount) -> std::io::Result<()> {
    if !m.local_path {
        return Ok(());
    }
    let dir = records(root);
    std::fs::create_dir_all(&dir)?;
    let f = dir.join(&m.volume);
    if std::fs::read_to_string(&f).ok().as_deref() == Some(&*m.path.to_string_lossy()) {
        return Ok(());
    }
    std::fs::write(f, m.path.to_string_lossy().as_bytes())
}

/// Removes the directories of recorded local-path volumes whose PV is gone (404).
/// A claim cannot be deleted while a pod uses it (pvc-protection), and its PV not before
/// the claim, so a gone PV means no pod needs the directory any more.
pub async fn clean_up(root: &Path, client: &kube::Client) {
    let pvs: kube::Api<PersistentVolume> = kube::Api::all(client.clone());
    for e in std::fs::read_dir(records(root))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        match pvs.get(&name).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            _ => continue,
        }
        let Ok(path) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let path = PathBuf::from(path.trim());
        tracing::info!(volume = %name, dir = %path.display(), "removing the directory of a deleted local-path volume");
        match std::fs::remove_dir_all(&path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(volume = %name, error = %err, "cannot remove local-path directory");
                continue;
            }
            _ => {}
        }
        let _ = std::fs::remove_file(e.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_local_path_volumes() {
        let d = tempfile::tempdir().unwrap();
        let mut m = ClaimMount {
            volume: "pvc-1".into(),
            path: d.path().join("storage/pvc-1_default_data"),
            host_path_type: "DirectoryOrCreate".into(),
            local_path: false,
            read_only: false,
        };
        record(d.path(), &m).unwrap();
        assert!(!d.path().join("local-path/pvc-1").exists());
        m.local_path = true;
        record(d.path(), &m).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("local-path/pvc-1")).unwrap(),
            m.path.to_string_lossy()
        );
    }
}
