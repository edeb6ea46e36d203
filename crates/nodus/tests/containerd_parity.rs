//! The same CRI image requests sent to `nodus runtime` and to a real containerd (private
//! socket and root), with the answers compared: what a kubelet sees must not depend on
//! which of the two runtimes it drives.

mod common;

use common::*;
use cri::runtime::v1 as pb;
use nodus_crictl::Clients;
use testkit::image::busybox;
use testkit::{CertsD, Containerd, Fault, FaultRule, FaultyProxy, Registry};

struct Pair {
    nodus: Clients,
    containerd: Clients,
}

impl Pair {
    async fn pull(
        &self,
        image: &str,
        auth: Option<pb::AuthConfig>,
    ) -> [Result<String, tonic::Status>; 2] {
        [
            pull_with(&self.nodus, image, auth.clone()).await,
            pull_with(&self.containerd, image, auth).await,
        ]
    }
}

fn code(r: &Result<String, tonic::Status>) -> tonic::Code {
    match r {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

fn plain_http(certs: &CertsD, host: &str) {
    certs
        .add(host, Some(&format!("http://{host}")), &[])
        .expect("hosts.toml");
}

#[tokio::test(flavor = "multi_thread")]
async fn answers_match_containerd() {
    if !have_root() {
        return;
    }
    let reg = Registry::start().unwrap();
    let auth_reg = Registry::start_with_basic_auth("alice", "s3cret").unwrap();
    let flip = FaultyProxy::start(
        reg.addr(),
        FaultRule::blobs(Fault::FlipByte { offset: 100 }),
    )
    .unwrap();
    let trunc = FaultyProxy::start(
        reg.addr(),
        FaultRule::blobs(Fault::TruncateBody { after: 100 }),
    )
    .unwrap();
    let down = testkit::free_port();
    let img = busybox();
    reg.push("library/busybox", "1", &img).await.unwrap();
    auth_reg.push("private/app", "1", &img).await.unwrap();
    // Fault cases use an image whose blobs no earlier pull has stored.
    reg.push("fault/img", "1", &testkit::image::whiteout_image())
        .await
        .unwrap();

    let certs = CertsD::new().unwrap();
    for h in [
        reg.host(),
        auth_reg.host(),
        flip.host(),
        trunc.host(),
        format!("127.0.0.1:{down}"),
    ] {
        plain_http(&certs, &h);
    }
    let ctrd = Containerd::start(Some(certs.path())).expect("containerd");
    let rt = Runtime::start_with_config(Some(&format!(
        "registry-config-dir = \"{}\"\n",
        certs.path().display()
    )));
    let p = Pair {
        nodus: rt.clients().await,
        containerd: connect(&ctrd.endpoint()).await,
    };

    // Success: same id, tags and digests.
    let good = format!("{}/library/busybox:1", reg.host());
    let [n, c] = p.pull(&good, None).await;
    assert_eq!(n.as_ref().unwrap(), c.as_ref().unwrap(), "same image id");
    let (ni, ci) = (
        status(&p.nodus, &good, false).await.image.unwrap(),
        status(&p.containerd, &good, false).await.image.unwrap(),
    );
    assert_eq!(ni.repo_tags, ci.repo_tags);
    assert_eq!(ni.repo_digests, ci.repo_digests);
    assert_eq!((ni.uid, &ni.username), (ci.uid, &ci.username));

    use tonic::Code::*;
    // (case, image, auth, the code nodus gives). containerd gives the same code where it
    // classifies the failure; where it answers Unknown, nodus names the cause
    // (InvalidArgument, Unavailable, Unauthenticated), which kubelets treat the same way.
    let cases: Vec<(&str, String, Option<pb::AuthConfig>, tonic::Code)> = vec![
        (
            "malformed reference",
            format!("{}/UPPER/case:1", reg.host()),
            None,
            InvalidArgument,
        ),
        (
            "missing repository",
            format!("{}/library/nope:1", reg.host()),
            None,
            NotFound,
        ),
        (
            "unknown tag",
            format!("{}/library/busybox:nope", reg.host()),
            None,
            NotFound,
        ),
        (
            "registry down",
            format!("127.0.0.1:{down}/library/busybox:1"),
            None,
            Unavailable,
        ),
        (
            "wrong digest",
            format!("{}/fault/img:1", flip.host()),
            None,
            FailedPrecondition,
        ),
        (
            "no credentials",
            format!("{}/private/app:1", auth_reg.host()),
            None,
            Unauthenticated,
        ),
        (
            "wrong credentials",
            format!("{}/private/app:1", auth_reg.host()),
            Some(basic_auth("alice", "wrong")),
            Unauthenticated,
        ),
        // containerd resumes a cut-off blob download with a Range request; so do we.
        (
            "truncated layer",
            format!("{}/fault/img:1", trunc.host()),
            None,
            Ok,
        ),
    ];
    let mut report = String::new();
    let mut results = Vec::new();
    for (what, image, auth, want) in cases {
        let [n, c] = p.pull(&image, auth).await;
        report.push_str(&format!(
            "{what}:\n  nodus:      {:?} {}\n  containerd: {:?} {}\n",
            code(&n),
            n.as_ref().err().map(|s| s.message()).unwrap_or(""),
            code(&c),
            c.as_ref().err().map(|s| s.message()).unwrap_or(""),
        ));
        results.push((what, image, want, n, c));
    }
    eprintln!("{report}");
    for (what, image, want, n, c) in results {
        assert_eq!(code(&n), want, "{what}: nodus answered {n:?}");
        assert!(
            code(&c) == want || code(&c) == Unknown,
            "{what}: containerd answered {c:?}, nodus {want:?}"
        );
        if let Err(s) = &n {
            let prefix = format!("failed to pull and unpack image \"{image}\"");
            assert!(s.message().starts_with(&prefix), "{what}: {}", s.message());
        }
        if what == "truncated layer" {
            remove(&p.nodus, &image).await.unwrap();
        }
    }
    // Nothing partial is visible after the failures, in either runtime.
    assert_eq!(list(&p.nodus).await.len(), 1);
    assert!(rt.ingest_leftovers().is_empty());

    // Absent images: empty status, idempotent removal, in both.
    for c in [&p.nodus, &p.containerd] {
        assert!(
            status(c, "docker.io/library/absent:1", false)
                .await
                .image
                .is_none()
        );
        remove(c, "docker.io/library/absent:1").await.unwrap();
    }
}
