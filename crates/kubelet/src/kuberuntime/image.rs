//! Pulling images by pull policy, with back-off (upstream's images.imageManager).

use super::backoff::Backoff;
use crate::cri::Runtime;
use crate::events::{NORMAL, WARNING, recorder};
use cri::runtime::v1 as pb;
use k8s_openapi::api::core::v1::{Container, ObjectReference};
use std::sync::Mutex;
use std::time::Instant;

/// A pull that did not produce an image, with the waiting reason the pod status shows.
#[derive(Debug, Clone)]
pub struct PullError {
    pub reason: &'static str,
    pub message: String,
}

/// The effective pull policy: the container's, else upstream's default by tag.
pub fn pull_policy(c: &Container) -> &str {
    if let Some(p) = c.image_pull_policy.as_deref() {
        return p;
    }
    let image = c.image.as_deref().unwrap_or_default();
    let name = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        "IfNotPresent"
    } else {
        match name.split_once(':') {
            Some((_, "latest")) | None => "Always",
            Some(_) => "IfNotPresent",
        }
    }
}

async fn present(rt: &Runtime, image: &str) -> Result<Option<String>, tonic::Status> {
    let r = rt
        .image
        .clone()
        .image_status(pb::ImageStatusRequest {
            image: Some(pb::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await?
        .into_inner();
    Ok(r.image.map(|i| i.id))
}

/// Makes sure `c`'s image is present; returns the image reference to create from. Events
/// (Pulling, Pulled, Failed, BackOff, ErrImageNeverPull) go to `obj`, the container.
pub(crate) async fn ensure_image(
    rt: &Runtime,
    backoff: &Mutex<Backoff>,
    pod_uid: &str,
    c: &Container,
    obj: &ObjectReference,
    permit: &super::start_permit::StartPermit,
) -> Result<String, PullError> {
    let image = c.image.clone().unwrap_or_default();
    if image.is_empty() {
        return Err(PullError {
            reason: "InvalidImageName",
            message: format!("container {:?} has no image", c.name),
        });
    }
    let policy = pull_policy(c);
    let have = present(rt, &image).await.map_err(|e| PullError {
        reason: "ErrImageInspect",
        message: format!("Failed to inspect image {image:?}: {}", e.message()),
    })?;
    match (policy, &have) {
        ("Never", None) => {
            let message =
                format!("Container image {image:?} is not present with pull policy of Never");
            recorder().event(obj, WARNING, "ErrImageNeverPull", &message);
            return Err(PullError {
                reason: "ErrImageNeverPull",
                message,
            });
        }
        ("Never", Some(id)) | ("IfNotPresent", Some(id)) => {
            recorder().event(
                obj,
                NORMAL,
                "Pulled",
                &format!("Container image {image:?} already present on machine"),
            );
            return Ok(id.clone());
        }
        _ => {}
    }
    let key = format!("{pod_uid}_{image}");
    let now = Instant::now();
    if let Ok(b) = backoff.lock()
        && b.in_backoff_since_update(&key, now)
    {
        let message = format!("Back-off pulling image {image:?}");
        recorder().event(obj, NORMAL, "BackOff", &message);
        return Err(PullError {
            reason: "ImagePullBackOff",
            message,
        });
    }
    // A pull waits on the registry, not on this node: other pods start meanwhile.
    permit.release();
    let started = Instant::now();
    recorder().event(obj, NORMAL, "Pulling", &format!("Pulling image {image:?}"));
    match rt
        .image
        .clone()
        .pull_image(pb::PullImageRequest {
            image: Some(pb::ImageSpec {
                image: image.clone(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
    {
        Ok(r) => {
            if let Ok(mut b) = backoff.lock() {
                b.reset(&key);
            }
            tracing::info!(image = %image, took = ?started.elapsed(), "pulled image");
            let took = crate::pleg::go_duration(started.elapsed());
            recorder().event(
                obj,
                NORMAL,
                "Pulled",
                &format!(
                    "Successfully pulled image {image:?} in {took} ({took} including waiting)"
                ),
            );
            Ok(r.into_inner().image_ref)
        }
        Err(e) => {
            if let Ok(mut b) = backoff.lock() {
                b.next(&key, Instant::now());
            }
            let message = format!("failed to pull and unpack image {image:?}: {}", e.message());
            recorder().event(
                obj,
                WARNING,
                "Failed",
                &format!("Failed to pull image {image:?}: {message}"),
            );
            Err(PullError {
                reason: "ErrImagePull",
                message,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn default_policy_follows_the_tag() {
        assert_eq!(pull_policy(&c("busybox", None)), "Always");
        assert_eq!(pull_policy(&c("busybox:latest", None)), "Always");
        assert_eq!(pull_policy(&c("busybox:1.36", None)), "IfNotPresent");
        assert_eq!(pull_policy(&c("localhost:5000/busybox", None)), "Always");
        assert_eq!(pull_policy(&c("busybox@sha256:abc", None)), "IfNotPresent");
        assert_eq!(pull_policy(&c("busybox", Some("Never"))), "Never");
    }
}
