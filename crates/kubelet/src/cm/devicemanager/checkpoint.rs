//! The device manager's checkpoint, `device-plugins/kubelet_internal_checkpoint`, in
//! upstream's JSON layout: `{"Data":{"PodDeviceEntries":[…],"RegisteredDevices":{…}},
//! "Checksum":N}`, each entry carrying the pod UID, container, resource, the device IDs by
//! NUMA node (`"-1"` without topology) and the plugin's AllocateResponse as base64 protobuf.
//!
//! The checksum is [`crate::cm::checksum`] over the `Data` object.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub const FILE: &str = "kubelet_internal_checkpoint";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodDevicesEntry {
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    #[serde(rename = "ContainerName")]
    pub container_name: String,
    #[serde(rename = "ResourceName")]
    pub resource_name: String,
    /// NUMA node (as a string, `-1` for none) → device IDs.
    #[serde(rename = "DeviceIDs")]
    pub device_ids: BTreeMap<String, Vec<String>>,
    /// The encoded `ContainerAllocateResponse`.
    #[serde(rename = "AllocResp", with = "b64")]
    pub alloc_resp: Vec<u8>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointData {
    #[serde(rename = "PodDeviceEntries", default)]
    pub pod_device_entries: Vec<PodDevicesEntry>,
    #[serde(rename = "RegisteredDevices", default)]
    pub registered_devices: BTreeMap<String, Vec<String>>,
}

#[derive(Serialize, Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: CheckpointData,
    #[serde(rename = "Checksum")]
    checksum: u64,
}

mod b64 {
    use base64::Engine as _;
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s: Option<String> = serde::Deserialize::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s.unwrap_or_default())
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("checkpoint is corrupted")]
    Corrupt,
}

fn checksum(data: &CheckpointData) -> Result<u64, serde_json::Error> {
    crate::cm::checksum::of_json(data)
}

/// Writes `bytes` to `dir/name` atomically (a temporary file renamed over the old one), as
/// every checkpoint of the kubelet is written.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(name))
}

/// Writes the checkpoint atomically.
pub fn write(dir: &Path, data: &CheckpointData) -> Result<(), CheckpointError> {
    let file = File {
        checksum: checksum(data)?,
        data: data.clone(),
    };
    write_atomic(dir, FILE, &serde_json::to_vec(&file)?)?;
    Ok(())
}

/// Reads the checkpoint; `Ok(None)` when there is none.
pub fn read(dir: &Path) -> Result<Option<CheckpointData>, CheckpointError> {
    let bytes = match std::fs::read(dir.join(FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let file: File = serde_json::from_slice(&bytes)?;
    if checksum(&file.data)? != file.checksum {
        return Err(CheckpointError::Corrupt);
    }
    Ok(Some(file.data))
}

/// The base64 text of an AllocateResponse as stored (for tests and debugging).
pub fn encode_b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_upstreams_layout_and_detects_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let data = CheckpointData {
            pod_device_entries: vec![PodDevicesEntry {
                pod_uid: "u1".into(),
                container_name: "c".into(),
                resource_name: "devices.nodus.dev/fuse".into(),
                device_ids: BTreeMap::from([("-1".into(), vec!["fuse".into()])]),
                alloc_resp: vec![1, 2, 3],
            }],
            registered_devices: BTreeMap::from([(
                "devices.nodus.dev/fuse".into(),
                vec!["fuse".into()],
            )]),
        };
        write(dir.path(), &data).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["Data"]["PodDeviceEntries"][0]["PodUID"], "u1");
        assert_eq!(
            v["Data"]["PodDeviceEntries"][0]["DeviceIDs"]["-1"][0],
            "fuse"
        );
        assert_eq!(
            v["Data"]["PodDeviceEntries"][0]["AllocResp"],
            encode_b64(&[1, 2, 3])
        );
        assert!(v["Checksum"].is_u64());
        assert_eq!(read(dir.path()).unwrap(), Some(data));
        std::fs::write(dir.path().join(FILE), text.replace("\"u1\"", "\"u2\"")).unwrap();
        assert!(matches!(read(dir.path()), Err(CheckpointError::Corrupt)));
        assert_eq!(read(tempfile::tempdir().unwrap().path()).unwrap(), None);
    }
}
