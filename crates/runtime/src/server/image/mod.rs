//! ImageService: one file per RPC.

mod image_fs_info;
mod image_status;
mod list_images;
mod pull_image;
mod remove_image;

use crate::image::manager::ImageManager;
use crate::image::store::ImageRecord;
use crate::image::{ErrorKind, ImageError};
use cri::runtime::v1 as pb;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct ImageService {
    images: Arc<ImageManager>,
}

impl ImageService {
    pub fn new(images: Arc<ImageManager>) -> Self {
        Self { images }
    }
}

/// Maps the image subsystem's error kinds to gRPC codes, and logs the one line an operator
/// needs to see.
pub(crate) fn status(rpc: &str, e: ImageError) -> Status {
    let code = match e.kind {
        ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorKind::NotFound => tonic::Code::NotFound,
        ErrorKind::Unauthenticated => tonic::Code::Unauthenticated,
        ErrorKind::Unavailable => tonic::Code::Unavailable,
        // containerd answers FailedPrecondition ("unexpected commit digest") for content
        // that does not match its digest; kubelets and scripts see the same code from us.
        ErrorKind::DataLoss => tonic::Code::FailedPrecondition,
        ErrorKind::InUse => tonic::Code::FailedPrecondition,
        ErrorKind::Internal => tonic::Code::Internal,
    };
    tracing::warn!(rpc, code = ?code, error = %e.message, "request failed");
    Status::new(code, e.message.to_string())
}

/// containerd's rule: `config.User` is "user[:group]"; a numeric user is a uid, anything
/// else a name.
fn user_of(user: &str) -> (Option<i64>, String) {
    let u = user.split(':').next().unwrap_or("");
    if u.is_empty() {
        return (None, String::new());
    }
    match u.parse::<i64>() {
        Ok(uid) => (Some(uid), String::new()),
        Err(_) => (None, u.to_string()),
    }
}

/// The CRI view of an image record.
pub(crate) fn to_cri(rec: &ImageRecord) -> pb::Image {
    let (uid, username) = user_of(&rec.user);
    pb::Image {
        id: rec.id.to_string(),
        repo_tags: rec.repo_tags.clone(),
        repo_digests: rec.repo_digests.clone(),
        size: rec.size,
        uid: uid.map(|value| pb::Int64Value { value }),
        username,
        spec: Some(pb::ImageSpec {
            image: rec.id.to_string(),
            annotations: rec.annotations.clone().into_iter().collect(),
            ..Default::default()
        }),
        pinned: rec.pinned,
    }
}

/// The image name a request carries, refusing an empty one as the CRI requires.
fn image_name(rpc: &str, spec: Option<&pb::ImageSpec>) -> Result<String, Status> {
    match spec.map(|s| s.image.trim()) {
        Some(s) if !s.is_empty() => Ok(s.to_string()),
        _ => {
            let e = ImageError::new(
                ErrorKind::InvalidArgument,
                "image spec is empty: an image name is required",
            );
            Err(status(rpc, e))
        }
    }
}

#[tonic::async_trait]
impl pb::image_service_server::ImageService for ImageService {
    async fn list_images(
        &self,
        req: Request<pb::ListImagesRequest>,
    ) -> Result<Response<pb::ListImagesResponse>, Status> {
        list_images::list_images(&self.images, req.into_inner()).map(Response::new)
    }

    async fn image_status(
        &self,
        req: Request<pb::ImageStatusRequest>,
    ) -> Result<Response<pb::ImageStatusResponse>, Status> {
        image_status::image_status(&self.images, req.into_inner()).map(Response::new)
    }

    async fn pull_image(
        &self,
        req: Request<pb::PullImageRequest>,
    ) -> Result<Response<pb::PullImageResponse>, Status> {
        pull_image::pull_image(&self.images, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn remove_image(
        &self,
        req: Request<pb::RemoveImageRequest>,
    ) -> Result<Response<pb::RemoveImageResponse>, Status> {
        let images = Arc::clone(&self.images);
        let req = req.into_inner();
        // GC walks the disk: keep it off the async workers.
        tokio::task::spawn_blocking(move || remove_image::remove_image(&images, req))
            .await
            .map_err(|e| Status::internal(format!("remove task failed: {e}")))?
            .map(Response::new)
    }

    async fn image_fs_info(
        &self,
        req: Request<pb::ImageFsInfoRequest>,
    ) -> Result<Response<pb::ImageFsInfoResponse>, Status> {
        let images = Arc::clone(&self.images);
        let req = req.into_inner();
        tokio::task::spawn_blocking(move || image_fs_info::image_fs_info(&images, req))
            .await
            .map_err(|e| Status::internal(format!("fs info task failed: {e}")))?
            .map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_follow_containerd() {
        assert_eq!(user_of(""), (None, String::new()));
        assert_eq!(user_of("1000"), (Some(1000), String::new()));
        assert_eq!(user_of("1000:1000"), (Some(1000), String::new()));
        assert_eq!(user_of("app:staff"), (None, "app".to_string()));
    }
}
