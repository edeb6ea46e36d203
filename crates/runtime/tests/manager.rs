//! The image manager without a registry: archives imported, images in use protected,
//! garbage collection of what nothing references.

use nodus_runtime::config::RuntimeConfig;
use nodus_runtime::image::ErrorKind;
use nodus_runtime::image::manager::{ImageManager, ImageManagerConfig};

fn have_root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root && std::env::var_os("NODUS_TEST_REQUIRE_ROOT").is_some() {
        panic!("this test needs root and NODUS_TEST_REQUIRE_ROOT is set");
    }
    root
}

#[tokio::test(flavor = "multi_thread")]
async fn images_in_use_cannot_be_removed_and_gc_keeps_shared_content() {
    if !have_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mgr = ImageManager::open(ImageManagerConfig::new(
        &dir.path().join("root"),
        &RuntimeConfig::default(),
    ))
    .unwrap();
    let a = dir.path().join("a.tar");
    let b = dir.path().join("b.tar");
    testkit::image::busybox()
        .write_oci_archive(&a, "docker.io/library/busybox:a")
        .unwrap();
    testkit::image::busybox_with_user("1000")
        .write_oci_archive(&b, "docker.io/library/busybox:b")
        .unwrap();
    let ia = mgr.import_archive(&a, None).await.unwrap().remove(0);
    let ib = mgr.import_archive(&b, None).await.unwrap().remove(0);
    assert_ne!(ia.id, ib.id);
    assert_eq!(
        ia.chain_ids(),
        ib.chain_ids(),
        "the two images share their layers"
    );

    mgr.acquire(&ia.id);
    let err = mgr.remove("busybox:a").unwrap_err();
    assert_eq!(err.kind, ErrorKind::InUse);
    assert!(err.message.contains("in use"), "{}", err.message);
    assert!(mgr.resolve("busybox:a").unwrap().is_some(), "still there");
    mgr.release(&ia.id);

    let before = mgr.fs_usage().unwrap();
    mgr.remove("busybox:a").unwrap().expect("removed");
    let mid = mgr.fs_usage().unwrap();
    // Only a's config and manifest went; the shared layers stay for b.
    assert!(
        before.used_bytes - mid.used_bytes < 64 * 1024,
        "{before:?} -> {mid:?}"
    );
    for c in ib.chain_ids() {
        assert!(mgr.snapshotter().exists(&c));
    }
    mgr.remove(&ib.id.to_string()).unwrap().expect("removed");
    for c in ib.chain_ids() {
        assert!(!mgr.snapshotter().exists(&c), "collected once unreferenced");
    }
    assert!(mgr.list().unwrap().is_empty());
    assert!(
        mgr.remove("busybox:b").unwrap().is_none(),
        "absent: no error"
    );

    // A reopened manager (a restarted daemon) sees the same, empty, consistent store.
    drop(mgr);
    let again = ImageManager::open(ImageManagerConfig::new(
        &dir.path().join("root"),
        &RuntimeConfig::default(),
    ))
    .unwrap();
    assert!(again.list().unwrap().is_empty());
}
