//! A busybox image built from the host's `/bin/busybox` (Debian's busybox-static).
//!
//! Layers (gzip):
//!
//! 1. `bin/` with `bin/busybox` (the host binary, mode 0755) and every applet of
//!    `busybox --list` as `bin/<applet>`, a **hard link** to `bin/busybox`.
//! 2. Base files: `etc/passwd` (`root` 0, `app` 1000:1000 home `/home/app`, `nobody` 65534),
//!    `etc/group` (`root` 0, `users` 100 with member `app`, `app` 1000, `nogroup` 65534),
//!    `etc/hostname`, empty dirs `tmp` (1777), `root` (0700), `proc`, `sys`, `dev`, `etc`,
//!    `var`, `home`, and `home/app` (owned 1000:1000).
//!
//! Config: `Env` = [`PATH`], `Cmd` = `["sh"]`, no entrypoint, no user unless
//! [`busybox_with_user`].

use std::process::Command;

use super::layer::{Entry, LayerBuilder};
use super::manifest::{Image, ImageBuilder, ImageIndex, ManifestFormat, Platform};

/// The host binary the image is built from.
pub const HOST_BUSYBOX: &str = "/bin/busybox";

/// `PATH` set in the image config.
pub const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `/etc/passwd` of the image.
pub const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
app:x:1000:1000:app:/home/app:/bin/sh\n\
nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";

/// `/etc/group` of the image.
pub const GROUP: &str = "root:x:0:\nusers:x:100:app\napp:x:1000:\nnogroup:x:65534:\n";

/// Applet names reported by the host busybox (`busybox --list`), sorted, without `busybox`.
pub fn applets() -> Vec<String> {
    let out = Command::new(HOST_BUSYBOX)
        .arg("--list")
        .output()
        .expect("run /bin/busybox --list (is busybox-static installed?)");
    assert!(out.status.success(), "busybox --list failed");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "busybox" && !l.contains('/'))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The busybox image as a builder, to change format, compression, config or add layers.
pub fn busybox_builder() -> ImageBuilder {
    let mut bin = LayerBuilder::new()
        .comment("testkit: /bin/busybox and applet hard links")
        .dir("bin")
        .entry(Entry::host_file("bin/busybox", HOST_BUSYBOX).mode(0o755));
    for applet in applets() {
        bin.push(Entry::hardlink(format!("bin/{applet}"), "bin/busybox"));
    }
    let base = LayerBuilder::new()
        .comment("testkit: base files")
        .dir("etc")
        .file("etc/passwd", PASSWD)
        .file("etc/group", GROUP)
        .file("etc/hostname", "busybox\n")
        .entry(Entry::dir("tmp").mode(0o1777))
        .entry(Entry::dir("root").mode(0o700))
        .dir("proc")
        .dir("sys")
        .dir("dev")
        .dir("var")
        .dir("home")
        .entry(Entry::dir("home/app").owner(1000, 1000));
    ImageBuilder::new()
        .layer(bin)
        .layer(base)
        .env(PATH)
        .cmd(["sh"])
}

/// The busybox image (OCI manifest, gzip layers, linux/amd64).
pub fn busybox() -> Image {
    busybox_builder().build().expect("build busybox image")
}

/// A sandbox ("pause") image for containerd's CRI, which runs one per pod: busybox whose
/// entrypoint sleeps forever. Import it as `registry.k8s.io/pause:3.8` (testkit's containerd
/// config names that tag) since the real one cannot be pulled offline.
pub fn pause() -> Image {
    busybox_builder()
        .entrypoint(["/bin/sleep", "inf"])
        .build()
        .expect("build pause image")
}

/// A small web server image, offline: busybox whose command serves `/usr/share/nginx/html`
/// on port 80 with busybox httpd. The demo pushes it as `library/nginx:latest`, so the
/// lesson's `kubectl run be --image=nginx` works without the internet.
pub fn web() -> Image {
    busybox_builder()
        .layer(
            LayerBuilder::new()
                .comment("testkit: a page to serve")
                .dir("usr")
                .dir("usr/share")
                .dir("usr/share/nginx")
                .dir("usr/share/nginx/html")
                .file(
                    "usr/share/nginx/html/index.html",
                    "<h1>Welcome to nodus</h1>\n",
                ),
        )
        .cmd([
            "httpd",
            "-f",
            "-v",
            "-p",
            "80",
            "-h",
            "/usr/share/nginx/html",
        ])
        .build()
        .expect("build web image")
}

/// The busybox image with `config.User` = `user` (`"1000"`, `"app"`, `"1000:1000"`, ...).
pub fn busybox_with_user(user: &str) -> Image {
    busybox_builder()
        .user(user)
        .build()
        .expect("build busybox image")
}

/// A multi-platform index of `format` (OCI index or Docker manifest list) holding the
/// linux/amd64 busybox image and a small linux/arm64/v8 image whose only file is
/// `/arch` = `"arm64\n"` (valid, but not runnable). Children use the same `format`.
pub fn busybox_multiplatform(format: ManifestFormat) -> ImageIndex {
    let amd64 = busybox_builder()
        .format(format)
        .build()
        .expect("build busybox image");
    let arm64 = ImageBuilder::new()
        .format(format)
        .platform(Platform::linux_arm64())
        .layer(
            LayerBuilder::new()
                .comment("testkit: arm64 marker")
                .file("arch", "arm64\n"),
        )
        .env(PATH)
        .cmd(["sh"])
        .build()
        .expect("build arm64 image");
    ImageIndex::new(format, vec![amd64, arm64])
}
