//! The CRI ImageService of `nodus runtime`, end to end: the real binary on a private socket,
//! a real `docker-registry` on 127.0.0.1, images built offline by testkit.

mod common;

use common::*;
use cri::runtime::v1 as pb;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use testkit::image::{busybox, busybox_multiplatform, busybox_with_user, whiteout_image};
use testkit::{Compression, ManifestFormat, Registry};

/// A view of an image's root filesystem: the single snapshot dir, or a read-only overlay of
/// the chain (unmounted on drop).
struct RootfsView {
    path: PathBuf,
    _mount: Option<nodus_runtime::image::snapshot::MountGuard>,
    _dir: Option<tempfile::TempDir>,
}

fn rootfs(rt: &Runtime, chains: &[String]) -> RootfsView {
    let lowers: Vec<PathBuf> = chains
        .iter()
        .rev()
        .map(|c| {
            rt.root()
                .join("snapshots/sha256")
                .join(c.trim_start_matches("sha256:"))
                .join("fs")
        })
        .collect();
    if lowers.len() == 1 {
        return RootfsView {
            path: lowers[0].clone(),
            _mount: None,
            _dir: None,
        };
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let g = nodus_runtime::image::snapshot::mount_overlay(&lowers, None, dir.path())
        .expect("mount overlay of the image's snapshots");
    RootfsView {
        path: dir.path().to_path_buf(),
        _mount: Some(g),
        _dir: Some(dir),
    }
}

fn config_digest(img: &testkit::Image) -> String {
    img.config_digest.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_list_status_remove_busybox() {
    if !have_root() {
        return;
    }
    let reg = Registry::start().expect("registry");
    let img = busybox();
    let manifest_digest = reg
        .push("library/busybox", "1.36", &img)
        .await
        .expect("push");
    let rt = Runtime::start();
    let c = rt.clients().await;
    let name = format!("{}/library/busybox:1.36", reg.host());

    let id = pull(&c, &name).await.expect("pull");
    assert_eq!(
        id,
        config_digest(&img),
        "PullImage answers the image id (config digest)"
    );

    let images = list(&c).await;
    assert_eq!(images.len(), 1);
    let i = &images[0];
    assert_eq!(i.id, id);
    assert_eq!(i.repo_tags, vec![name.clone()]);
    assert_eq!(
        i.repo_digests,
        vec![format!("{}/library/busybox@{manifest_digest}", reg.host())]
    );
    assert!(i.size > 500_000, "size {} counts the layer blobs", i.size);
    assert_eq!(i.uid, None);
    assert_eq!(i.username, "");

    // Found by tag, id, short id and repo digest alike.
    for key in [
        name.clone(),
        id.clone(),
        id.trim_start_matches("sha256:")[..12].to_string(),
        i.repo_digests[0].clone(),
    ] {
        let st = status(&c, &key, false).await;
        assert_eq!(st.image.map(|i| i.id), Some(id.clone()), "status by {key}");
    }
    // An absent image is an empty answer, not an error.
    assert!(
        status(&c, "docker.io/library/nothing:here", false)
            .await
            .image
            .is_none()
    );

    let verbose = status(&c, &name, true).await;
    let info: serde_json::Value = serde_json::from_str(&verbose.info["info"]).unwrap();
    assert_eq!(
        info["imageSpec"]["config"]["Cmd"],
        serde_json::json!(["sh"])
    );
    assert_eq!(info["imageSpec"]["architecture"], "amd64");

    // The unpacked root filesystem is the image's: applets are hard links of busybox.
    let chains = chain_ids(&c, &name).await;
    {
        let view = rootfs(&rt, &chains);
        let bb = std::fs::metadata(view.path.join("bin/busybox")).expect("bin/busybox");
        let sh = std::fs::metadata(view.path.join("bin/sh")).expect("bin/sh");
        assert_eq!(bb.ino(), sh.ino(), "sh is a hard link to busybox");
        assert_eq!(bb.mode() & 0o777, 0o755);
        let tmp = std::fs::metadata(view.path.join("tmp")).unwrap();
        assert_eq!(tmp.mode() & 0o7777, 0o1777, "sticky /tmp kept");
        let passwd = std::fs::read_to_string(view.path.join("etc/passwd")).unwrap();
        assert!(passwd.contains("app:x:1000:1000"), "{passwd}");
    }

    let before = fs_used(&c).await;
    remove(&c, &name).await.expect("remove");
    assert!(list(&c).await.is_empty());
    remove(&c, &name)
        .await
        .expect("removing an absent image succeeds");
    let after = fs_used(&c).await;
    assert!(
        after + 500_000 < before,
        "ImageFsInfo drops after removal: {before} -> {after}"
    );
    assert!(
        !rt.root()
            .join("snapshots/sha256")
            .join(chains[0].trim_start_matches("sha256:"))
            .exists(),
        "the snapshot is garbage-collected"
    );
}

async fn fs_used(c: &nodus_crictl::Clients) -> u64 {
    let r = c
        .image
        .clone()
        .image_fs_info(pb::ImageFsInfoRequest {})
        .await
        .expect("ImageFsInfo")
        .into_inner();
    let fs = &r.image_filesystems[0];
    assert!(fs.fs_id.as_ref().is_some_and(|f| !f.mountpoint.is_empty()));
    assert!(fs.inodes_used.as_ref().is_some_and(|v| v.value > 0));
    fs.used_bytes.as_ref().map(|v| v.value).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn whiteouts_opaque_dirs_and_metadata_survive_unpacking() {
    if !have_root() {
        return;
    }
    let reg = Registry::start().expect("registry");
    let img = whiteout_image();
    reg.push("test/whiteout", "v1", &img).await.expect("push");
    let rt = Runtime::start();
    let c = rt.clients().await;
    let name = format!("{}/test/whiteout:v1", reg.host());
    pull(&c, &name).await.expect("pull");
    let chains = chain_ids(&c, &name).await;
    assert_eq!(chains.len(), img.layers.len());
    let view = rootfs(&rt, &chains);
    testkit::image::check_whiteout_rootfs(&view.path).expect("final tree as the image defines it");
}

#[tokio::test(flavor = "multi_thread")]
async fn users_docker_schema2_zstd_and_platform_indexes() {
    if !have_root() {
        return;
    }
    let reg = Registry::start().expect("registry");
    let rt = Runtime::start();
    let c = rt.clients().await;

    // config.User → uid or username, as containerd reports them.
    reg.push("u/numeric", "1", &busybox_with_user("1000:1000"))
        .await
        .unwrap();
    reg.push("u/named", "1", &busybox_with_user("app"))
        .await
        .unwrap();
    pull(&c, &format!("{}/u/numeric:1", reg.host()))
        .await
        .unwrap();
    pull(&c, &format!("{}/u/named:1", reg.host()))
        .await
        .unwrap();
    let n = status(&c, &format!("{}/u/numeric:1", reg.host()), false)
        .await
        .image
        .unwrap();
    assert_eq!(n.uid.map(|u| u.value), Some(1000));
    let a = status(&c, &format!("{}/u/named:1", reg.host()), false)
        .await
        .image
        .unwrap();
    assert_eq!((a.uid, a.username.as_str()), (None, "app"));

    // Docker schema 2 manifests.
    let docker = busybox().with_format(ManifestFormat::Docker);
    reg.push("fmt/docker", "1", &docker).await.unwrap();
    let id = pull(&c, &format!("{}/fmt/docker:1", reg.host()))
        .await
        .unwrap();
    assert_eq!(id, config_digest(&docker));

    // zstd layers.
    let zstd = testkit::image::busybox_builder()
        .compression(Compression::Zstd)
        .build()
        .unwrap();
    reg.push("fmt/zstd", "1", &zstd).await.unwrap();
    let name = format!("{}/fmt/zstd:1", reg.host());
    assert_eq!(pull(&c, &name).await.unwrap(), config_digest(&zstd));
    let view = rootfs(&rt, &chain_ids(&c, &name).await);
    assert!(view.path.join("bin/sh").exists());
    drop(view);

    // Indexes (OCI and Docker manifest lists) resolve to linux/amd64; the repo digest is
    // the index's, as the tag points at it.
    for fmt in [ManifestFormat::Oci, ManifestFormat::Docker] {
        let idx = busybox_multiplatform(fmt);
        let repo = format!("multi/{fmt:?}").to_lowercase();
        let idx_digest = reg.push_index(&repo, "1", &idx).await.unwrap();
        let name = format!("{}/{repo}:1", reg.host());
        let id = pull(&c, &name).await.unwrap();
        let amd64 = idx.image_for("amd64").expect("amd64 image");
        assert_eq!(
            id,
            config_digest(amd64),
            "{fmt:?}: the amd64 image was chosen"
        );
        let st = status(&c, &name, false).await.image.unwrap();
        // The same config pulled under other names is one image with several digests.
        let want = format!("{}/{repo}@{idx_digest}", reg.host());
        assert!(
            st.repo_digests.contains(&want),
            "{want} in {:?}",
            st.repo_digests
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn shared_layers_survive_removal_of_one_image() {
    if !have_root() {
        return;
    }
    let reg = Registry::start().expect("registry");
    reg.push("s/a", "1", &busybox()).await.unwrap();
    reg.push("s/b", "1", &busybox_with_user("1000"))
        .await
        .unwrap();
    let rt = Runtime::start();
    let c = rt.clients().await;
    let a = format!("{}/s/a:1", reg.host());
    let b = format!("{}/s/b:1", reg.host());
    pull(&c, &a).await.unwrap();
    pull(&c, &b).await.unwrap();
    let (ca, cb) = (chain_ids(&c, &a).await, chain_ids(&c, &b).await);
    assert_eq!(ca, cb, "same layers, different configs");
    remove(&c, &a).await.unwrap();
    let view = rootfs(&rt, &cb);
    assert!(
        view.path.join("bin/busybox").exists(),
        "b's layers are kept"
    );
    drop(view);
    assert_eq!(list(&c).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn tags_move_and_concurrent_pulls_share_one_download() {
    if !have_root() {
        return;
    }
    let reg = Registry::start().expect("registry");
    let proxy = testkit::FaultyProxy::start(reg.addr(), testkit::Fault::PassThrough).unwrap();
    let img = testkit::image::large_image();
    reg.push("big/img", "1", &img).await.unwrap();
    let rt = Runtime::start();
    let c = rt.clients().await;
    let name = format!("{}/big/img:1", proxy.host());
    let pulls: Vec<_> = (0..4)
        .map(|_| {
            let c = c.clone();
            let n = name.clone();
            tokio::spawn(async move { pull(&c, &n).await })
        })
        .collect();
    for p in pulls {
        assert_eq!(p.await.unwrap().unwrap(), config_digest(&img));
    }
    let requests = proxy.requests();
    // One pull: manifest + config + layers (a token or /v2/ probe may add a request or two).
    let one_pull = 2 + img.layers.len();
    assert!(
        requests <= one_pull + 2,
        "4 concurrent pulls made {requests} registry requests; one pull needs {one_pull}"
    );

    // Re-pushing the tag with another image moves the tag; the old image stays by id.
    let old = config_digest(&img);
    reg.push("big/img", "1", &busybox()).await.unwrap();
    let new = pull(&c, &name).await.unwrap();
    assert_ne!(new, old);
    let old_img = status(&c, &old, false).await.image.expect("old image kept");
    assert!(
        old_img.repo_tags.is_empty(),
        "tag moved: {:?}",
        old_img.repo_tags
    );
    assert_eq!(status(&c, &name, false).await.image.unwrap().id, new);
}

#[tokio::test(flavor = "multi_thread")]
async fn state_survives_restart_and_crash_mid_pull_leaves_nothing() {
    if !have_root() {
        return;
    }
    let reg = Registry::start().expect("registry");
    reg.push("library/busybox", "1", &busybox()).await.unwrap();
    let big = testkit::image::large_image();
    reg.push("big/img", "1", &big).await.unwrap();
    let proxy = testkit::FaultyProxy::start(
        reg.addr(),
        testkit::FaultRule::blobs(testkit::Fault::StallBody { after: 1 << 20 }),
    )
    .unwrap();
    let mut rt = Runtime::start();
    let small = format!("{}/library/busybox:1", reg.host());
    {
        let c = rt.clients().await;
        pull(&c, &small).await.unwrap();
    }
    // A clean restart keeps images.
    rt.restart();
    let c = rt.clients().await;
    assert_eq!(list(&c).await.len(), 1);
    let view = rootfs(&rt, &chain_ids(&c, &small).await);
    assert!(view.path.join("bin/sh").exists());
    drop(view);

    // A crash in the middle of a pull: blobs stall after 1 MiB, then SIGKILL.
    let big_name = format!("{}/big/img:1", proxy.host());
    let c2 = c.clone();
    let n = big_name.clone();
    let pending = tokio::spawn(async move { pull(&c2, &n).await });
    for _ in 0..300 {
        if proxy.injected() > 0 && !rt.ingest_leftovers().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(proxy.injected() > 0, "the pull reached the stalled blobs");
    rt.kill();
    assert!(pending.await.unwrap().is_err(), "the client sees the crash");
    rt.start_again();
    let c = rt.clients().await;
    let images = list(&c).await;
    assert_eq!(images.len(), 1, "only the completed image is visible");
    assert!(status(&c, &big_name, false).await.image.is_none());
    assert!(
        rt.ingest_leftovers().is_empty(),
        "half-written blobs are cleaned at start"
    );
    assert!(list_dir(&rt.root().join("snapshots/staging")).is_empty());

    // And the same pull completes once the registry behaves.
    proxy.set_rule(testkit::Fault::PassThrough);
    assert_eq!(pull(&c, &big_name).await.unwrap(), config_digest(&big));
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_and_token_auth_from_the_cri_auth_config() {
    if !have_root() {
        return;
    }
    let rt = Runtime::start();
    let c = rt.clients().await;
    for reg in [
        Registry::start_with_basic_auth("alice", "s3cret").unwrap(),
        Registry::start_with_token_auth("alice", "s3cret").unwrap(),
    ] {
        reg.push("private/app", "1", &busybox()).await.unwrap();
        let name = format!("{}/private/app:1", reg.host());
        let anon = pull(&c, &name).await.unwrap_err();
        assert_eq!(anon.code(), tonic::Code::Unauthenticated, "{anon:?}");
        let wrong = pull_with(&c, &name, Some(basic_auth("alice", "nope")))
            .await
            .unwrap_err();
        assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");
        assert!(
            wrong.message().contains(&name),
            "names the image: {}",
            wrong.message()
        );
        let ok = pull_with(&c, &name, Some(basic_auth("alice", "s3cret"))).await;
        assert_eq!(ok.unwrap(), config_digest(&busybox()));
        // `auth` (base64 user:pass) works too.
        remove(&c, &name).await.unwrap();
        let auth = pb::AuthConfig {
            auth: "YWxpY2U6czNjcmV0".into(),
            ..Default::default()
        };
        pull_with(&c, &name, Some(auth)).await.unwrap();
        remove(&c, &name).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mirrors_from_hosts_toml_serve_docker_io_names() {
    if !have_root() {
        return;
    }
    let reg = Registry::start().expect("registry");
    let img = busybox();
    reg.push("library/busybox", "latest", &img).await.unwrap();
    let certs = testkit::CertsD::new().unwrap();
    certs
        .add(
            "docker.io",
            // An unreachable server: the pull must come from the mirror.
            Some("http://127.0.0.1:9"),
            &[testkit::HostEntry::new(format!("http://{}", reg.host()))],
        )
        .unwrap();
    let rt = Runtime::start_with_config(Some(&format!(
        "registry-config-dir = \"{}\"\n",
        certs.path().display()
    )));
    let c = rt.clients().await;
    let id = pull(&c, "busybox")
        .await
        .expect("pull busybox via the mirror");
    assert_eq!(id, config_digest(&img));
    let st = status(&c, "busybox", false).await.image.unwrap();
    assert_eq!(st.repo_tags, vec!["docker.io/library/busybox:latest"]);
    assert!(st.repo_digests[0].starts_with("docker.io/library/busybox@sha256:"));
}

#[tokio::test(flavor = "multi_thread")]
async fn import_an_oci_archive_while_the_daemon_runs() {
    if !have_root() {
        return;
    }
    let rt = Runtime::start();
    let c = rt.clients().await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("busybox.tar");
    let img = busybox();
    img.write_oci_archive(&archive, "docker.io/library/busybox:offline")
        .unwrap();
    let out = std::process::Command::new(nodus_bin())
        .args(["runtime", "import"])
        .arg(&archive)
        .arg("--root-dir")
        .arg(rt.root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "import failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("docker.io/library/busybox:offline"));
    // The running daemon sees what the import wrote.
    let st = status(&c, "busybox:offline", false)
        .await
        .image
        .expect("imported");
    assert_eq!(st.id, config_digest(&img));
    let view = rootfs(&rt, &chain_ids(&c, "busybox:offline").await);
    assert!(view.path.join("bin/sh").exists());
    drop(view);

    // A file that is not an archive is a clear error, and changes nothing.
    let junk = dir.path().join("junk.tar");
    std::fs::write(&junk, b"definitely not a tar").unwrap();
    let out = std::process::Command::new(nodus_bin())
        .args(["runtime", "import"])
        .arg(&junk)
        .arg("--root-dir")
        .arg(rt.root())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("junk.tar"), "{err}");
    assert_eq!(list(&c).await.len(), 1);
}

/// Every path under `dir` named `name`.
fn find_named(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_name() == name {
            out.push(p.clone());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            find_named(&p, name, out);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn malicious_layers_never_write_outside_the_rootfs() {
    use testkit::image::{Malice, malicious_layer_image};
    if !have_root() {
        return;
    }
    let reg = Registry::start().expect("registry");
    let rt = Runtime::start();
    let c = rt.clients().await;
    let good = format!("{}/ok/busybox:1", reg.host());
    reg.push("ok/busybox", "1", &busybox()).await.unwrap();
    pull(&c, &good).await.unwrap();
    for (i, kind) in [
        Malice::DotDotPath,
        Malice::AbsolutePath,
        Malice::SymlinkEscape,
        Malice::SymlinkChainEscape,
        Malice::RelativeSymlinkEscape,
        Malice::HardlinkEscape,
    ]
    .into_iter()
    .enumerate()
    {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("victim"), "original\n").unwrap();
        let img = malicious_layer_image(kind, outside.path());
        let repo = format!("evil/case{i}");
        reg.push(&repo, "1", &img).await.unwrap();
        let name = format!("{}/{repo}:1", reg.host());
        match pull(&c, &name).await {
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::Internal, "{kind:?}: {e:?}");
                assert!(
                    e.message().contains("failed to extract layer"),
                    "{kind:?}: {}",
                    e.message()
                );
                assert!(status(&c, &name, false).await.image.is_none());
            }
            Ok(_) => {
                // Accepted only if every write stayed inside the image's own rootfs.
                remove(&c, &name).await.unwrap();
            }
        }
        let escaped: Vec<_> = common::list_dir(outside.path())
            .into_iter()
            .filter(|p| !p.ends_with("victim"))
            .collect();
        assert!(escaped.is_empty(), "{kind:?} wrote outside: {escaped:?}");
        assert_eq!(
            std::fs::read_to_string(outside.path().join("victim")).unwrap(),
            "original\n",
            "{kind:?} changed a file outside"
        );
        let mut stray = Vec::new();
        find_named(rt.dir.path(), "escape", &mut stray);
        assert!(stray.is_empty(), "{kind:?}: ../ escaped to {stray:?}");
    }
    // Other images are untouched by the failures.
    assert_eq!(list(&c).await.len(), 1);
    let view = rootfs(&rt, &chain_ids(&c, &good).await);
    assert!(view.path.join("bin/sh").exists());
}
