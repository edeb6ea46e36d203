//! Image commands: images, pull, rmi, inspecti, imagefsinfo.

use crate::format::{human_size, pretty, proto_json, status_with_info, table, truncate_id};
use crate::{Clients, CrictlError, rpc};
use base64::Engine as _;
use clap::Args;
use cri::runtime::v1::{
    AuthConfig, Image, ImageFilter, ImageFsInfoRequest, ImageSpec, ImageStatusRequest,
    ListImagesRequest, PullImageRequest, RemoveImageRequest,
};
use std::io::Write;

#[derive(Debug, Args, Clone)]
pub struct ImagesArgs {
    /// Filter by image name, e.g. busybox or docker.io/library/busybox:latest.
    pub image: Option<String>,
    /// Only show image IDs.
    #[arg(short, long)]
    pub quiet: bool,
    /// Show digests.
    #[arg(long)]
    pub digests: bool,
    /// Show full image IDs and verbose details.
    #[arg(short, long)]
    pub verbose: bool,
    /// Show whether an image is pinned.
    #[arg(long)]
    pub pinned: bool,
    /// Output format: json, yaml or table.
    #[arg(short, long)]
    pub output: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct PullArgs {
    pub image: String,
    /// Registry credentials, USERNAME[:PASSWORD].
    #[arg(long)]
    pub creds: Option<String>,
    /// Base64 of USERNAME:PASSWORD.
    #[arg(long)]
    pub auth: Option<String>,
    #[arg(short, long)]
    pub username: Option<String>,
    #[arg(short, long)]
    pub password: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct RmiArgs {
    pub images: Vec<String>,
    /// Remove all images.
    #[arg(short, long)]
    pub all: bool,
}

#[derive(Debug, Args, Clone)]
pub struct InspectiArgs {
    pub images: Vec<String>,
    /// Output format: json (default) or go-template is not supported.
    #[arg(short, long, default_value = "json")]
    pub output: String,
    #[arg(short, long)]
    pub quiet: bool,
}

#[derive(Debug, Args, Clone)]
pub struct ImageFsInfoArgs {
    #[arg(short, long, default_value = "json")]
    pub output: String,
}

fn io(e: std::io::Error) -> CrictlError {
    CrictlError::Other(format!("writing output: {e}"))
}

fn spec(image: &str) -> Option<ImageSpec> {
    Some(ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

/// Splits `docker.io/library/busybox:latest` into repository and tag the way crictl shows
/// them (a `:` after the last `/` separates the tag).
fn repo_tag(reference: &str) -> (String, String) {
    let slash = reference.rfind('/').map(|i| i + 1).unwrap_or(0);
    match reference[slash..].rfind(':') {
        Some(i) => (
            reference[..slash + i].to_string(),
            reference[slash + i + 1..].to_string(),
        ),
        None => (reference.to_string(), "<none>".into()),
    }
}

fn repo_digest(img: &Image) -> (String, String) {
    img.repo_digests
        .first()
        .and_then(|d| d.split_once('@'))
        .map(|(r, d)| (r.to_string(), d.to_string()))
        .unwrap_or_else(|| ("<none>".into(), "<none>".into()))
}

pub async fn images(
    c: &Clients,
    a: ImagesArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    let filter = a.image.as_ref().map(|i| ImageFilter { image: spec(i) });
    let mut resp = c
        .image
        .clone()
        .list_images(ListImagesRequest { filter })
        .await
        .map_err(rpc("listing images"))?
        .into_inner();
    resp.images.sort_by(|x, y| {
        x.repo_tags
            .first()
            .cmp(&y.repo_tags.first())
            .then(x.id.cmp(&y.id))
    });
    match a.output.as_deref() {
        Some("json") | Some("yaml") => {
            let v = proto_json("runtime.v1.ListImagesResponse", &resp);
            writeln!(out, "{}", pretty(&v)).map_err(io)?;
            return Ok(());
        }
        Some("table") | None => {}
        Some(other) => {
            return Err(CrictlError::Usage(format!(
                "unsupported output format {other:?}"
            )));
        }
    }
    if a.quiet {
        let mut seen = std::collections::HashSet::new();
        for i in &resp.images {
            if seen.insert(i.id.clone()) {
                writeln!(out, "{}", i.id).map_err(io)?;
            }
        }
        return Ok(());
    }
    let mut header = vec!["IMAGE".to_string(), "TAG".into()];
    if a.digests {
        header.push("DIGEST".into());
    }
    header.extend(["IMAGE ID".to_string(), "SIZE".into()]);
    if a.pinned {
        header.push("PINNED".into());
    }
    let mut rows = vec![header];
    for img in &resp.images {
        let (digest_repo, digest) = repo_digest(img);
        let pairs: Vec<(String, String)> = if img.repo_tags.is_empty() {
            vec![(digest_repo, "<none>".into())]
        } else {
            img.repo_tags.iter().map(|t| repo_tag(t)).collect()
        };
        let id = if a.verbose {
            img.id.clone()
        } else {
            truncate_id(&img.id)
        };
        for (repo, tag) in pairs {
            let mut row = vec![repo, tag];
            if a.digests {
                row.push(if digest == "<none>" {
                    digest.clone()
                } else {
                    truncate_id(&digest)
                });
            }
            row.push(id.clone());
            row.push(human_size(img.size));
            if a.pinned {
                row.push(img.pinned.to_string());
            }
            rows.push(row);
        }
    }
    write!(out, "{}", table(&rows)).map_err(io)
}

fn auth_config(a: &PullArgs) -> Result<Option<AuthConfig>, CrictlError> {
    let mut auth = AuthConfig::default();
    if let Some(creds) = &a.creds {
        let (u, p) = creds.split_once(':').unwrap_or((creds.as_str(), ""));
        if u.is_empty() {
            return Err(CrictlError::Usage(
                "--creds must be USERNAME[:PASSWORD] with a non-empty username".into(),
            ));
        }
        auth.username = u.into();
        auth.password = p.into();
    } else if let Some(encoded) = &a.auth {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| CrictlError::Usage(format!("--auth is not valid base64: {e}")))?;
        let s = String::from_utf8(decoded)
            .map_err(|_| CrictlError::Usage("--auth does not decode to UTF-8".into()))?;
        let (u, p) = s.split_once(':').ok_or_else(|| {
            CrictlError::Usage("--auth must be base64 of USERNAME:PASSWORD".into())
        })?;
        auth.username = u.into();
        auth.password = p.into();
    } else if let Some(u) = &a.username {
        auth.username = u.clone();
        auth.password = a.password.clone().unwrap_or_default();
    } else {
        return Ok(None);
    }
    Ok(Some(auth))
}

pub async fn pull(
    c: &Clients,
    a: PullArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    let auth = auth_config(&a)?;
    let resp = c
        .image
        .clone()
        .pull_image(PullImageRequest {
            image: spec(&a.image),
            auth,
            sandbox_config: None,
        })
        .await
        .map_err(rpc("pulling image"))?
        .into_inner();
    writeln!(out, "Image is up to date for {}", resp.image_ref).map_err(io)
}

async fn status(
    c: &Clients,
    image: &str,
    verbose: bool,
) -> Result<Option<(Image, std::collections::HashMap<String, String>)>, CrictlError> {
    let r = c
        .image
        .clone()
        .image_status(ImageStatusRequest {
            image: spec(image),
            verbose,
        })
        .await
        .map_err(rpc(format!("image status for {image:?} request")))?
        .into_inner();
    Ok(r.image.map(|i| (i, r.info)))
}

pub async fn rmi(c: &Clients, a: RmiArgs, out: &mut (dyn Write + Send)) -> Result<(), CrictlError> {
    let mut targets = a.images.clone();
    if a.all {
        let all = c
            .image
            .clone()
            .list_images(ListImagesRequest { filter: None })
            .await
            .map_err(rpc("listing images"))?
            .into_inner();
        targets.extend(all.images.into_iter().map(|i| i.id));
    }
    if targets.is_empty() {
        return Err(CrictlError::Usage("image ID cannot be empty".into()));
    }
    let mut failed = Vec::new();
    for t in targets {
        let Some((img, _)) = status(c, &t, false).await? else {
            failed.push(format!("no such image {t}"));
            continue;
        };
        match c
            .image
            .clone()
            .remove_image(RemoveImageRequest {
                image: spec(&img.id),
            })
            .await
        {
            Ok(_) => {
                if img.repo_tags.is_empty() {
                    writeln!(out, "Deleted: {}", img.id).map_err(io)?;
                }
                for tag in &img.repo_tags {
                    writeln!(out, "Deleted: {tag}").map_err(io)?;
                }
            }
            Err(s) => failed.push(format!(
                "error of removing image {t:?}: {}",
                crate::RpcError(s)
            )),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CrictlError::Other(failed.join("\n")))
    }
}

pub async fn inspecti(
    c: &Clients,
    a: InspectiArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if a.images.is_empty() {
        return Err(CrictlError::Usage("image ID cannot be empty".into()));
    }
    if a.output != "json" {
        return Err(CrictlError::Usage(format!(
            "unsupported output format {:?}: nodus crictl prints json",
            a.output
        )));
    }
    for image in &a.images {
        let Some((img, info)) = status(c, image, !a.quiet).await? else {
            return Err(CrictlError::Other(format!("no such image {image} present")));
        };
        if a.quiet {
            writeln!(out, "{}", img.id).map_err(io)?;
            continue;
        }
        let v = status_with_info(proto_json("runtime.v1.Image", &img), &info);
        writeln!(out, "{}", pretty(&v)).map_err(io)?;
    }
    Ok(())
}

pub async fn imagefsinfo(
    c: &Clients,
    a: ImageFsInfoArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if a.output != "json" {
        return Err(CrictlError::Usage(format!(
            "unsupported output format {:?}: nodus crictl prints json",
            a.output
        )));
    }
    let r = c
        .image
        .clone()
        .image_fs_info(ImageFsInfoRequest {})
        .await
        .map_err(rpc("image filesystem info"))?
        .into_inner();
    let v = serde_json::json!({ "status": proto_json("runtime.v1.ImageFsInfoResponse", &r) });
    writeln!(out, "{}", pretty(&v)).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_repo_and_tag_like_crictl() {
        assert_eq!(
            repo_tag("docker.io/library/busybox:latest"),
            ("docker.io/library/busybox".into(), "latest".into())
        );
        assert_eq!(
            repo_tag("127.0.0.1:5000/app/x:v1"),
            ("127.0.0.1:5000/app/x".into(), "v1".into())
        );
        assert_eq!(
            repo_tag("127.0.0.1:5000/app"),
            ("127.0.0.1:5000/app".into(), "<none>".into())
        );
    }

    #[test]
    fn creds_become_auth_config() {
        let a = PullArgs {
            image: "x".into(),
            creds: Some("alice:s3cret".into()),
            auth: None,
            username: None,
            password: None,
        };
        let auth = auth_config(&a).unwrap().unwrap();
        assert_eq!(
            (auth.username.as_str(), auth.password.as_str()),
            ("alice", "s3cret")
        );
        let b = PullArgs {
            creds: None,
            auth: Some(base64::engine::general_purpose::STANDARD.encode("bob:pw")),
            ..a
        };
        assert_eq!(auth_config(&b).unwrap().unwrap().username, "bob");
    }
}
