//! ListImages: every image, or those matching the filter's reference (tag, digest or id).

use super::{status, to_cri};
use crate::image::manager::ImageManager;
use cri::runtime::v1 as pb;
use tonic::Status;

pub fn list_images(
    images: &ImageManager,
    req: pb::ListImagesRequest,
) -> Result<pb::ListImagesResponse, Status> {
    let filter = req
        .filter
        .and_then(|f| f.image)
        .map(|s| s.image)
        .filter(|s| !s.is_empty());
    let list = match filter {
        None => images.list().map_err(|e| status("ListImages", e))?,
        Some(f) => images
            .resolve(&f)
            .map_err(|e| status("ListImages", e))?
            .into_iter()
            .collect(),
    };
    Ok(pb::ListImagesResponse {
        images: list.iter().map(to_cri).collect(),
    })
}
