//! Ready-made images: consistency of digests, diffIDs and manifests, determinism, content.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Instant;

use testkit::image::*;

fn check_consistent(img: &Image) {
    assert_eq!(sha256_digest(&img.manifest), img.manifest_digest);
    assert_eq!(sha256_digest(&img.config_blob), img.config_digest);
    let m: serde_json::Value = serde_json::from_slice(&img.manifest).unwrap();
    let c: serde_json::Value = serde_json::from_slice(&img.config_blob).unwrap();
    assert_eq!(m["mediaType"], img.media_type());
    assert_eq!(m["config"]["digest"], img.config_digest.as_str());
    assert_eq!(c["rootfs"]["diff_ids"], serde_json::json!(img.diff_ids()));
    assert_eq!(c["architecture"], img.platform.architecture.as_str());
    assert_eq!(c["os"], "linux");
    let layers = m["layers"].as_array().unwrap();
    assert_eq!(layers.len(), img.layers.len());
    for (d, l) in layers.iter().zip(&img.layers) {
        assert_eq!(d["digest"], l.digest.as_str());
        assert_eq!(d["size"], l.blob.len() as u64);
        assert_eq!(d["mediaType"], l.media_type(img.format));
        assert_eq!(sha256_digest(&l.blob), l.digest);
        let tar = l.tar().unwrap();
        assert_eq!(tar.len() as u64, l.uncompressed_size);
        assert_eq!(sha256_digest(&tar), l.diff_id);
    }
}

/// path -> (entry type, link name, mode, uid, gid, pax records, content)
type Listing = BTreeMap<
    String,
    (
        tar::EntryType,
        Option<String>,
        u32,
        u64,
        u64,
        Vec<(String, Vec<u8>)>,
        Vec<u8>,
    ),
>;

fn listing(layer: &Layer) -> Listing {
    let tar = layer.tar().unwrap();
    let mut ar = tar::Archive::new(&tar[..]);
    let mut out = BTreeMap::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let path = String::from_utf8(e.path_bytes().into_owned()).unwrap();
        let h = e.header().clone();
        let link = e
            .link_name()
            .unwrap()
            .map(|l| l.to_string_lossy().into_owned());
        let pax = match e.pax_extensions().unwrap() {
            Some(p) => p
                .map(|x| {
                    let x = x.unwrap();
                    (x.key().unwrap().to_string(), x.value_bytes().to_vec())
                })
                .collect(),
            None => vec![],
        };
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        out.insert(
            path,
            (
                h.entry_type(),
                link,
                h.mode().unwrap(),
                h.uid().unwrap(),
                h.gid().unwrap(),
                pax,
                data,
            ),
        );
    }
    out
}

#[test]
fn busybox_image() {
    let a = busybox();
    check_consistent(&a);
    assert_eq!(
        busybox().manifest_digest,
        a.manifest_digest,
        "deterministic"
    );
    let c: serde_json::Value = serde_json::from_slice(&a.config_blob).unwrap();
    assert_eq!(c["config"]["Cmd"], serde_json::json!(["sh"]));
    assert!(c["config"]["Env"][0].as_str().unwrap().starts_with("PATH="));
    assert!(c["config"].get("User").is_none());

    let bin = listing(&a.layers[0]);
    let host = std::fs::read("/bin/busybox").unwrap();
    let bb = &bin["bin/busybox"];
    assert_eq!(bb.0, tar::EntryType::Regular);
    assert_eq!(bb.2, 0o755);
    assert_eq!(bb.6, host);
    let applets = busybox::applets();
    assert!(applets.len() > 100 && applets.contains(&"sh".to_string()));
    for applet in &applets {
        let e = &bin[&format!("bin/{applet}")];
        assert_eq!(e.0, tar::EntryType::Link, "{applet}");
        assert_eq!(e.1.as_deref(), Some("bin/busybox"));
    }
    let base = listing(&a.layers[1]);
    assert!(String::from_utf8_lossy(&base["etc/passwd"].6).contains("app:x:1000:1000:"));
    assert!(String::from_utf8_lossy(&base["etc/passwd"].6).contains("nobody:x:65534:65534:"));
    assert_eq!(base["tmp/"].2, 0o1777);
    for d in ["root/", "proc/", "sys/", "dev/", "etc/", "var/", "home/"] {
        assert_eq!(base[d].0, tar::EntryType::Directory, "{d}");
    }
    assert_eq!((base["home/app/"].3, base["home/app/"].4), (1000, 1000));

    for user in ["1000", "app", "1000:1000"] {
        let u = busybox_with_user(user);
        check_consistent(&u);
        let c: serde_json::Value = serde_json::from_slice(&u.config_blob).unwrap();
        assert_eq!(c["config"]["User"], user);
        assert_eq!(u.diff_ids(), a.diff_ids());
        assert_ne!(u.manifest_digest, a.manifest_digest);
    }
    let docker = busybox_builder()
        .format(ManifestFormat::Docker)
        .build()
        .unwrap();
    check_consistent(&docker);
    assert_eq!(
        docker.layers[0].media_type(docker.format),
        media_types::DOCKER_LAYER_GZIP
    );
    let zstd = busybox_builder()
        .compression(Compression::Zstd)
        .build()
        .unwrap();
    check_consistent(&zstd);
    assert_eq!(
        zstd.diff_ids(),
        a.diff_ids(),
        "same tar, different compression"
    );
}

#[test]
fn multiplatform_index() {
    for format in [ManifestFormat::Oci, ManifestFormat::Docker] {
        let idx = busybox_multiplatform(format);
        assert_eq!(sha256_digest(&idx.manifest), idx.digest);
        assert_eq!(
            busybox_multiplatform(format).digest,
            idx.digest,
            "deterministic"
        );
        let v: serde_json::Value = serde_json::from_slice(&idx.manifest).unwrap();
        assert_eq!(v["mediaType"], format.index_media_type());
        let archs: Vec<&str> = v["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["platform"]["architecture"].as_str().unwrap())
            .collect();
        assert_eq!(archs, ["amd64", "arm64"]);
        for img in &idx.images {
            check_consistent(img);
            assert_eq!(img.format, format);
        }
        let arm = idx.image_for("arm64").unwrap();
        let c: serde_json::Value = serde_json::from_slice(&arm.config_blob).unwrap();
        assert_eq!(c["architecture"], "arm64");
        assert_eq!(c["variant"], "v8");
    }
}

#[test]
fn whiteout_image_layers() {
    let img = whiteout_image();
    check_consistent(&img);
    assert_eq!(whiteout_image().manifest_digest, img.manifest_digest);
    assert_eq!(img.layers.len(), 3);
    assert_eq!(
        img.layers.iter().map(|l| l.compression).collect::<Vec<_>>(),
        [Compression::Gzip, Compression::Zstd, Compression::None]
    );
    let l1 = listing(&img.layers[0]);
    for p in ["a", "b", "dir/x", "dir/y", "opq/old1", "opq/old2"] {
        assert_eq!(l1[p].0, tar::EntryType::Regular, "{p}");
    }
    assert_eq!(l1["link"].0, tar::EntryType::Symlink);
    assert_eq!(l1["hard"].0, tar::EntryType::Link);
    assert_eq!(l1["hard"].1.as_deref(), Some("b"));
    assert_eq!(
        l1["xattr"].5,
        [("SCHILY.xattr.user.test".to_string(), b"hello".to_vec())]
    );
    assert_eq!(
        (l1["owned"].2, l1["owned"].3, l1["owned"].4),
        (0o640, 1000, 1000)
    );
    let l2 = listing(&img.layers[1]);
    let names: Vec<&str> = l2.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            ".wh.a",
            "dir/",
            "dir/.wh.x",
            "opq/",
            "opq/.wh..wh..opq",
            "opq/new"
        ]
    );
    let l3 = listing(&img.layers[2]);
    assert_eq!(l3["a"].6, b"a3\n");
}

#[test]
fn malicious_images() {
    let outside = std::path::Path::new("/tmp/testkit-outside");
    let cases = [
        (Malice::DotDotPath, vec!["../escape"]),
        (Malice::AbsolutePath, vec!["/tmp/testkit-outside/pwned"]),
        (Malice::SymlinkEscape, vec!["evil", "evil/pwned"]),
        (
            Malice::SymlinkChainEscape,
            vec!["chain1", "chain2", "chain1/pwned"],
        ),
        (Malice::RelativeSymlinkEscape, vec!["up", "up/pwned"]),
        (Malice::HardlinkEscape, vec!["victim", "victim"]),
    ];
    for (kind, expected) in cases {
        let img = malicious_layer_image(kind, outside);
        check_consistent(&img);
        let tar = img.layers[0].tar().unwrap();
        let mut ar = tar::Archive::new(&tar[..]);
        let entries: Vec<(String, Option<String>)> = ar
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    String::from_utf8(e.path_bytes().into_owned()).unwrap(),
                    e.link_name_bytes()
                        .map(|l| String::from_utf8(l.into_owned()).unwrap()),
                )
            })
            .collect();
        let paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(paths, expected, "{kind:?}");
        match kind {
            Malice::SymlinkEscape => {
                assert_eq!(entries[0].1.as_deref(), Some("/tmp/testkit-outside"))
            }
            Malice::SymlinkChainEscape => {
                assert_eq!(entries[0].1.as_deref(), Some("chain2"));
                assert_eq!(entries[1].1.as_deref(), Some("/tmp/testkit-outside"));
            }
            Malice::RelativeSymlinkEscape => {
                assert!(entries[0].1.as_deref().unwrap().starts_with("../../"))
            }
            Malice::HardlinkEscape => {
                assert_eq!(entries[0].1.as_deref(), Some("/tmp/testkit-outside/victim"))
            }
            _ => {}
        }
    }
}

#[test]
fn large_image_is_deterministic_and_about_100mb() {
    let t = Instant::now();
    let a = large_image();
    eprintln!("large image built in {:?}", t.elapsed());
    check_consistent(&a);
    assert_eq!(a.layers.len(), 5);
    let total: u64 = a.layers.iter().map(|l| l.uncompressed_size).sum();
    let compressed: u64 = a.layers.iter().map(|l| l.size()).sum();
    eprintln!("uncompressed {total} compressed {compressed}");
    assert!((90 << 20..120 << 20).contains(&total), "{total}");
    assert!(a.layers.iter().all(|l| l.compression == Compression::Gzip));
    let files: usize = a
        .layers
        .iter()
        .map(|l| {
            listing(l)
                .values()
                .filter(|e| e.0 == tar::EntryType::Regular)
                .count()
        })
        .sum();
    assert!(files > 4000, "{files}");
    let b = large_image();
    assert_eq!(a.manifest_digest, b.manifest_digest);
}
