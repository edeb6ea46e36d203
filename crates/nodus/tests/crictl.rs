//! `nodus crictl` against nodus's runtime and against a real containerd: the commands,
//! columns and JSON an operator uses.

mod common;

use common::*;
use std::process::Command;
use testkit::{CertsD, Containerd, Registry};

fn crictl(endpoint: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(nodus_bin())
        .arg("crictl")
        .arg("--runtime-endpoint")
        .arg(endpoint)
        .args(args)
        .output()
        .expect("run nodus crictl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(endpoint: &str, args: &[&str]) -> String {
    let (success, out, err) = crictl(endpoint, args);
    assert!(success, "crictl {args:?} failed on {endpoint}: {err}");
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn crictl_image_commands_on_nodus_and_containerd() {
    if !have_root() {
        return;
    }
    let reg = Registry::start().unwrap();
    let img = testkit::image::busybox();
    reg.push("library/busybox", "1.36", &img).await.unwrap();
    let certs = CertsD::new().unwrap();
    certs
        .add(&reg.host(), Some(&format!("http://{}", reg.host())), &[])
        .unwrap();
    let ctrd = Containerd::start(Some(certs.path())).unwrap();
    let rt = Runtime::start_with_config(Some(&format!(
        "registry-config-dir = \"{}\"\n",
        certs.path().display()
    )));
    let name = format!("{}/library/busybox:1.36", reg.host());
    let id = img.config_digest.to_string();

    for (runtime, ep) in [("nodus", rt.endpoint()), ("containerd", ctrd.endpoint())] {
        let v = ok(&ep, &["version"]);
        assert!(v.contains("RuntimeApiVersion:  v1"), "{runtime}: {v}");
        assert!(v.contains(&format!("RuntimeName:  {runtime}")), "{v}");

        let info: serde_json::Value = serde_json::from_str(&ok(&ep, &["info"])).unwrap();
        let conds = info["status"]["conditions"].as_array().expect("conditions");
        assert!(
            conds.iter().any(|c| c["type"] == "RuntimeReady"),
            "{runtime}: {info}"
        );

        let pulled = ok(&ep, &["pull", &name]);
        assert_eq!(
            pulled.trim(),
            format!("Image is up to date for {id}"),
            "{runtime}"
        );

        let table = ok(&ep, &["images"]);
        let mut lines = table.lines();
        let header: Vec<&str> = lines
            .next()
            .unwrap()
            .split("  ")
            .filter(|s| !s.is_empty())
            .map(str::trim)
            .collect();
        assert_eq!(
            header,
            ["IMAGE", "TAG", "IMAGE ID", "SIZE"],
            "{runtime}: {table}"
        );
        let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(row[0], format!("{}/library/busybox", reg.host()));
        assert_eq!(row[1], "1.36");
        assert_eq!(row[2], &id["sha256:".len().."sha256:".len() + 13]);
        assert!(
            row[3].ends_with("MB") || row[3].ends_with("kB"),
            "{runtime}: {row:?}"
        );

        assert_eq!(ok(&ep, &["images", "-q"]).trim(), id);

        let inspect: serde_json::Value =
            serde_json::from_str(&ok(&ep, &["inspecti", &name])).unwrap();
        assert_eq!(inspect["status"]["id"], id.as_str(), "{runtime}");
        assert_eq!(inspect["status"]["repoTags"][0], name.as_str());
        assert!(
            inspect["status"]["size"].is_string(),
            "int64 as a JSON string"
        );
        assert_eq!(
            inspect["info"]["imageSpec"]["config"]["Cmd"],
            serde_json::json!(["sh"]),
            "{runtime}"
        );

        let fs: serde_json::Value = serde_json::from_str(&ok(&ep, &["imagefsinfo"])).unwrap();
        let used = fs["status"]["imageFilesystems"][0]["usedBytes"]["value"]
            .as_str()
            .expect("usedBytes")
            .parse::<u64>()
            .unwrap();
        // containerd refreshes its figure on a timer (0 right after a pull); nodus measures.
        if runtime == "nodus" {
            assert!(used > 500_000, "{runtime}: {fs}");
        }

        let (success, _, err) = crictl(&ep, &["inspecti", "docker.io/library/absent:1"]);
        assert!(
            !success && err.contains("no such image"),
            "{runtime}: {err}"
        );

        let removed = ok(&ep, &["rmi", &name]);
        assert_eq!(removed.trim(), format!("Deleted: {name}"), "{runtime}");
        assert_eq!(ok(&ep, &["images", "-q"]).trim(), "");

        let (success, _, err) = crictl(&ep, &["pull", &format!("{}/library/nope:1", reg.host())]);
        assert!(!success, "{runtime}");
        assert!(err.contains("code = NotFound"), "{runtime}: {err}");
    }

    // A socket nobody serves is a clear connection error.
    let (success, _, err) = crictl("unix:///nonexistent/nodus.sock", &["images"]);
    assert!(!success && err.contains("/nonexistent/nodus.sock"), "{err}");
}
