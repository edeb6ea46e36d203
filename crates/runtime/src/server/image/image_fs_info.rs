//! ImageFsInfo: bytes and inodes the image store really uses on disk (content blobs plus
//! unpacked snapshots), which the kubelet's image GC and eviction manager act on.

use super::status;
use crate::image::manager::ImageManager;
use cri::runtime::v1 as pb;
use tonic::Status;

pub fn image_fs_info(
    images: &ImageManager,
    _req: pb::ImageFsInfoRequest,
) -> Result<pb::ImageFsInfoResponse, Status> {
    let usage = images.fs_usage().map_err(|e| status("ImageFsInfo", e))?;
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let fs = pb::FilesystemUsage {
        timestamp,
        fs_id: Some(pb::FilesystemIdentifier {
            mountpoint: images.fs_mountpoint().display().to_string(),
        }),
        used_bytes: Some(pb::UInt64Value {
            value: usage.used_bytes,
        }),
        inodes_used: Some(pb::UInt64Value {
            value: usage.inodes_used,
        }),
    };
    Ok(pb::ImageFsInfoResponse {
        image_filesystems: vec![fs.clone()],
        // Container writable layers live on the same filesystem (as with containerd's
        // overlayfs snapshotter), so the same figures describe it.
        container_filesystems: vec![fs],
    })
}
