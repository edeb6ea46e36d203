//! Pulling from HTTPS registries, end to end: the real `nodus runtime` binary against a real
//! `docker-registry` serving TLS on 127.0.0.1 with a certificate from a throwaway test CA
//! (`testkit::Registry::start_tls`), configured through containerd's
//! `certs.d/<host>/hosts.toml` keys `server`, `ca`, `skip_verify` and `client`.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use testkit::image::busybox;
use testkit::registry::{RegistryOptions, TestCa};
use testkit::{CertsD, Image, Registry};

/// A TOML basic string holding `s` (paths and URLs here need no escapes beyond Rust's).
fn q(s: impl AsRef<str>) -> String {
    format!("{:?}", s.as_ref())
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("UTF-8 path").to_string()
}

/// Writes `<certs>/<host>/hosts.toml` with `text` (nodus re-reads it on every pull).
fn write_hosts(certs: &CertsD, host: &str, text: &str) {
    let dir = certs.path().join(host);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hosts.toml"), text).unwrap();
}

fn runtime_with(certs: &CertsD) -> Runtime {
    Runtime::start_with_config(Some(&format!(
        "registry-config-dir = {}\n",
        q(path_str(certs.path()))
    )))
}

/// The whole log of the runtime's first start.
fn full_log(rt: &Runtime) -> String {
    std::fs::read_to_string(rt.dir.path().join("runtime-1.log")).unwrap_or_default()
}

fn ca_path(reg: &Registry) -> String {
    path_str(reg.ca_pem_path().expect("TLS registry"))
}

/// A TLS registry holding busybox as `library/busybox:1.36` and `:latest`.
async fn tls_registry_with_busybox(options: RegistryOptions) -> (Registry, Image) {
    let reg = Registry::start_with_options(options).expect("TLS registry");
    let img = busybox();
    for tag in ["1.36", "latest"] {
        reg.push("library/busybox", tag, &img)
            .await
            .expect("push over TLS");
    }
    (reg, img)
}

async fn tls_busybox() -> (Registry, Image) {
    tls_registry_with_busybox(RegistryOptions {
        tls: true,
        ..RegistryOptions::default()
    })
    .await
}

/// A CA file that did not sign the registry's certificate.
fn foreign_ca(dir: &Path) -> PathBuf {
    let ca = TestCa::generate("some other CA").unwrap();
    let p = dir.join("other-ca.pem");
    std::fs::write(&p, ca.cert_pem()).unwrap();
    p
}

/// Asserts a pull failed on the server's certificate: Unavailable, naming the host and saying
/// what was wrong with the certificate.
fn assert_certificate_error(e: &tonic::Status, host: &str) {
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let m = e.message();
    assert!(m.contains(host), "the error names the host {host}: {m}");
    assert!(
        m.contains("certificate"),
        "the error says the certificate was refused: {m}"
    );
    assert!(m.contains("UnknownIssuer"), "and why: {m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ca_in_hosts_toml_verifies_the_registry() {
    if !have_root() {
        return;
    }
    let (reg, img) = tls_busybox().await;
    let port = reg.addr().port();
    let certs = CertsD::new().unwrap();
    // By IP (IP SAN) and by name (DNS SAN), each with its own hosts.toml.
    for host in [reg.host(), format!("localhost:{port}")] {
        write_hosts(
            &certs,
            &host,
            &format!(
                "server = {}\nca = {}\n",
                q(format!("https://{host}")),
                q(ca_path(&reg))
            ),
        );
    }
    let rt = runtime_with(&certs);
    let c = rt.clients().await;
    for host in [reg.host(), format!("localhost:{port}")] {
        let name = format!("{host}/library/busybox:1.36");
        let id = pull(&c, &name)
            .await
            .unwrap_or_else(|e| panic!("pull {name}: {e:?}\n{}", rt.log()));
        assert_eq!(id, img.config_digest.to_string(), "image id of {name}");
        let st = status(&c, &name, false).await.image.expect("pulled image");
        assert_eq!(st.id, id);
        assert!(st.repo_tags.contains(&name), "{:?}", st.repo_tags);
        assert!(
            st.repo_digests
                .contains(&format!("{host}/library/busybox@{}", img.manifest_digest)),
            "{:?}",
            st.repo_digests
        );
    }
    assert!(
        !full_log(&rt).contains("falling back to plain HTTP"),
        "a verified HTTPS host never falls back"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn loopback_registry_without_configuration_uses_unverified_https() {
    if !have_root() {
        return;
    }
    // containerd's defaults for a loopback host on a port other than 443/80: HTTPS without
    // certificate verification first, plain HTTP only if the TLS connection fails. The
    // registry speaks only TLS, so success proves HTTPS was used and the test CA was not
    // needed.
    let (reg, img) = tls_busybox().await;
    let certs = CertsD::new().unwrap();
    for rt in [Runtime::start(), runtime_with(&certs)] {
        let c = rt.clients().await;
        let name = reg.image_ref("library/busybox", "1.36");
        let id = pull(&c, &name)
            .await
            .unwrap_or_else(|e| panic!("pull {name}: {e:?}\n{}", rt.log()));
        assert_eq!(id, img.config_digest.to_string());
        assert!(
            !full_log(&rt).contains("falling back to plain HTTP"),
            "HTTPS worked, so no fallback: {}",
            rt.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn https_server_is_verified_unless_skip_verify() {
    if !have_root() {
        return;
    }
    let (reg, img) = tls_busybox().await;
    let host = reg.host();
    let server = q(format!("https://{host}"));
    let name = reg.image_ref("library/busybox", "1.36");
    let certs = CertsD::new().unwrap();
    let rt = runtime_with(&certs);
    let c = rt.clients().await;

    // An explicit https server is verified, loopback or not: the test CA is unknown.
    write_hosts(&certs, &host, &format!("server = {server}\n"));
    let e = pull(&c, &name).await.expect_err("unverifiable certificate");
    assert_certificate_error(&e, &host);
    // skip_verify = false says the same thing explicitly.
    write_hosts(
        &certs,
        &host,
        &format!("server = {server}\nskip_verify = false\n"),
    );
    let e = pull(&c, &name).await.expect_err("unverifiable certificate");
    assert_certificate_error(&e, &host);
    // A CA that did not sign the certificate does not help.
    let other = foreign_ca(rt.dir.path());
    write_hosts(
        &certs,
        &host,
        &format!("server = {server}\nca = {}\n", q(path_str(&other))),
    );
    let e = pull(&c, &name).await.expect_err("wrong CA");
    assert_certificate_error(&e, &host);
    assert!(status(&c, &name, false).await.image.is_none());

    // skip_verify = true accepts it.
    write_hosts(
        &certs,
        &host,
        &format!("server = {server}\nskip_verify = true\n"),
    );
    let id = pull(&c, &name)
        .await
        .unwrap_or_else(|e| panic!("skip_verify pull: {e:?}\n{}", rt.log()));
    assert_eq!(id, img.config_digest.to_string());
    remove(&c, &name).await.unwrap();

    // So does the right CA, also among others (an array of CA files).
    write_hosts(
        &certs,
        &host,
        &format!(
            "server = {server}\nca = [{}, {}]\n",
            q(path_str(&other)),
            q(ca_path(&reg))
        ),
    );
    let id = pull(&c, &name)
        .await
        .unwrap_or_else(|e| panic!("pull with ca: {e:?}\n{}", rt.log()));
    assert_eq!(id, img.config_digest.to_string());
}

#[tokio::test(flavor = "multi_thread")]
async fn https_mirror_for_docker_io() {
    if !have_root() {
        return;
    }
    let (reg, img) = tls_busybox().await;
    let host = reg.host();
    let mirror = q(format!("https://{host}"));
    let certs = CertsD::new().unwrap();
    // The upstream server is unreachable: the image can only come from the mirror, and no
    // request leaves 127.0.0.1.
    let upstream = "server = \"http://127.0.0.1:9\"\n";
    let hosts = |tls: &str| {
        format!("{upstream}\n[host.{mirror}]\n  capabilities = [\"pull\", \"resolve\"]\n{tls}")
    };
    let rt = runtime_with(&certs);
    let c = rt.clients().await;

    write_hosts(&certs, "docker.io", &hosts(""));
    let e = pull(&c, "busybox")
        .await
        .expect_err("mirror certificate not trusted");
    assert_certificate_error(&e, &host);

    write_hosts(&certs, "docker.io", &hosts("  skip_verify = true\n"));
    let id = pull(&c, "busybox")
        .await
        .unwrap_or_else(|e| panic!("pull via mirror, skip_verify: {e:?}\n{}", rt.log()));
    assert_eq!(id, img.config_digest.to_string());
    let st = status(&c, "busybox", false).await.image.unwrap();
    assert_eq!(st.repo_tags, vec!["docker.io/library/busybox:latest"]);
    remove(&c, "busybox").await.unwrap();

    write_hosts(
        &certs,
        "docker.io",
        &hosts(&format!("  ca = {}\n", q(ca_path(&reg)))),
    );
    let id = pull(&c, "busybox")
        .await
        .unwrap_or_else(|e| panic!("pull via mirror, ca: {e:?}\n{}", rt.log()));
    assert_eq!(id, img.config_digest.to_string());
}

#[tokio::test(flavor = "multi_thread")]
async fn client_certificate_from_hosts_toml() {
    if !have_root() {
        return;
    }
    let (reg, img) = tls_registry_with_busybox(RegistryOptions {
        client_auth: true,
        ..RegistryOptions::default()
    })
    .await;
    let host = reg.host();
    let name = reg.image_ref("library/busybox", "1.36");
    let base = format!(
        "server = {}\nca = {}\n",
        q(format!("https://{host}")),
        q(ca_path(&reg))
    );
    let cert = path_str(reg.client_cert_path().unwrap());
    let key = path_str(reg.client_key_path().unwrap());
    let certs = CertsD::new().unwrap();
    let rt = runtime_with(&certs);
    let c = rt.clients().await;

    // The registry demands a client certificate.
    write_hosts(&certs, &host, &base);
    let e = pull(&c, &name).await.expect_err("no client certificate");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains(&host), "{e:?}");

    // `client = [[cert, key]]`.
    write_hosts(
        &certs,
        &host,
        &format!("{base}client = [[{}, {}]]\n", q(&cert), q(&key)),
    );
    let id = pull(&c, &name)
        .await
        .unwrap_or_else(|e| panic!("pull with client cert: {e:?}\n{}", rt.log()));
    assert_eq!(id, img.config_digest.to_string());
    remove(&c, &name).await.unwrap();

    // `client = "<pem holding certificate and key>"`.
    let both = rt.dir.path().join("client-both.pem");
    std::fs::write(
        &both,
        format!(
            "{}{}",
            std::fs::read_to_string(&cert).unwrap(),
            std::fs::read_to_string(&key).unwrap()
        ),
    )
    .unwrap();
    write_hosts(
        &certs,
        &host,
        &format!("{base}client = {}\n", q(path_str(&both))),
    );
    let id = pull(&c, &name)
        .await
        .unwrap_or_else(|e| panic!("pull with combined client pem: {e:?}\n{}", rt.log()));
    assert_eq!(id, img.config_digest.to_string());
}

#[tokio::test(flavor = "multi_thread")]
async fn http_server_with_a_ca_tries_verified_https_first() {
    if !have_root() {
        return;
    }
    // An `http://` host given TLS settings on a port other than 80 is tried over HTTPS first
    // (containerd's HTTPFallback); with the right CA that attempt succeeds.
    let (reg, img) = tls_busybox().await;
    let host = reg.host();
    let name = reg.image_ref("library/busybox", "1.36");
    let certs = CertsD::new().unwrap();
    write_hosts(
        &certs,
        &host,
        &format!(
            "server = {}\nca = {}\n",
            q(format!("http://{host}")),
            q(ca_path(&reg))
        ),
    );
    let rt = runtime_with(&certs);
    let c = rt.clients().await;
    let id = pull(&c, &name)
        .await
        .unwrap_or_else(|e| panic!("pull {name}: {e:?}\n{}", rt.log()));
    assert_eq!(id, img.config_digest.to_string());
    assert!(!full_log(&rt).contains("falling back to plain HTTP"));
}

// nodus bug: `Http::send` (crates/runtime/src/image/distribution/client.rs) falls back to
// plain HTTP on any connect error, a certificate verification failure included, and the
// fallback is remembered in `Http::fell_back` for the life of the process.
#[tokio::test(flavor = "multi_thread")]
async fn certificate_errors_do_not_fall_back_to_http() {
    if !have_root() {
        return;
    }
    // containerd (remotes/docker/resolver.go, httpFallback.RoundTrip) falls back from HTTPS to
    // HTTP only when the server answered the TLS hello in plain HTTP (`isTLSError`: a
    // tls.RecordHeaderError reading "HTTP/", or a TLS handshake timeout) or, for a host
    // without a port, the connection was refused or timed out (`isPortError`). A certificate
    // it cannot verify is an error about the certificate (`x509: certificate signed by
    // unknown authority`), and the next pull, with a corrected hosts.toml, starts from HTTPS
    // again (a fresh resolver per pull).
    let (reg, img) = tls_busybox().await;
    let host = reg.host();
    let name = reg.image_ref("library/busybox", "1.36");
    let server = q(format!("http://{host}"));
    let certs = CertsD::new().unwrap();
    write_hosts(
        &certs,
        &host,
        &format!("server = {server}\nskip_verify = false\n"),
    );
    let rt = runtime_with(&certs);
    let c = rt.clients().await;
    let e = pull(&c, &name).await.expect_err("unverifiable certificate");
    assert_certificate_error(&e, &host);

    write_hosts(
        &certs,
        &host,
        &format!("server = {server}\nca = {}\n", q(ca_path(&reg))),
    );
    let id = pull(&c, &name)
        .await
        .unwrap_or_else(|e| panic!("pull after adding the CA: {e:?}\n{}", rt.log()));
    assert_eq!(id, img.config_digest.to_string());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_connection_is_not_remembered_as_plain_http() {
    if !have_root() {
        return;
    }
    // A loopback registry that is not up yet when the first pull comes (a local registry
    // starting beside the node). containerd: that pull fails with "connection refused"; once
    // the registry serves HTTPS the next pull tries HTTPS again and succeeds.
    let port = testkit::free_port();
    let name = format!("127.0.0.1:{port}/library/busybox:1.36");
    let rt = Runtime::start();
    let c = rt.clients().await;
    let e = pull(&c, &name).await.expect_err("nothing listens yet");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("onnection refused"), "{e:?}");

    let (reg, img) = tls_registry_with_busybox(RegistryOptions {
        tls: true,
        port: Some(port),
        ..RegistryOptions::default()
    })
    .await;
    assert_eq!(reg.addr().port(), port);
    let id = pull(&c, &name)
        .await
        .unwrap_or_else(|e| panic!("pull once the registry is up: {e:?}\n{}", rt.log()));
    assert_eq!(id, img.config_digest.to_string());
}
