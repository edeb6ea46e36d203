//! PullImage: resolve, download (verified), unpack, record; answers the image id.

use super::{image_name, status};
use crate::image::distribution::Credentials;
use crate::image::manager::ImageManager;
use cri::runtime::v1 as pb;
use std::sync::Arc;
use tonic::Status;

pub async fn pull_image(
    images: &Arc<ImageManager>,
    req: pb::PullImageRequest,
) -> Result<pb::PullImageResponse, Status> {
    let name = image_name("PullImage", req.image.as_ref())?;
    let creds = req.auth.map(Credentials::from).unwrap_or_default();
    let rec = images
        .pull(&name, creds)
        .await
        .map_err(|e| status("PullImage", e))?;
    Ok(pb::PullImageResponse {
        image_ref: rec.id.to_string(),
    })
}
