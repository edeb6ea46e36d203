//! A private containerd: starts, answers ctr, imports our OCI archives, pulls from our
//! registry (directly and through a certs.d mirror), runs busybox, and cleans up.

use std::path::Path;

use testkit::image::{ManifestFormat, busybox, busybox_multiplatform};
use testkit::{CertsD, Containerd, Registry};

#[test]
fn containerd_starts_and_cleans_up() {
    let ctd = Containerd::start(None).unwrap();
    let version = ctd.ctr_output(["version"]).unwrap();
    assert!(version.contains("Server:"), "{version}");
    assert!(ctd.endpoint().starts_with("unix:///"));
    let plugins = ctd.ctr_output(["plugins", "ls"]).unwrap();
    let cri = plugins
        .lines()
        .find(|l| l.contains("io.containerd.grpc.v1") && l.contains(" cri "))
        .unwrap();
    assert!(cri.trim_end().ends_with("ok"), "{cri}");
    let overlay = plugins.lines().find(|l| l.contains("overlayfs")).unwrap();
    assert!(overlay.trim_end().ends_with("ok"), "{overlay}");

    // Import an OCI archive, then run it (exercises a real overlay mount and a shim).
    let archive = ctd.dir().join("busybox.tar");
    busybox()
        .write_oci_archive(&archive, "docker.io/library/busybox:latest")
        .unwrap();
    let out = ctd
        .ctr_output([
            "-n",
            "testkit",
            "images",
            "import",
            archive.to_str().unwrap(),
        ])
        .unwrap();
    assert!(out.contains("docker.io/library/busybox:latest"), "{out}");
    let ls = ctd
        .ctr_output(["-n", "testkit", "images", "ls", "-q"])
        .unwrap();
    assert!(
        ls.lines().any(|l| l == "docker.io/library/busybox:latest"),
        "{ls}"
    );
    let run = ctd
        .ctr_output([
            "-n",
            "testkit",
            "run",
            "--rm",
            "docker.io/library/busybox:latest",
            "t1",
            "sh",
            "-c",
            "id -u; ls /bin/ls; grep app /etc/passwd",
        ])
        .unwrap();
    assert!(run.contains("0\n/bin/ls\napp:x:1000"), "{run}");

    let dir = ctd.dir().to_path_buf();
    drop(ctd);
    assert!(!dir.exists(), "temp dir removed");
    assert!(testkit::containerd::mounts_under(&dir).is_empty());
}

#[test]
fn containerd_pulls_from_registry_and_mirror() {
    let reg = Registry::start().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        reg.push("library/busybox", "latest", &busybox())
            .await
            .unwrap();
        reg.push_index(
            "multi",
            "v1",
            &busybox_multiplatform(ManifestFormat::Docker),
        )
        .await
        .unwrap();
    });

    // Mirror: pulls of docker.io/library/busybox go to our registry.
    let certs = CertsD::new().unwrap();
    certs.mirror("docker.io", &reg.host(), None).unwrap();
    certs
        .mirror(&reg.host(), &reg.host(), Some(&reg.url()))
        .unwrap();
    let ctd = Containerd::start(Some(certs.path())).unwrap();
    let hosts_dir = certs.path().to_str().unwrap().to_string();
    let out = ctd
        .ctr_output([
            "-n",
            "testkit",
            "images",
            "pull",
            "--hosts-dir",
            &hosts_dir,
            "docker.io/library/busybox:latest",
        ])
        .unwrap();
    assert!(out.contains("done"), "{out}");
    let out = ctd
        .ctr_output([
            "-n",
            "testkit",
            "images",
            "pull",
            "--plain-http",
            &reg.image_ref("multi", "v1"),
        ])
        .unwrap();
    assert!(out.contains("done"), "{out}");
    let ls = ctd
        .ctr_output(["-n", "testkit", "images", "ls", "-q"])
        .unwrap();
    assert!(ls.contains("docker.io/library/busybox:latest"), "{ls}");
    assert!(Path::new(&ctd.socket()).exists());
}
