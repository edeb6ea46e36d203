//! The result cache, in libcni's layout and format so that DEL and CHECK work after a restart
//! (and so that tools reading `/var/lib/cni/results` understand it):
//! `<cache_dir>/results/<network>-<container id>-<ifname>` holding
//! `{"kind":"cniCacheV1","containerId","config"(base64 of the conflist),"ifName",
//! "networkName","netns","cniArgs":[[k,v]],"capabilityArgs","result"}`.

use super::CniError;
use base64::Engine;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const CACHE_KIND: &str = "cniCacheV1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedInfo {
    pub kind: String,
    #[serde(rename = "containerId")]
    pub container_id: String,
    #[serde(serialize_with = "ser_b64", deserialize_with = "de_b64", default)]
    pub config: Vec<u8>,
    #[serde(rename = "ifName")]
    pub if_name: String,
    #[serde(rename = "networkName")]
    pub network_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub netns: String,
    #[serde(rename = "cniArgs", default, skip_serializing_if = "Vec::is_empty")]
    pub cni_args: Vec<[String; 2]>,
    #[serde(
        rename = "capabilityArgs",
        default,
        skip_serializing_if = "Map::is_empty"
    )]
    pub capability_args: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

fn ser_b64<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn de_b64<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    match s {
        None => Ok(Vec::new()),
        Some(s) => base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map_err(serde::de::Error::custom),
    }
}

/// The cache file of one attachment.
pub fn cache_file(cache_dir: &Path, network: &str, container_id: &str, ifname: &str) -> PathBuf {
    cache_dir
        .join("results")
        .join(format!("{network}-{container_id}-{ifname}"))
}

/// Writes the entry by rename (a reader never sees half of it), not synced, as libcni writes
/// its cache: an entry lost in a host crash describes a network namespace the crash removed
/// too, and DEL without an entry falls back to the network's configuration.
pub fn write(path: &Path, info: &CachedInfo) -> Result<(), CniError> {
    let err = |reason: String| CniError::Cache {
        path: path.to_path_buf(),
        reason,
    };
    let dir = path
        .parent()
        .ok_or_else(|| err("no parent directory".into()))?;
    fs::create_dir_all(dir).map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
    let bytes = serde_json::to_vec(info).map_err(|e| err(e.to_string()))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let res = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        fs::rename(&tmp, path)
    })();
    res.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        err(e.to_string())
    })
}

/// The cached entry, `None` when there is none.
pub fn read(path: &Path) -> Result<Option<CachedInfo>, CniError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(CniError::Cache {
                path: path.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    let info: CachedInfo = serde_json::from_slice(&bytes).map_err(|e| CniError::Cache {
        path: path.to_path_buf(),
        reason: format!("corrupt cache entry: {e}"),
    })?;
    if info.kind != CACHE_KIND {
        return Err(CniError::Cache {
            path: path.to_path_buf(),
            reason: format!("unknown cache kind {:?}", info.kind),
        });
    }
    Ok(Some(info))
}

pub fn remove(path: &Path) -> Result<(), CniError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CniError::Cache {
            path: path.to_path_buf(),
            reason: format!("removing: {e}"),
        }),
    }
}

/// Every cached attachment of `container_id`, whatever network and interface. Unreadable
/// entries are skipped with a warning.
pub fn entries_for(cache_dir: &Path, container_id: &str) -> Vec<(PathBuf, CachedInfo)> {
    let dir = cache_dir.join("results");
    let Ok(rd) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let needle = format!("-{container_id}-");
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.contains(&needle) {
            continue;
        }
        let path = entry.path();
        match read(&path) {
            Ok(Some(info)) if info.container_id == container_id => out.push((path, info)),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(container_id, error = %e, "skipping unreadable CNI cache entry")
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sandbox_cni_cache_uses_libcni_format() {
        let tmp = tempfile::tempdir().unwrap();
        let path = cache_file(tmp.path(), "nodus", "abc", "eth0");
        assert!(path.ends_with("results/nodus-abc-eth0"));
        let info = CachedInfo {
            kind: CACHE_KIND.into(),
            container_id: "abc".into(),
            config: br#"{"name":"nodus"}"#.to_vec(),
            if_name: "eth0".into(),
            network_name: "nodus".into(),
            netns: "/x/net".into(),
            cni_args: vec![["K8S_POD_NAME".into(), "p".into()]],
            capability_args: json!({"portMappings": []}).as_object().unwrap().clone(),
            result: Some(json!({"cniVersion": "1.0.0"})),
        };
        write(&path, &info).unwrap();
        let on_disk: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(on_disk["kind"], "cniCacheV1");
        assert_eq!(on_disk["containerId"], "abc");
        assert_eq!(on_disk["config"], "eyJuYW1lIjoibm9kdXMifQ==");
        assert_eq!(on_disk["ifName"], "eth0");
        assert_eq!(on_disk["networkName"], "nodus");
        assert_eq!(on_disk["cniArgs"], json!([["K8S_POD_NAME", "p"]]));
        assert_eq!(read(&path).unwrap().unwrap(), info);

        // Another container whose id contains ours is not ours.
        let mut other = info.clone();
        other.container_id = "x-abc-y".into();
        write(&cache_file(tmp.path(), "nodus", "x-abc-y", "eth0"), &other).unwrap();
        let entries = entries_for(tmp.path(), "abc");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].0, path);

        fs::write(cache_file(tmp.path(), "n", "abc", "lo"), "{oops").unwrap();
        assert!(read(&cache_file(tmp.path(), "n", "abc", "lo")).is_err());
        assert_eq!(entries_for(tmp.path(), "abc").len(), 1);

        remove(&path).unwrap();
        remove(&path).unwrap();
        assert_eq!(read(&path).unwrap(), None);
    }
}
