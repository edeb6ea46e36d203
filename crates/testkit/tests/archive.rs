//! OCI layouts and archives are accepted by independent tools (skopeo, umoci).

use std::process::Command;

use testkit::Registry;
use testkit::image::{
    Compression, ManifestFormat, OciLayout, busybox, busybox_multiplatform, check_whiteout_rootfs,
    whiteout_image_builder,
};

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn skopeo_inspects_oci_archive() {
    let dir = tempfile::tempdir().unwrap();
    let img = busybox();
    let path = dir.path().join("busybox.tar");
    img.write_oci_archive(&path, "docker.io/library/busybox:latest")
        .unwrap();
    let arg = format!("oci-archive:{}:latest", path.display());
    let v: serde_json::Value =
        serde_json::from_str(&run(Command::new("skopeo").args(["inspect", &arg]))).unwrap();
    assert_eq!(v["Digest"], img.manifest_digest.as_str());
    assert_eq!(v["Architecture"], "amd64");
    assert_eq!(v["Layers"].as_array().unwrap().len(), img.layers.len());
    let raw = run(Command::new("skopeo").args(["inspect", "--raw", &arg]));
    assert_eq!(raw.as_bytes(), &img.manifest[..]);

    // Same archive twice: identical bytes.
    let again = dir.path().join("again.tar");
    img.write_oci_archive(&again, "docker.io/library/busybox:latest")
        .unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(&again).unwrap()
    );

    // An index in a layout; skopeo resolves the arm64 child.
    let idx = busybox_multiplatform(ManifestFormat::Oci);
    let layout = dir.path().join("layout");
    OciLayout::new()
        .index(&idx, "example.com/multi:v1")
        .write_dir(&layout)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&run(Command::new("skopeo").args([
        "inspect",
        "--override-arch",
        "arm64",
        &format!("oci:{}:v1", layout.display()),
    ])))
    .unwrap();
    // skopeo reports the digest of the top-level index and the resolved child's config.
    assert_eq!(v["Digest"], idx.digest.as_str());
    assert_eq!(v["Architecture"], "arm64");
    assert_eq!(
        v["Layers"][0],
        idx.image_for("arm64").unwrap().layers[0].digest.as_str()
    );
}

#[test]
fn skopeo_reads_pushed_images() {
    let reg = Registry::start_with_basic_auth("u", "p").unwrap();
    let img = busybox();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(reg.push("library/busybox", "1", &img))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&run(Command::new("skopeo").args([
        "inspect",
        "--tls-verify=false",
        "--creds",
        "u:p",
        &format!("docker://{}", reg.image_ref("library/busybox", "1")),
    ])))
    .unwrap();
    assert_eq!(v["Digest"], img.manifest_digest.as_str());
}

#[test]
fn umoci_unpacks_whiteout_image_as_documented() {
    // umoci is an independent reference for OCI whiteout semantics.
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    // umoci 0.4 may not read zstd layers: use gzip for this cross-check.
    let img = whiteout_image_builder()
        .compression(Compression::Gzip)
        .build()
        .unwrap();
    img.write_oci_layout(&layout, "whiteout:latest").unwrap();
    let bundle = dir.path().join("bundle");
    run(Command::new("umoci").args([
        "unpack",
        "--image",
        &format!("{}:latest", layout.display()),
        bundle.to_str().unwrap(),
    ]));
    check_whiteout_rootfs(&bundle.join("rootfs")).unwrap();
}
