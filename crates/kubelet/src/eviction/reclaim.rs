//! Node-level reclaim before evicting pods (upstream's signalToNodeReclaimFuncs): for disk
//! signals on the filesystem that holds the images, delete the images no container uses
//! (upstream's imageGC.DeleteUnusedImages). Pinned images are kept.

use super::thresholds::Signal;
use cri::runtime::v1 as pb;
use std::collections::HashSet;

/// Whether reclaiming images can help `signal`: image filesystem signals always, node
/// filesystem signals when the images live on the node filesystem.
pub fn images_help(signal: Signal, dedicated_image_fs: bool) -> bool {
    match signal {
        Signal::ImageFsAvailable | Signal::ImageFsInodesFree => true,
        Signal::NodeFsAvailable | Signal::NodeFsInodesFree => !dedicated_image_fs,
        _ => false,
    }
}

/// The ids of the images no container (running or exited) refers to, pinned ones aside.
pub fn unused_images(images: &[pb::Image], containers: &[pb::Container]) -> Vec<String> {
    let mut used: HashSet<&str> = HashSet::new();
    for c in containers {
        used.insert(c.image_ref.as_str());
        if let Some(spec) = &c.image {
            used.insert(spec.image.as_str());
        }
    }
    images
        .iter()
        .filter(|i| !i.pinned)
        .filter(|i| {
            !used.contains(i.id.as_str())
                && !i.repo_tags.iter().any(|t| used.contains(t.as_str()))
                && !i.repo_digests.iter().any(|d| used.contains(d.as_str()))
        })
        .map(|i| i.id.clone())
        .collect()
}

/// Removes every unused image; returns how many bytes the runtime said they held.
pub async fn delete_unused_images(rt: &crate::cri::Runtime) -> Result<u64, tonic::Status> {
    let images = rt
        .image
        .clone()
        .list_images(pb::ListImagesRequest { filter: None })
        .await?
        .into_inner()
        .images;
    let containers = rt
        .runtime
        .clone()
        .list_containers(pb::ListContainersRequest { filter: None })
        .await?
        .into_inner()
        .containers;
    let mut freed = 0;
    for id in unused_images(&images, &containers) {
        let size = images.iter().find(|i| i.id == id).map_or(0, |i| i.size);
        match rt
            .image
            .clone()
            .remove_image(pb::RemoveImageRequest {
                image: Some(pb::ImageSpec {
                    image: id.clone(),
                    ..Default::default()
                }),
            })
            .await
        {
            Ok(_) => {
                tracing::info!(image = %id, size, "Eviction manager: removed unused image");
                freed += size;
            }
            Err(e) => {
                tracing::info!(image = %id, error = %e.message(), "Eviction manager: cannot remove unused image")
            }
        }
    }
    Ok(freed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, tag: &str, pinned: bool) -> pb::Image {
        pb::Image {
            id: id.into(),
            repo_tags: vec![tag.into()],
            pinned,
            ..Default::default()
        }
    }

    fn container(image_ref: &str, image: &str) -> pb::Container {
        pb::Container {
            image_ref: image_ref.into(),
            image: Some(pb::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_images_no_container_uses_and_not_pinned_go() {
        let images = [
            image("sha256:a", "busybox:latest", false),
            image("sha256:b", "nginx:1", false),
            image("sha256:c", "pause:3", true),
            image("sha256:d", "old:1", false),
        ];
        let containers = [
            container("sha256:a", "busybox:latest"),
            container("", "nginx:1"),
        ];
        assert_eq!(unused_images(&images, &containers), ["sha256:d"]);
    }

    #[test]
    fn images_help_disk_signals_on_their_filesystem() {
        assert!(images_help(Signal::ImageFsAvailable, true));
        assert!(images_help(Signal::NodeFsAvailable, false));
        assert!(!images_help(Signal::NodeFsAvailable, true));
        assert!(!images_help(Signal::MemoryAvailable, false));
    }
}
