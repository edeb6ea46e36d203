//! RemoveImage: idempotent (an absent image succeeds); an image a container uses is
//! refused; blobs and snapshots no other image needs are collected.

use super::{image_name, status};
use crate::image::manager::ImageManager;
use cri::runtime::v1 as pb;
use tonic::Status;

pub fn remove_image(
    images: &ImageManager,
    req: pb::RemoveImageRequest,
) -> Result<pb::RemoveImageResponse, Status> {
    let name = image_name("RemoveImage", req.image.as_ref())?;
    images.remove(&name).map_err(|e| status("RemoveImage", e))?;
    Ok(pb::RemoveImageResponse {})
}
